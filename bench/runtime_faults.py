"""Fault injection under load: SIGKILL an edge node and then the root of a supervised ``cis serve --all``.

Digits bundle, paper-7 tree, every non-root threshold +inf and no transfer cap,
so a sample is served at the root (exit 3) whenever the path is up. Requests of
one sample go round-robin to the four leaves at --rate requests/s for
--seconds. At --kill-edge s an edge node gets SIGKILL, at --kill-root s the
root. Measured per kill: when the launcher started the node again (a new pid
in LOG_DIR/cluster.json), when it answered ``status``, and when the first
request through it was served at full depth again (forwarding resumed); over
the run: requests without a reply (client timeout --timeout s), errors,
degraded answers.

    python -m bench.runtime_faults            # 30 s at 50 requests/s
    python -m bench.runtime_faults --quick    # 16 s
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

from bench.harness import drive_load, serve_command
from bench.runtime_live import add_live_args, live_bundle, machine, write_out
from cis.runtime.client import Client


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0, help="requests per second, over all leaves")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--kill-edge", type=float, default=8.0, help="seconds into the run to SIGKILL an edge node")
    ap.add_argument("--kill-root", type=float, default=18.0, help="seconds into the run to SIGKILL the root")
    ap.add_argument(
        "--timeout", type=float, default=10.0, help="client timeout: a request without a reply by then is lost"
    )
    add_live_args(ap, "runtime_faults", "16 s: kills at 4 s and 10 s")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.kill_edge, args.kill_root = 16.0, 4.0, 10.0
    return args


def kill_step(cluster, kills: dict, now: float, start: float) -> None:
    """One look at the launcher's state: SIGKILL a node whose time has come; note when the launcher started it
    again (a new pid, up) and when it answered ``status``."""
    state = cluster.state()
    for nid, k in kills.items():
        if "pid" not in k and now >= k["at"]:
            k["pid"] = int(state[nid]["pid"])
            os.kill(k["pid"], signal.SIGKILL)
            k["killed"] = now
            say(f"SIGKILL {nid} (pid {k['pid']}) at {now:.2f} s")
        elif "killed" in k and "restarted" not in k and int(state[nid]["pid"]) != k["pid"] \
                and state[nid]["state"] == "up":  # fmt: skip
            k["restarted"] = now
        elif "restarted" in k and "ready" not in k:
            with Client(cluster.address(nid)) as probe:
                try:
                    probe.status(timeout=0.05)
                    k["ready"] = time.monotonic() - start
                except TimeoutError:
                    pass


def watch_kills(cluster, kills: dict, start: float, until: float, done: threading.Event) -> None:
    """:func:`kill_step` every 5 ms from ``start`` (monotonic) until ``until`` seconds in and the load is done."""
    while not done.is_set() or time.monotonic() - start < until:
        kill_step(cluster, kills, time.monotonic() - start, start)
        time.sleep(0.005)


def run_faults(args: argparse.Namespace, bundle, logs, x, kills_at: dict) -> tuple[list, dict, dict, dict, int]:
    """The load (round robin over the leaves, evenly spaced at --rate; :func:`bench.harness.drive_load`) with the
    kills beside it: (records (send time, leaf, outcome, deepest exit, degraded), kills, the path of each leaf,
    restarts, the launcher's exit status)."""
    node_args = ["--threshold", "inf", "--no-cap", "--heartbeat", "0.1", "--forward-timeout", "0.5"]
    with serve_command(bundle, logs=logs, args=node_args) as cluster:
        nodes = cluster.nodes
        root = next(k for k, v in nodes.items() if v["parent"] is None)
        edge = next(k for k, v in nodes.items() if v["parent"] == root)
        leaves = sorted(k for k, v in nodes.items() if v["exit"] == 1)
        below = {leaf: [leaf, nodes[leaf]["parent"], root] for leaf in leaves}
        kills: dict = {edge: {"at": kills_at["edge"]}, root: {"at": kills_at["root"]}}
        done = threading.Event()
        watcher = threading.Thread(target=watch_kills, args=(cluster, kills, time.monotonic(), args.seconds, done))
        watcher.start()
        try:
            load = drive_load({leaf: cluster.address(leaf) for leaf in leaves}, x, args.rate, arrivals="uniform",
                              seconds=args.seconds, timeout=args.timeout)  # fmt: skip
        finally:
            done.set()
            watcher.join()
        restarts = {k: v["restarts"] for k, v in cluster.state().items()}
        code = cluster.stop()
    records = []
    for t0, leaf, err, a in zip(load.sent, load.targets, load.errors, load.answers):
        outcome = "no_reply" if err == "timeout" else (err or "result")
        records.append((float(t0), leaf, outcome, a.exit if a and not err else 0, bool(a and not err and a.flags & 1)))
    return records, kills, below, restarts, code


def kill_figures(records: list, kills: dict, below: dict) -> None:
    """Per kill: how long until the launcher restarted it, it answered, and forwarding through it resumed (the
    first request sent after it was ready that reached the root through it)."""
    for nid, k in kills.items():
        ready = k.get("ready", 1e9)
        through = [r for r in records if nid in below[r[1]] and r[2] == "result" and r[3] == 3 and not r[4]
                   and r[0] >= ready]  # fmt: skip
        k["forwarding_resumed"] = min((r[0] for r in through), default=None)
        k["restart_after_kill_s"] = k["restarted"] - k["killed"] if "restarted" in k else None
        k["ready_after_kill_s"] = k["ready"] - k["killed"] if "ready" in k else None
        k["resumed_after_kill_s"] = (
            k["forwarding_resumed"] - k["killed"] if k["forwarding_resumed"] is not None else None
        )


def main() -> int:
    args = parse_args()
    work, bundle = live_bundle(args)
    from cis.training.data.loading import load_dataset

    x = load_dataset("digits", seed=0).test.x
    before = machine()
    records, kills, below, restarts, code = run_faults(args, bundle, work / "faults-logs", x,
                                                       {"edge": args.kill_edge, "root": args.kill_root})  # fmt: skip
    kill_figures(records, kills, below)
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r[2]] = outcomes.get(r[2], 0) + 1
    summary = {
        "requests": len(records),
        "without_reply": outcomes.get("no_reply", 0),
        "outcomes": outcomes,
        "degraded": sum(r[4] for r in records),
        "served_at_root": sum(r[3] == 3 for r in records),
        "kills": {
            nid: {key: (round(v, 3) if isinstance(v, float) else v) for key, v in k.items()} for nid, k in kills.items()
        },
        "restarts": restarts,
        "launcher_exit": code,
    }
    out = {"summary": summary, "settings": vars(args), "machine_before": before, "machine_after": machine(),
           "command": "python -m bench.runtime_faults" + (" --quick" if args.quick else "")}  # fmt: skip
    write_out(args.out, out, report(out))
    say(json.dumps(summary))
    ok = summary["without_reply"] == 0 and all(
        (k["restart_after_kill_s"] or 99) <= 2 and k["resumed_after_kill_s"] for k in kills.values()
    )
    return 0 if ok else 1


