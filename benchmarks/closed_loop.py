"""Does the loop pay? A CIS designed for one load, served under another, and three answers to the shift.

    CIS_BENCH_PAUSE=/work/wt/campaign/ python benchmarks/closed_loop.py [--seeds 1,2,3,4,5] [--quick]
    python benchmarks/closed_loop.py --report      # rebuild closed_loop.{json,md} from the run files

Per seed (one run file each, benchmarks/results/closed_loop/runs/seed<S>.json):

1. design: paper-7 at 80-15-5, ``--rate`` requests/s split evenly over the four devices, the caps
   that reproduce 80-15-5 (``cis spec new``); ``cis train`` (serving-rate weights, reduced-scale
   CIFAR-10) and ``cis export``: the deployed bundle;
2. the shift: edge0's two devices get ``--shift`` x their arrivals (3x: 80 req/s in all instead
   of 40), so their caps bind and the served shares move (the calculus: 80-15-5 -> 90-7.5-2.5);
3. (a) nothing changed: the deployed bundle served under the shifted load (``cis serve --all``'s
   launcher, real node processes), measured live while it serves (``cis.measured``: two status
   snapshots over the steady part of the load) and saved (measurement.json);
4. (b) thresholds recalibrated: ``cis export BASE --rates-from measurement.json``;
5. (c) fine-tuned with the measured weights and recalibrated: ``cis train --init BASE --rates-from
   measurement.json --rounds K --lr LR``, then ``cis export --rates-from``;
6. (c0) the control for (c): the same fine-tune with the design's weights and spec (``cis train
   --init BASE --rounds K --lr LR``), recalibrated the same way: what the extra rounds alone give;
7. every option served under the same shifted load: the same Poisson arrival times, entry devices
   and CIFAR-10 test images; accuracy, served shares per exit and node, p50/p99 latency over the
   requests that arrive after ``--skip`` seconds (the transfer caps' token buckets start full and
   hold 10 s of the cap: the first seconds forward more than the cap);
8. before any option is served, the simulator's prediction of its shares: ``cis simulate``'s way
   (SimPy, the bundle's validation profile, Poisson arrivals, loopback links) on the design updated
   with the measured arrival rates (``cis spec update``), the same seconds skipped.

Serving runs pause the processes whose command line matches $CIS_BENCH_PAUSE (SIGSTOP, then
SIGCONT in a finally): latency on a shared machine is otherwise someone else's. Training runs
alongside them. The .md says the scale and the machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from _common import RESULTS, ensure_cifar, machine, paired, seeds_of, stats

OPTIONS = ("a", "b", "c", "c0")
LABELS = {
    "a": "(a) nothing changed",
    "b": "(b) thresholds recalibrated",
    "c": "(c) fine-tuned with measured weights + recalibrated",
    "c0": "(c0) control: fine-tuned with design weights + recalibrated",
}
SHIFTED = ("device0", "device1")  # edge0's devices
NAME = "closed_loop"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke setting: digits, 4+1 rounds, 600 requests, seed 1")
    ap.add_argument("--data", default="/tmp/cifar10", help="CIFAR-10 folder (image-folder or pickle layout)")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=30, help="base training rounds")
    ap.add_argument("--train-subset", type=int, default=5000)
    ap.add_argument("--val-size", type=int, default=1000)
    ap.add_argument("--local-epochs", type=float, default=0.25)
    ap.add_argument("--ft-rounds", type=int, default=5, help="fine-tune rounds of (c) and (c0)")
    ap.add_argument("--ft-lr", type=float, default=0.01, help="fine-tune learning rate (cosine over --ft-rounds)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of training")
    ap.add_argument("--rate", type=float, default=40.0, help="designed requests/s over the four devices")
    ap.add_argument("--shift", type=float, default=3.0, help="factor on edge0's devices' arrivals")
    ap.add_argument("--requests", type=int, default=3200, help="requests per serving run")
    ap.add_argument("--skip", type=float, default=10.0, help="seconds at the start of a serving run not counted")
    ap.add_argument("--runs", default="/tmp/cis-bench/closed_loop", help="folder for run dirs and bundles")
    ap.add_argument("--report", action="store_true", help="only rebuild the result files from the run files")
    args = ap.parse_args()
    if args.quick:
        args.width, args.rounds, args.ft_rounds, args.requests, args.skip = 1.0, 4, 1, 600, 3.0
        args.local_epochs = 1.0
        args.train_subset = args.val_size = None
        args.seeds = "1" if args.seeds == "1,2,3,4,5" else args.seeds
    return args


def cli(*argv) -> dict:
    """``cis ARGV --json`` in this process; its JSON result (a failure raises)."""
    from cis.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in argv] + ["--json"])
    if code != 0:
        raise RuntimeError(f"cis {' '.join(map(str, argv))}: exit {code}")
    return json.loads(out.getvalue())


@contextlib.contextmanager
def others_paused():
    """SIGSTOP the processes matching $CIS_BENCH_PAUSE (never this one), SIGCONT them after."""
    pattern = os.environ.get("CIS_BENCH_PAUSE")
    pids: list[int] = []
    if pattern:
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in found if int(p) != os.getpid()]
    stopped = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        yield len(stopped)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------- one seed


def train_and_export(args, seed: int, folder: Path, dataset: str, design_file: Path) -> None:
    base = folder / "base"
    if not (base / "summary.json").is_file():
        config = folder / "base-config.json"
        config.write_text(json.dumps({
            "dataset": dataset, "spec": str(design_file), "strategy": "serving-rate", "rounds": args.rounds,
            "width": args.width, "train_subset": args.train_subset, "val_size": args.val_size, "seed": seed,
            "local_epochs": args.local_epochs, "threads": args.threads, "eval_every": args.rounds,
        }))
        cli("train", "--config", config, "--out", base, "--no-progress")
    if not (folder / "bundle-a" / "manifest.json").is_file():
        cli("export", base, "--out", folder / "bundle-a", "--latency-repeats", 3)


def load_requests(args, seed: int, dataset: str, shifted):
    """The shifted load: Poisson arrival times, entry devices, test images (the same for every option)."""
    from cis.policy import assign_entries
    from training.data import load_dataset

    test = load_dataset(dataset, seed=seed, val_size=args.val_size).test
    n = args.requests
    rng = np.random.default_rng(seed)
    total = sum(nd.arrival_rate for nd in shifted.nodes)
    times = np.cumsum(rng.exponential(1.0 / total, n))
    rows = rng.permutation(len(test.y))[:n] if n <= len(test.y) else np.arange(n) % len(test.y)
    return times, assign_entries(shifted, n, seed), np.ascontiguousarray(test.x[rows]), test.y[rows]


def serve(bundle: Path, design, design_file: Path, load, skip: float, logs: Path, measure: bool):
    """Serve ``bundle`` under the load; the replies and, with ``measure``, the live measurement of the
    steady part (two status snapshots from ``skip`` s to the last arrival)."""
    from cis.app.calibration import warm_up
    from cis.measured import measure as measure_live
    from cis.runtime.client import Client, infer_spread
    from cis.runtime.launcher import launch

    times, entries, x, _ = load
    found: dict = {}
    cluster = launch(bundle, design, spec_file=str(design_file), free_ports=True, log_dir=str(logs))
    try:
        clients = {nid: Client(cluster.addresses[nid], timeout=30.0) for nid in entries}
        try:
            with others_paused() as paused:
                warm_up(clients, x)

                def snapshots() -> None:
                    time.sleep(skip)
                    try:
                        found["m"] = measure_live(str(logs), window=float(times[-1]) - skip - 0.5)
                    except Exception as exc:  # noqa: BLE001 (raised again below, in the main thread)
                        found["error"] = exc

                watcher = threading.Thread(target=snapshots, daemon=True) if measure else None
                if watcher:
                    watcher.start()
                replies = infer_spread(clients, x, entries, window=len(x), timeout=30.0, times=times)
                if watcher:
                    watcher.join()
                    if "error" in found:
                        raise found["error"]
        finally:
            for c in clients.values():
                c.close()
    finally:
        cluster.stop()
    return replies, found.get("m"), paused


def runtime_record(replies, load, skip: float, spec) -> dict:
    from cis.metrics import latency_summary

    times, _, _, y = load
    keep = [i for i in range(len(replies)) if times[i] >= skip]
    ok = [i for i in keep if replies[i] is not None and replies[i].error is None]
    exits = np.array([int(replies[i].exit[0]) for i in ok])
    nodes = [replies[i].served_by[0] for i in ok]
    flags = np.array([int(replies[i].flags[0]) for i in ok])
    return {
        "requests": len(keep),
        "answered": len(ok),
        "accuracy": float(np.mean([int(replies[i].cls[0]) == int(y[i]) for i in ok])),
        "shares": {str(e): float(np.mean(exits == e)) for e in range(1, spec.num_exits + 1)},
        "node_shares": {nid: nodes.count(nid) / len(ok) for nid in spec.ids},
        "capped": int(np.count_nonzero(flags & 2)),
        "degraded": int(np.count_nonzero(flags & 1)),
        "latency": latency_summary([replies[i].latency for i in ok]),
    }


def predict(bundle: Path, spec, args, seed: int) -> dict:
    """The simulator before the option is served: ``cis simulate --spec UPDATED --bundle B --loopback``."""
    from cis.bundle import load_bundle
    from sim.config import SimConfig
    from sim.run import simulate

    req = simulate(spec, SimConfig(requests=args.requests, seed=seed, loopback=True), load_bundle(bundle)).requests
    keep = (req["arrive"] >= args.skip) & (req["exit"] > 0)
    correct = req["correct"][keep]
    return {
        "shares": {str(e): float(np.mean(req["exit"][keep] == e)) for e in range(1, spec.num_exits + 1)},
        "accuracy_validation_profile": float(np.mean(correct[correct >= 0])) if (correct >= 0).any() else None,
    }


def run_seed(args, seed: int, dataset: str) -> dict:
    from cis.measured import update_spec
    from cis.rates import compute_rates
    from cis.spec import write_spec
    from cis.topologies import make_spec

    t_start = time.perf_counter()
    folder = Path(args.runs) / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    classes = 10
    design = make_spec("paper-7", "80-15-5", total_rate=args.rate, num_classes=classes)
    design_file = folder / "design.toml"
    write_spec(design, design_file)
    shifted = design.replace_nodes(
        replace(n, arrival_rate=args.shift * n.arrival_rate) if n.id in SHIFTED else n for n in design.nodes
    )
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    train_and_export(args, seed, folder, dataset, design_file)
    seconds["base"] = time.perf_counter() - t
    load = load_requests(args, seed, dataset, shifted)
    options: dict[str, dict] = {o: {} for o in OPTIONS}

    t = time.perf_counter()
    replies, m, paused = serve(folder / "bundle-a", design, design_file, load, args.skip, folder / "logs-a", True)
    seconds["serve_a"] = time.perf_counter() - t
    saved = folder / "measurement.json"
    saved.write_text(json.dumps(m.to_json(), indent=2))
    updated = update_spec(design, m, where=str(design_file))
    options["a"]["runtime"] = runtime_record(replies, load, args.skip, design)

    t = time.perf_counter()
    ft = ("--rounds", args.ft_rounds, "--lr", args.ft_lr, "--no-progress")
    if not (folder / "run-c" / "summary.json").is_file():
        cli("train", "--init", folder / "base", "--rates-from", saved, *ft, "--out", folder / "run-c")
    if not (folder / "run-c0" / "summary.json").is_file():
        cli("train", "--init", folder / "base", *ft, "--out", folder / "run-c0")
    seconds["fine_tune"] = time.perf_counter() - t
    t = time.perf_counter()
    for o, run in (("b", "base"), ("c", "run-c"), ("c0", "run-c0")):
        report = cli("export", folder / run, "--out", folder / f"bundle-{o}", "--rates-from", saved,
                     "--spec", design_file, "--latency-repeats", 3)
        options[o]["export"] = {k: report["calibration"][k] for k in ("target_share_per_exit",
                                                                       "achieved_share_per_exit", "max_share_error")}
        options[o]["export"]["previous_max_share_error"] = report["calibration"]["previous"]["max_share_error"]
        options[o]["export"]["thresholds"] = {n: v["threshold"] for n, v in report["calibration"]["previous"]["nodes"]
                                              .items()}
        options[o]["export"]["previous_thresholds"] = {
            n: v["previous"] for n, v in report["calibration"]["previous"]["nodes"].items()
        }
    seconds["export"] = time.perf_counter() - t
    for o in OPTIONS:
        options[o]["sim"] = predict(folder / f"bundle-{o}", updated, args, seed)
    for o in ("b", "c", "c0"):
        t = time.perf_counter()
        replies, _, _ = serve(folder / f"bundle-{o}", design, design_file, load, args.skip, folder / f"logs-{o}", False)
        seconds[f"serve_{o}"] = time.perf_counter() - t
        options[o]["runtime"] = runtime_record(replies, load, args.skip, design)
    rates = m.rates()
    return {
        "seed": seed,
        "command": "CIS_BENCH_PAUSE=/work/wt/campaign/ python benchmarks/closed_loop.py " + " ".join(sys.argv[1:]),
        "scale": scale(args, dataset),
        "calculus": {
            "design": {str(e): s for e, s in compute_rates(design).exit_share.items()},
            "shifted": {str(e): s for e, s in compute_rates(shifted).exit_share.items()},
            "updated": {str(e): s for e, s in compute_rates(updated).exit_share.items()},
        },
        "measurement": {**m.to_json(), "exit_share": {str(e): s for e, s in rates.exit_share.items()},
                        "arrival_rate": rates.arrival_rate},
        "base": json.loads((folder / "base" / "summary.json").read_text())["cis_accuracy"],
        "options": options,
        "paused_processes": paused,
        "seconds": {**seconds, "total": time.perf_counter() - t_start},
        "machine": machine(),
    }


def scale(args, dataset: str) -> dict:
    keys = ("width", "rounds", "train_subset", "val_size", "local_epochs", "ft_rounds", "ft_lr", "threads", "rate",
            "shift", "requests", "skip")
    return {"dataset": dataset.split(":")[0], **{k: getattr(args, k) for k in keys}}


# ---------------------------------------------------------------- the tables


def summarise(runs: list[dict]) -> dict:
    """Per option: mean ± sd over seeds of accuracy, shares, p99; paired differences; sim vs runtime gaps."""
    def acc(o):
        return [100 * r["options"][o]["runtime"]["accuracy"] for r in runs]

    def p99(o):
        return [1000 * r["options"][o]["runtime"]["latency"]["p99_s"] for r in runs]

    out: dict = {"options": {}, "differences": {}}
    for o in OPTIONS:
        share = {e: stats([100 * r["options"][o]["runtime"]["shares"][e] for r in runs]) for e in ("1", "2", "3")}
        sim = {e: stats([100 * r["options"][o]["sim"]["shares"][e] for r in runs]) for e in ("1", "2", "3")}
        gap = [max(abs(r["options"][o]["sim"]["shares"][e] - r["options"][o]["runtime"]["shares"][e])
                   for e in ("1", "2", "3")) * 100 for r in runs]
        out["options"][o] = {"accuracy": stats(acc(o)), "shares": share, "p99_ms": stats(p99(o)), "sim_shares": sim,
                             "sim_gap_points": stats(gap),
                             "capped": stats([r["options"][o]["runtime"]["capped"] for r in runs])}
    for a, b in (("b", "a"), ("c", "a"), ("c", "b"), ("c", "c0"), ("c0", "b")):
        out["differences"][f"{a}-{b}"] = {"accuracy": paired(acc(a), acc(b)), "p99_ms": paired(p99(a), p99(b))}
    return out


def markdown(result: dict) -> str:
    runs, s = result["runs"], result["summary"]
    sc = runs[0]["scale"]
    lines = [
        "# Does the loop pay? (benchmarks/closed_loop.py)",
        "",
        f"paper-7 designed at 80-15-5 for {sc['rate']:g} requests/s at the devices; then edge0's devices get "
        f"{sc['shift']:g}x their arrivals ({sum(runs[0]['measurement']['arrival_rate'].values()):.0f} requests/s "
        "measured). Served on the real runtime (one process per node, ZeroMQ on loopback) under the same shifted "
        f"load per seed: {sc['requests']} Poisson requests, the first {sc['skip']:g} s not counted.",
        f"Scale: {sc['dataset']}, ResNet-18 width {sc['width']}, {sc['rounds']} rounds on {sc['train_subset']} "
        f"training images (local epochs {sc['local_epochs']}), fine-tunes {sc['ft_rounds']} rounds at lr "
        f"{sc['ft_lr']}; seeds {', '.join(str(r['seed']) for r in runs)}. Machine: "
        f"{runs[0]['machine']['cpus']} CPUs, load average at the end of each seed "
        + ", ".join(f"{r['machine']['load_avg'][0]:.1f}" for r in runs)
        + f"; processes paused while serving: {sorted({r['paused_processes'] for r in runs})}.",
        "",
        "Command: `" + result["command"] + "`",
        "",
        "| option | CIS accuracy % | served shares % (exit 1-2-3) | simulator's predicted shares % | p99 ms | capped |",
        "|---|---|---|---|---|---|",
    ]
    for o in OPTIONS:
        d = s["options"][o]
        shares = "-".join(f"{d['shares'][e]['mean']:.1f}" for e in ("1", "2", "3"))
        sim = "-".join(f"{d['sim_shares'][e]['mean']:.1f}" for e in ("1", "2", "3"))
        lines.append(f"| {LABELS[o]} | {d['accuracy']['mean']:.2f} ± {d['accuracy']['sd']:.2f} | {shares} | {sim} "
                     f"(gap {d['sim_gap_points']['mean']:.1f} pts) | {d['p99_ms']['mean']:.1f} ± "
                     f"{d['p99_ms']['sd']:.1f} | {d['capped']['mean']:.0f} |")
    cal = runs[0]["calculus"]
    lines += [
        "",
        "Calculus: designed " + "-".join(f"{100 * cal['design'][e]:.1f}" for e in ("1", "2", "3"))
        + ", shifted " + "-".join(f"{100 * cal['shifted'][e]:.1f}" for e in ("1", "2", "3"))
        + "; measured under (a), mean over seeds "
        + "-".join(f"{np.mean([100 * r['measurement']['exit_share'][e] for r in runs]):.1f}" for e in ("1", "2", "3"))
        + ".",
        "",
        "Paired differences (same seed, same requests): mean ± sd (sign per seed), paired t-test p.",
        "",
        "| comparison | CIS accuracy (points) | p99 (ms) |",
        "|---|---|---|",
    ]
    for k, d in s["differences"].items():
        a, p = d["accuracy"], d["p99_ms"]
        pa = "–" if a["t_test_p"] is None else f"{a['t_test_p']:.3f}"
        pp = "–" if p["t_test_p"] is None else f"{p['t_test_p']:.3f}"
        lines.append(f"| {k} | {a['mean']:+.2f} ± {a['sd']:.2f} ({a['signs']}) p {pa} | "
                     f"{p['mean']:+.1f} ± {p['sd']:.1f} ({p['signs']}) p {pp} |")
    lines += ["", "Per seed:", "", "| seed | option | accuracy % | shares % | sim shares % | p99 ms | capped |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        for o in OPTIONS:
            rt, sim = r["options"][o]["runtime"], r["options"][o]["sim"]
            lines.append(
                f"| {r['seed']} | {o} | {100 * rt['accuracy']:.2f} | "
                + "-".join(f"{100 * rt['shares'][e]:.1f}" for e in ("1", "2", "3")) + " | "
                + "-".join(f"{100 * sim['shares'][e]:.1f}" for e in ("1", "2", "3"))
                + f" | {1000 * rt['latency']['p99_s']:.1f} | {rt['capped']} |"
            )
    if result.get("findings"):
        lines += ["", "## Findings", "", result["findings"]]
    return "\n".join(lines) + "\n"


def write(runs: list[dict], name: str, findings: str | None) -> dict:
    result = {"benchmark": NAME, "command": runs[0]["command"], "runs": runs, "summary": summarise(runs)}
    if findings:
        result["findings"] = findings
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=float))
    (RESULTS / f"{name}.md").write_text(markdown(result))
    print(f"wrote {RESULTS / name}.json and .md", file=sys.stderr)
    return result


def main() -> int:
    args = parse()
    run_dir = RESULTS / NAME / "runs"
    findings_file = RESULTS / NAME / "findings.md"
    findings = findings_file.read_text().strip() if findings_file.is_file() else None
    if not args.report:
        dataset = "digits" if args.quick else f"cifar10:{ensure_cifar(Path(args.data))}"
        for seed in seeds_of(args):
            path = run_dir / f"seed{seed}{'-quick' if args.quick else ''}.json"
            if path.is_file():
                continue
            print(f"seed {seed} ...", file=sys.stderr, flush=True)
            record = run_seed(args, seed, dataset)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1, default=float))
            print(f"seed {seed} done in {record['seconds']['total']:.0f} s", file=sys.stderr, flush=True)
    quick = args.quick
    runs = [json.loads(p.read_text()) for p in sorted(run_dir.glob("seed*.json")) if p.stem.endswith("-quick") == quick]
    if runs:
        write(runs, NAME + ("-quick" if quick else ""), None if quick else findings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
