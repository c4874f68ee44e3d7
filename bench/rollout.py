"""A model update under load on the testbed (issue 41 item 2): ``cis rollout`` while clients send >= 100 req/s.

paper-7 on the testbed (``cis.runtime.testbed``: every node in its own network namespace, the spec's links shaped
with tbf; no propagation latency where the kernel has no netem), serving the digits model of one training run
(seed 0); four clients, one per device, send one-sample requests at ``--rate`` per second each, asking for the
logits of the exit that answers. After ``--settle`` seconds ``cis rollout NEW --cluster LOG_DIR --json`` (a
process of its own) puts the second training run (seed 1: same shapes, other weights) on every node; after as
long again the first one goes back (``--rollouts 2``). Every answer is checked against both bundles run offline
on its sample (onnxruntime in this process): its logits must equal, to 1e-4, those of the bundle it names at the
exit that answered, and not the other's, so no stage of another bundle touched it on its way.

Reported per rollout: requests sent, lost (no answer: none may be), errors, degraded, answered by another bundle
than the one they name (none may be), each bundle's share, and the latency p50/p99 of the requests sent before,
during (from the rollout process's start to its end) and after it; the rollout's own phases.

The tree starts as the harness's ``start_cluster`` does (``--loopback``) or on the testbed. The clients are not the
harness's load generator, on purpose: each asks for the logits of the exit that answers and reads the bundle the
answer names (``cis.Client.stream(..., logits=True)``), which the load generator does not return, and every answer
is checked on both.

    python -m bench.rollout                     # 2 rollouts, 4 x 30 req/s (about 2 minutes)
    python -m bench.rollout --loopback          # cis serve --all on loopback instead (no root needed)
    python -m bench.rollout --quick --loopback  # a smoke run: bench/results/rollout-quick.{json,md}

Writes bench/results/rollout.{json,md} (``--out NAME``: NAME.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import machine, start_cluster, write_results


def bundles(work: Path, steps: int) -> tuple[Path, Path]:
    """The digits model trained twice (seeds 0 and 1), each exported: cached in ``work``."""
    from cis.exporter.bundle_writer import export_bundle
    from cis.exporter.fixture_bundle import make_demo_run

    out = []
    for seed in (0, 1):
        b = work / f"seed{seed}" / "bundle"
        if not (b / "manifest.json").is_file():
            export_bundle(make_demo_run(work / f"seed{seed}" / "run", steps=steps, seed=seed), b, latency_repeats=2)
        out.append(b)
    return out[0], out[1]


def start_nodes(args, bundle: Path, log_dir: Path):
    """The tree, on the testbed (root, namespaces) or with --loopback as cis serve --all does."""
    from cis.core.bundle import load_bundle

    spec = load_bundle(bundle).spec
    extra = ["--heartbeat", "0.1"]
    if args.loopback:
        return start_cluster(bundle, spec, args=extra, log_dir=log_dir)
    from cis.runtime.testbed.bed import start

    return start(bundle, spec, extra_args=extra, log_dir=str(log_dir))


class Load:
    """One client thread per device, each ``rate`` one-sample requests per second for ``seconds``."""

    def __init__(self, addresses: dict[str, str], x: np.ndarray, rate: float, seconds: float):
        self.results: dict[str, list] = {}
        self.t0 = time.perf_counter()
        n = int(rate * seconds)
        leaves = sorted(nid for nid in addresses if nid.startswith("device"))
        self.threads = [
            threading.Thread(target=self._run, args=(nid, addresses[nid], x, n, rate), daemon=True) for nid in leaves
        ]
        for t in self.threads:
            t.start()

    def _run(self, nid: str, address: str, x: np.ndarray, n: int, rate: float) -> None:
        from cis.runtime.client import Client

        chunks = [x[i % len(x) : i % len(x) + 1] for i in range(n)]
        with Client(address, timeout=30) as c:
            self.results[nid] = [(i % len(x), r) for i, r in enumerate(c.stream(chunks, 64, rate, 10.0, logits=True))]

    def join(self) -> None:
        for t in self.threads:
            t.join()


def rollout(bundle: Path, log_dir: Path, timeout: float) -> dict:
    """``cis rollout BUNDLE --cluster LOG_DIR --json`` as its own process; its report and wall window."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cis.cli.main", "rollout", str(bundle), "--cluster", str(log_dir), "--json",
         "--timeout", str(timeout)],
        capture_output=True, text=True,
    )  # fmt: skip
    t1 = time.perf_counter()
    if proc.returncode != 0:
        raise RuntimeError(f"cis rollout failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"report": json.loads(proc.stdout), "window": (t0, t1)}


def check(results: dict[str, list], offline: dict[str, dict[int, np.ndarray]]) -> list[dict]:
    """Per request: send time, latency, outcome, the bundle it names, and whether its logits are that bundle's."""
    rows = []
    for nid, rs in results.items():
        for sample, r in rs:
            row = {"node": nid, "sent": r.sent, "latency": r.latency, "bundle": r.bundle}
            if r.error is not None:
                row["outcome"] = r.error.code
                rows.append(row)
                continue
            e = int(r.exit[0])
            named, others = offline[r.bundle], [v for k, v in offline.items() if k != r.bundle]
            row["outcome"] = "degraded" if r.degraded.any() else "ok"
            row["own_logits"] = bool(np.allclose(r.logits[0], named[e][sample], atol=1e-4))
            row["other_logits"] = any(np.allclose(r.logits[0], o[e][sample], atol=1e-4) for o in others)
            rows.append(row)
    return rows


def window_stats(rows: list[dict], lo: float, hi: float) -> dict:
    got = [r for r in rows if lo <= r["sent"] < hi]
    lat = np.array([r["latency"] for r in got if r["outcome"] in ("ok", "degraded")])
    return {
        "requests": len(got),
        "p50_ms": float(np.percentile(lat, 50)) * 1e3 if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3 if len(lat) else None,
        "max_ms": float(lat.max()) * 1e3 if len(lat) else None,
    }


def summarize(rows: list[dict], windows: list[dict], bundle_ids: dict[str, str]) -> dict:
    answered = [r for r in rows if r["outcome"] in ("ok", "degraded")]
    out = {
        "requests": len(rows),
        "lost": sum(r["outcome"] == "timeout" for r in rows),
        "errors": sum(r["outcome"] not in ("ok", "degraded", "timeout") for r in rows),
        "degraded": sum(r["outcome"] == "degraded" for r in rows),
        "other_bundle": sum(not r["own_logits"] or r["other_logits"] for r in answered),
        "by_bundle": {name: sum(r["bundle"] == bid for r in rows) for name, bid in bundle_ids.items()},
        "rollouts": [],
    }
    t_start = min(r["sent"] for r in rows)
    edges = [t_start] + [x for w in windows for x in w["window"]] + [max(r["sent"] for r in rows) + 1]
    for i, w in enumerate(windows):
        before, (lo, hi), after = edges[2 * i], w["window"], edges[2 * i + 3]
        out["rollouts"].append(
            {
                "to": w["report"]["bundle"],
                "phases_s": w["report"]["phases_s"],
                "rollout_s": w["report"]["seconds"],
                "process_s": hi - lo,
                "before": window_stats(rows, before, lo),
                "during": window_stats(rows, lo, hi),
                "after": window_stats(rows, hi, after),
            }
        )
    return out


def markdown(result: dict) -> list[str]:
    s, a = result["summary"], result["args"]
    where = "`cis serve --all` on loopback" if a["loopback"] else "the testbed (network namespaces, tbf links)"
    lines = [
        "# A model update under load: `cis rollout` (issue 41)",
        "",
        f"> {'QUICK SMOKE RUN, not a result. ' if a['quick'] else ''}"
        f"paper-7, digits model trained twice (seeds 0 and 1), on {where}; 4 clients x {a['rate']:g} one-sample "
        f"requests/s = {4 * a['rate']:g} req/s; {a['rollouts']} rollouts, {a['settle']:g} s apart. "
        f"{result['machine']['cpus']} CPUs, load average {result['machine']['load_avg'][0]:.1f} at the start, "
        f"{result['machine']['load_avg_end'][0]:.1f} at the end. Command: `{result['command']}`.",
        "",
        f"- requests: {s['requests']}; **lost (no answer): {s['lost']}**; errors: {s['errors']}; degraded: "
        f"{s['degraded']}",
        f"- **answered by another bundle than the one they name: {s['other_bundle']}** (each answer's logits checked "
        "against both bundles run offline on its sample, 1e-4)",
        f"- answers per bundle: {', '.join(f'{k} {v}' for k, v in s['by_bundle'].items())}",
        "",
        "| rollout | load / switch / drop (s) | rollout process (s) | p50 / p99 before (ms) | p50 / p99 during (ms) "
        "| max during (ms) | p50 / p99 after (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(s["rollouts"], 1):
        ph = r["phases_s"]

        def pp(w):
            return f"{w['p50_ms']:.2f} / {w['p99_ms']:.2f} ({w['requests']} req)" if w["p50_ms"] is not None else "-"

        lines.append(
            f"| {i} (to {r['to']}) | {ph.get('load', 0):.2f} / {ph.get('switch', 0):.2f} / {ph.get('drop', 0):.2f} "
            f"| {r['process_s']:.2f} | {pp(r['before'])} | {pp(r['during'])} | {r['during']['max_ms'] or 0:.2f} "
            f"| {pp(r['after'])} |"
        )
    lines += [
        "",
        "*During*: requests sent between the start and the end of the `cis rollout` process (its Python start-up "
        "included). Latency is the client's, send to answer.",
    ]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/cis-rollout-bench", help="the two bundles are cached here")
    ap.add_argument("--steps", type=int, default=300, help="training steps of each digits model")
    ap.add_argument("--rate", type=float, default=30.0, help="requests per second per device (4 devices)")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds of load before, between and after rollouts")
    ap.add_argument("--rollouts", type=int, default=2, help="rollouts, alternating between the two bundles")
    ap.add_argument("--timeout", type=float, default=120.0, help="cis rollout --timeout")
    ap.add_argument("--loopback", action="store_true", help="cis serve --all on loopback instead of the testbed")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 rollout, 5 s apart (result rollout-quick)")
    ap.add_argument("--out", help="result name in bench/results (default rollout, rollout-quick with --quick)")
    args = ap.parse_args()
    if args.quick:
        args.rollouts, args.settle, args.steps = 1, 5.0, 100
    args.out = args.out or ("rollout-quick" if args.quick else "rollout")

    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import run_chain
    from cis.training.data.loading import load_dataset

    work = Path(args.work)
    b1, b2 = bundles(work, args.steps)
    x = load_dataset("digits", seed=0).test.x
    loaded = {"seed0": load_bundle(b1), "seed1": load_bundle(b2)}
    offline = {b.id: run_chain(b, x) for b in loaded.values()}
    result = {"machine": machine(), "command": " ".join(["python", "-m", "bench.rollout", *sys.argv[1:]]),
              "args": vars(args), "bundles": {k: b.id for k, b in loaded.items()}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cis-rollout-") as tmp:
        log_dir = Path(tmp) / "logs"
        nodes = start_nodes(args, b1, log_dir)
        try:
            seconds = args.settle * (args.rollouts + 1) + 10.0 * args.rollouts
            load = Load(nodes.addresses, x, args.rate, seconds)
            windows = []
            for i in range(args.rollouts):
                time.sleep(max(0.0, load.t0 + args.settle * (i + 1) + 10.0 * i - time.perf_counter()))
                windows.append(rollout(b2 if i % 2 == 0 else b1, log_dir, args.timeout))
                print(f"rollout {i + 1}: {json.dumps(windows[-1]['report']['phases_s'])}", flush=True)
            load.join()
        finally:
            nodes.stop()
    rows = check(load.results, offline)
    result["summary"] = summarize(rows, windows, result["bundles"])
    result["machine"]["load_avg_end"] = os.getloadavg()
    write_results(args.out, result, markdown(result))
    print("\n".join(markdown(result)))
    s = result["summary"]
    return 0 if s["lost"] == 0 and s["other_bundle"] == 0 and s["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