def say(m: str) -> None:
    print(f"runtime_faults: {m}", flush=True)


def report(out: dict) -> str:
    s, m0, m1 = out["summary"], out["machine_before"], out["machine_after"]
    rows = ["| node killed | at (s) | new process after (s) | answers status after (s) "
            "| forwarding resumed after (s) |",
            "|---|---|---|---|---|"]
    for nid, k in s["kills"].items():
        rows.append(f"| {nid} | {k['at']} | {k['restart_after_kill_s']} | {k['ready_after_kill_s']} "
                    f"| {k['resumed_after_kill_s']} |")
    return "\n".join([
        "# Runtime faults: SIGKILL of an edge and of the root under load (`cis serve --all`, digits bundle)", "",
        f"Command: `{out['command']}` ({out['settings']['rate']:g} requests/s for {out['settings']['seconds']:g} s, "
        f"all to the leaves, every sample forced to the root). Machine: {m0['cpus']} CPUs, load average before "
        f"{m0['loadavg_1_5_15']}, after {m1['loadavg_1_5_15']} (shared and noisy).", "",
        f"- requests: {s['requests']}; without a reply: {s['without_reply']}; outcomes {s['outcomes']}",
        f"- served at the root: {s['served_at_root']}; degraded (served lower while a node was down): {s['degraded']}",
        f"- launcher restarts: {s['restarts']}", "", *rows, "",
        "Times are from the SIGKILL: the launcher's new process (cluster.json), its first `status` answer, and the "
        "first request sent after that which was served at the root through it.", "",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
