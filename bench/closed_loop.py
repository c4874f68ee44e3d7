"""Does the loop pay? A CIS designed for one load, served under another, and what each answer to the shift gives.

    CIS_BENCH_PAUSE=/work/wt/campaign/ python -m bench.closed_loop [--seeds 1,2,3,4,5] [--quick]
    python -m bench.closed_loop --report      # rebuild closed_loop.{json,md} from the run files

Per seed (one run file each, bench/results/closed_loop/runs/seed<S>.json):

1. design: paper-7 at 80-15-5, ``--rate`` requests/s split evenly over the four devices, the caps
   that reproduce 80-15-5 (``cis spec new``); ``cis train`` (serving-rate weights, reduced-scale
   CIFAR-10) and ``cis export``: the deployed bundle;
2. the shift, one scenario at a time:
   - ``surge``: edge0's two devices get 3x their arrivals (80 req/s in all instead of 40), so their
     caps bind and the served shares move (the calculus: 80-15-5 -> 90-7.5-2.5);
   - ``drop``: edge1's two devices get a third of their arrivals (26.7 req/s in all), so their caps
     stop binding: the thresholds forward less than the caps allow (the calculus of the new load
     says 70-22.5-7.5; the thresholds keep serving about 80 % at the devices);
3. (a) nothing changed: the deployed bundle served under the shifted load (``cis serve --all``'s
   launcher, real node processes), measured live while it serves (``cis.runtime.measure``: two status
   snapshots over the steady part of the load) and saved (measurement.json);
4. (b) thresholds recalibrated to the measured rates: ``cis export BASE --rates-from measurement.json``;
5. (c) fine-tuned with the measured weights and recalibrated: ``cis train --init BASE --rates-from
   measurement.json --rounds K --lr LR``, then ``cis export --rates-from``;
6. (c0) the control for (c): the same fine-tune with the design's weights and spec (``cis train
   --init BASE --rounds K --lr LR``), recalibrated the same way: what the extra rounds alone give;
7. (d) thresholds calibrated to the calculus of the updated design instead: ``cis spec update DESIGN
   --rates-from measurement.json -o updated.toml``, ``cis export BASE --spec updated.toml`` (every node
   forwards as much as its cap allows under the measured arrivals);
8. every option served under the same shifted load: the same Poisson arrival times, entry devices
   and CIFAR-10 test images; accuracy, served shares per exit and node, p50/p99 latency over the
   requests that arrive after ``--skip`` seconds (the transfer caps' token buckets start full and
   hold 10 s of the cap: the first seconds forward more than the cap);
9. before any option is served, the simulator's prediction of its shares: ``cis simulate``'s way
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
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.args import seeds_of
from bench.campaign import stopped
from bench.harness import RESULTS, cluster, drive_load, ensure_cifar, machine
from bench.stats import fmt_p, paired, stats

OPTIONS = ("a", "b", "c", "c0", "d")
LABELS = {
    "a": "(a) nothing changed",
    "b": "(b) thresholds recalibrated to the measured rates",
    "c": "(c) fine-tuned with measured weights + recalibrated",
    "c0": "(c0) control: fine-tuned with design weights + recalibrated",
    "d": "(d) thresholds calibrated to the updated spec's calculus",
}
SCENARIOS = {  # node -> factor on its arrival rate
    "surge": {"device0": 3.0, "device1": 3.0},
    "drop": {"device2": 1 / 3, "device3": 1 / 3},
}
NAME = "closed_loop"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke setting: digits, 4+1 rounds, 600 requests, seed 1")
    ap.add_argument("--data", default="/tmp/cifar10", help="CIFAR-10 folder (image-folder or pickle layout)")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=60, help="base training rounds")
    ap.add_argument("--train-subset", type=int, default=7000)
    ap.add_argument("--val-size", type=int, default=2000)
    ap.add_argument("--local-epochs", type=float, default=0.25)
    ap.add_argument("--ft-rounds", type=int, default=5, help="fine-tune rounds of (c) and (c0)")
    ap.add_argument("--ft-lr", type=float, default=0.01, help="fine-tune learning rate (cosine over --ft-rounds)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of training")
    ap.add_argument("--rate", type=float, default=40.0, help="designed requests/s over the four devices")
    ap.add_argument("--scenarios", default="surge,drop", help="which shifts: surge, drop (default both)")
    ap.add_argument("--seconds", type=float, default=40.0, help="seconds of Poisson arrivals per serving run")
    ap.add_argument("--skip", type=float, default=10.0, help="seconds at the start of a serving run not counted")
    ap.add_argument("--runs", default="/tmp/cis-bench/closed_loop", help="folder for run dirs and bundles")
    ap.add_argument("--report", action="store_true", help="only rebuild the result files from the run files")
    args = ap.parse_args()
    if args.quick:
        args.width, args.rounds, args.ft_rounds, args.seconds, args.skip = 1.0, 4, 1, 10.0, 3.0
        args.local_epochs = 1.0
        args.train_subset = args.val_size = None
        args.seeds = "1" if args.seeds == "1,2,3,4,5" else args.seeds
    return args


def cli(*argv) -> dict:
    """``cis ARGV --json`` in this process; its JSON result (a failure raises)."""
    from cis.cli.main import main

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
    with stopped(pids) as done:
        yield len(done)


# ---------------------------------------------------------------- one seed


def train_and_export(args, seed: int, folder: Path, dataset: str, design_file: Path) -> None:
    """The deployed model and bundle (cached; a base run killed midway is resumed)."""
    base = folder / "base"
    if not (base / "summary.json").is_file():
        if (base / "checkpoint.pt").is_file():
            cli("train", "--out", base, "--resume", "--no-progress")
        else:
            config = folder / "base-config.json"
            config.write_text(json.dumps({
                "dataset": dataset, "spec": str(design_file), "strategy": "serving-rate", "rounds": args.rounds,
                "width": args.width, "train_subset": args.train_subset, "val_size": args.val_size, "seed": seed,
                "local_epochs": args.local_epochs, "threads": args.threads, "eval_every": args.rounds,
            }))
            cli("train", "--config", config, "--out", base, "--no-progress")
    if not (folder / "bundle-a" / "manifest.json").is_file():
        cli("export", base, "--out", folder / "bundle-a", "--latency-repeats", 3)


def load_requests(args, seed: int, dataset: str, shifted) -> dict:
    """The shifted load, the same for every option: its spec (entries in proportion to its arrival rates), total
    rate, requests, their Poisson send times (the load generator's, by ``seed``) and test images."""
    from cis.runtime.loadgen import schedule
    from cis.training.data.loading import load_dataset

    test = load_dataset(dataset, seed=seed, val_size=args.val_size).test
    total = sum(nd.arrival_rate for nd in shifted.nodes)
    n = int(round(args.seconds * total))
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(test.y))[:n] if n <= len(test.y) else np.arange(n) % len(test.y)
    return {"spec": shifted, "rate": total, "seed": seed, "times": schedule("poisson", total, requests=n, seed=seed),
            "x": np.ascontiguousarray(test.x[rows]), "y": test.y[rows]}  # fmt: skip


def serve(bundle: Path, design, design_file: Path, load: dict, skip: float, logs: Path, measure: bool):
    """Serve ``bundle`` under the load; the load's result and, with ``measure``, the live measurement of the
    steady part (two status snapshots from ``skip`` s to the last arrival), and how many processes were paused."""
    from cis.runtime.client import Client
    from cis.runtime.measure import measure as measure_live
    from cis.sim.calibration import warm_up

    found: dict = {}
    with cluster(bundle, design, spec_file=str(design_file), log_dir=logs) as running:
        entry = [nid for nid in design.ids if design.node(nid).arrival_rate > 0]
        clients = {nid: Client(running.addresses[nid], timeout=30.0) for nid in entry}
        with others_paused() as paused:
            try:
                warm_up(clients, load["x"])
            finally:
                for c in clients.values():
                    c.close()

            def snapshots() -> None:
                time.sleep(skip)
                try:
                    found["m"] = measure_live(str(logs), window=float(load["times"][-1]) - skip - 0.5)
                except Exception as exc:  # noqa: BLE001 (raised again below, in the main thread)
                    found["error"] = exc

            watcher = threading.Thread(target=snapshots, daemon=True) if measure else None
            if watcher:
                watcher.start()
            result = drive_load(running.addresses, load["x"], load["rate"], spec=load["spec"],
                                requests=len(load["x"]), seed=load["seed"])  # fmt: skip
            if watcher:
                watcher.join()
                if "error" in found:
                    raise found["error"]
    return result, found.get("m"), paused


def runtime_record(replies, load: dict, skip: float, spec) -> dict:
    """The answered requests sent from ``skip`` s on: accuracy, shares per exit and node, capped, latency."""
    from cis.core.records import latency_summary

    ok = [i for i in range(len(replies.due)) if replies.due[i] >= skip and replies.errors[i] is None]
    answers = [replies.answers[i] for i in ok]
    exits = np.array([a.exit for a in answers])
    nodes = [a.node for a in answers]
    flags = np.array([a.flags for a in answers])
    return {
        "requests": int((replies.due >= skip).sum()),
        "answered": len(ok),
        "accuracy": float(np.mean([a.cls == int(load["y"][i]) for a, i in zip(answers, ok)])),
        "shares": {str(e): float(np.mean(exits == e)) for e in range(1, spec.num_exits + 1)},
        "node_shares": {nid: nodes.count(nid) / len(ok) for nid in spec.ids},
        "capped": int(np.count_nonzero(flags & 2)),
        "degraded": int(np.count_nonzero(flags & 1)),
        "latency": latency_summary(replies.latency[ok]),
    }


def predict(bundle: Path, spec, n: int, args, seed: int) -> dict:
    """The simulator before the option is served: ``cis simulate --spec UPDATED --bundle B --loopback``."""
    from cis.core.bundle import load_bundle
    from cis.sim.config import SimConfig
    from cis.sim.simulation import simulate

    req = simulate(spec, SimConfig(requests=n, seed=seed, loopback=True), load_bundle(bundle)).requests
    keep = (req["arrive"] >= args.skip) & (req["exit"] > 0)
    correct = req["correct"][keep]
    return {
        "shares": {str(e): float(np.mean(req["exit"][keep] == e)) for e in range(1, spec.num_exits + 1)},
        "accuracy_validation_profile": float(np.mean(correct[correct >= 0])) if (correct >= 0).any() else None,
    }


def run_seed(args, seed: int, dataset: str) -> dict:
    from cis.core.spec import write_spec
    from cis.core.topologies import make_spec

    t_start = time.perf_counter()
    folder = Path(args.runs) / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    design = make_spec("paper-7", "80-15-5", total_rate=args.rate, num_classes=10)
    design_file = folder / "design.toml"
    write_spec(design, design_file)
    t = time.perf_counter()
    train_and_export(args, seed, folder, dataset, design_file)
    base_seconds = time.perf_counter() - t
    scenarios = {name: run_scenario(args, seed, dataset, folder, design, design_file, name)
                 for name in args.scenarios.split(",")}
    return {
        "seed": seed,
        "command": "CIS_BENCH_PAUSE=/work/wt/campaign/ python -m bench.closed_loop " + " ".join(sys.argv[1:]),
        "scale": scale(args, dataset),
        "base": json.loads((folder / "base" / "summary.json").read_text())["cis_accuracy"],
        "base_exit_accuracy": json.loads((folder / "base" / "summary.json").read_text())["test"]["exit_accuracy"],
        "scenarios": scenarios,
        "seconds": {"base": base_seconds, "total": time.perf_counter() - t_start},
        "machine": machine(),
    }


def export_options(args, folder: Path, here: Path, design_file: Path, saved: Path, options: dict) -> float:
    """Options b, c, c0 and d from the measurement ``saved``: fine-tune (c: with the measured rates; c0: the
    design's weights), export each with its thresholds calibrated to the measured rates (d: the updated spec's);
    what each export's calibration reports goes in ``options``. Returns the fine-tuning's seconds."""
    t = time.perf_counter()
    ft = ("--rounds", args.ft_rounds, "--lr", args.ft_lr, "--no-progress")
    if not (here / "run-c" / "summary.json").is_file():
        cli("train", "--init", folder / "base", "--rates-from", saved, *ft, "--out", here / "run-c")
    if not (folder / "run-c0" / "summary.json").is_file():  # the design's weights: one per seed, every scenario
        cli("train", "--init", folder / "base", *ft, "--out", folder / "run-c0")
    fine_tune = time.perf_counter() - t
    for o, run in (("b", folder / "base"), ("c", here / "run-c"), ("c0", folder / "run-c0")):
        report = cli("export", run, "--out", here / f"bundle-{o}", "--rates-from", saved, "--spec", design_file,
                     "--latency-repeats", 3)
        cal = report["calibration"]
        options[o]["export"] = {
            **{k: cal[k] for k in ("target_share_per_exit", "achieved_share_per_exit", "max_share_error")},
            "previous_max_share_error": cal["previous"]["max_share_error"],
            "thresholds": {n: v["threshold"] for n, v in cal["previous"]["nodes"].items()},
            "previous_thresholds": {n: v["previous"] for n, v in cal["previous"]["nodes"].items()},
        }
    cli("spec", "update", design_file, "--rates-from", saved, "-o", here / "updated.toml")
    report = cli("export", folder / "base", "--out", here / "bundle-d", "--spec", here / "updated.toml",
                 "--latency-repeats", 3)
    options["d"]["export"] = {k: report["calibration"][k] for k in ("target_share_per_exit",
                                                                     "achieved_share_per_exit", "max_share_error")}
    return fine_tune


def run_scenario(args, seed: int, dataset: str, folder: Path, design, design_file: Path, name: str) -> dict:
    from cis.core.rates import compute_rates
    from cis.runtime.measure import update_spec

    factors = SCENARIOS[name]
    shifted = design.replace_nodes(replace(n, arrival_rate=factors.get(n.id, 1.0) * n.arrival_rate)
                                   for n in design.nodes)
    here = folder / name
    here.mkdir(exist_ok=True)
    load = load_requests(args, seed, dataset, shifted)
    options: dict[str, dict] = {o: {} for o in OPTIONS}
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    replies, m, paused = serve(folder / "bundle-a", design, design_file, load, args.skip, here / "logs-a", True)
    seconds["serve_a"] = time.perf_counter() - t
    saved = here / "measurement.json"
    saved.write_text(json.dumps(m.to_json(), indent=2))
    updated = update_spec(design, m, where=str(design_file))
    options["a"]["runtime"] = runtime_record(replies, load, args.skip, design)

    t = time.perf_counter()
    seconds["fine_tune"] = export_options(args, folder, here, design_file, saved, options)
    seconds["export"] = time.perf_counter() - t - seconds["fine_tune"]
    bundles = {o: here / f"bundle-{o}" for o in OPTIONS}
    bundles["a"] = folder / "bundle-a"
    for o in OPTIONS:
        options[o]["sim"] = predict(bundles[o], updated, len(load["x"]), args, seed)
    for o in OPTIONS[1:]:
        t = time.perf_counter()
        replies, _, _ = serve(bundles[o], design, design_file, load, args.skip, here / f"logs-{o}", False)
        seconds[f"serve_{o}"] = time.perf_counter() - t
        options[o]["runtime"] = runtime_record(replies, load, args.skip, design)
    rates = m.rates()
    return {
        "factors": factors,
        "calculus": {
            "design": {str(e): s for e, s in compute_rates(design).exit_share.items()},
            "shifted": {str(e): s for e, s in compute_rates(shifted).exit_share.items()},
            "updated": {str(e): s for e, s in compute_rates(updated).exit_share.items()},
        },
        "measurement": {**m.to_json(), "exit_share": {str(e): s for e, s in rates.exit_share.items()},
                        "arrival_rate": rates.arrival_rate},
        "requests": len(load["x"]),
        "options": options,
        "paused_processes": paused,
        "seconds": seconds,
    }


def scale(args, dataset: str) -> dict:
    keys = ("width", "rounds", "train_subset", "val_size", "local_epochs", "ft_rounds", "ft_lr", "threads", "rate",
            "seconds", "skip")
    return {"dataset": dataset.split(":")[0], **{k: getattr(args, k) for k in keys}}


# ---------------------------------------------------------------- the tables


EXITS = ("1", "2", "3")
COMPARISONS = (("b", "a"), ("d", "a"), ("c", "a"), ("c", "b"), ("c", "c0"), ("d", "b"))


def summarise(runs: list[dict], scenario: str) -> dict:
    """One scenario: per option mean ± sd over seeds of accuracy, shares, p99, the simulator's shares and
    its gap to the runtime's; paired differences between options."""
    rows = [r["scenarios"][scenario] for r in runs if scenario in r["scenarios"]]

    def acc(o):
        return [100 * r["options"][o]["runtime"]["accuracy"] for r in rows]

    def p99(o):
        return [1000 * r["options"][o]["runtime"]["latency"]["p99_s"] for r in rows]

    def p50(o):
        return [1000 * r["options"][o]["runtime"]["latency"]["p50_s"] for r in rows]

    out: dict = {"seeds": [r["seed"] for r in runs if scenario in r["scenarios"]], "options": {}, "differences": {}}
    for o in OPTIONS:
        def pct(key, e, o=o):
            return [100 * r["options"][o][key]["shares"][e] for r in rows]

        gap = [max(abs(r["options"][o]["sim"]["shares"][e] - r["options"][o]["runtime"]["shares"][e])
                   for e in EXITS) * 100 for r in rows]
        out["options"][o] = {
            "accuracy": stats(acc(o)), "p50_ms": stats(p50(o)), "p99_ms": stats(p99(o)),
            "p99_ms_median": float(np.median(p99(o))),
            "shares": {e: stats(pct("runtime", e)) for e in EXITS},
            "sim_shares": {e: stats(pct("sim", e)) for e in EXITS},
            "sim_gap_points": stats(gap), "capped": stats([r["options"][o]["runtime"]["capped"] for r in rows]),
        }
    for x, y in COMPARISONS:
        out["differences"][f"{x}-{y}"] = {"accuracy": paired(acc(x), acc(y)), "p99_ms": paired(p99(x), p99(y))}
    out["measured_shares"] = {e: stats([100 * r["measurement"]["exit_share"][e] for r in rows]) for e in EXITS}
    out["calculus"] = rows[0]["calculus"]
    out["total_rate"] = stats([sum(r["measurement"]["arrival_rate"].values()) for r in rows])
    return out


def _shares(d: dict) -> str:
    return "-".join(f"{d[e]['mean']:.1f}" for e in EXITS)


def scenario_lines(name: str, s: dict, runs: list[dict]) -> list[str]:
    """The report's section of one scenario: the options side by side, the paired differences, every seed."""
    lines: list[str] = []
    cal = s["calculus"]
    what = {"surge": "edge0's devices get 3x their arrivals (their caps bind)",
            "drop": "edge1's devices get a third of their arrivals (their caps stop binding)"}.get(name, name)
    lines += [
        "",
        f"## {name}: {what}",
        "",
        f"Measured {s['total_rate']['mean']:.1f} requests/s; the calculus: designed "
        + "-".join(f"{100 * cal['design'][e]:.1f}" for e in EXITS) + ", of the shifted load "
        + "-".join(f"{100 * cal['shifted'][e]:.1f}" for e in EXITS) + "; measured under (a) "
        + _shares(s["measured_shares"]) + " (mean over seeds).",
        "",
        "| option | CIS accuracy % | served shares % (exit 1-2-3) | simulator's prediction % | p50 ms | p99 ms "
        "(median of seeds) | capped |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in OPTIONS:
        d = s["options"][o]
        lines.append(
            f"| {LABELS[o]} | {d['accuracy']['mean']:.2f} ± {d['accuracy']['sd']:.2f} | {_shares(d['shares'])} | "
            f"{_shares(d['sim_shares'])} (gap {d['sim_gap_points']['mean']:.1f} pts) | "
            f"{d['p50_ms']['mean']:.1f} ± {d['p50_ms']['sd']:.1f} | "
            f"{d['p99_ms_median']:.1f} | {d['capped']['mean']:.0f} |"
        )
    lines += ["", "Paired differences (same seed, same requests): mean ± sd (sign per seed), paired t-test p.", "",
              "| comparison | CIS accuracy (points) | p99 (ms) |", "|---|---|---|"]
    for k, d in s["differences"].items():
        a, p = d["accuracy"], d["p99_ms"]
        lines.append(f"| {k} | {a['mean']:+.2f} ± {a['sd']:.2f} ({a['signs']}) p {fmt_p(a['t_test_p'])} | "
                     f"{p['mean']:+.1f} ± {p['sd']:.1f} ({p['signs']}) p {fmt_p(p['t_test_p'])} |")
    lines += ["", "| seed | option | accuracy % | shares % | simulator % | p99 ms | capped |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        if name not in r["scenarios"]:
            continue
        for o in OPTIONS:
            rt, sim = r["scenarios"][name]["options"][o]["runtime"], r["scenarios"][name]["options"][o]["sim"]
            lines.append(
                f"| {r['seed']} | {o} | {100 * rt['accuracy']:.2f} | "
                + "-".join(f"{100 * rt['shares'][e]:.1f}" for e in EXITS) + " | "
                + "-".join(f"{100 * sim['shares'][e]:.1f}" for e in EXITS)
                + f" | {1000 * rt['latency']['p99_s']:.1f} | {rt['capped']} |"
            )
    return lines


def markdown(result: dict) -> str:
    runs = result["runs"]
    sc = runs[0]["scale"]
    lines = [
        "# Does the loop pay? (bench/closed_loop.py)",
        "",
        f"paper-7 designed at 80-15-5 for {sc['rate']:g} requests/s at the devices, trained with serving-rate "
        "weights and exported; then the traffic shifts. Every option is served on the real runtime (one process per "
        f"node, ZeroMQ on loopback) under the same shifted load per seed: {sc['seconds']:g} s of Poisson requests "
        f"(CIFAR-10 test images), the first {sc['skip']:g} s not counted.",
        f"Scale: {sc['dataset']}, {'ResNet-18' if sc['dataset'] != 'digits' else 'the digits CNN'} width "
        f"{sc['width']}, {sc['rounds']} rounds on {sc['train_subset'] or 'all'} training images (local epochs "
        f"{sc['local_epochs']}, validation {sc['val_size'] or 'the default'}), fine-tunes "
        f"{sc['ft_rounds']} rounds at lr {sc['ft_lr']}; seeds {', '.join(str(r['seed']) for r in runs)}; base CIS "
        f"accuracy at the design {np.mean([100 * r['base'] for r in runs]):.1f} % (test, by quota)"
        + (", test accuracy per exit " + "-".join(
            f"{np.mean([100 * r['base_exit_accuracy'][e] for r in runs]):.1f}" for e in EXITS) + " %"
           if all("base_exit_accuracy" in r for r in runs) else "")
        + ". Machine: "
        f"{runs[0]['machine']['cpus']} CPUs, load average at the end of each seed "
        + ", ".join(f"{r['machine']['load_avg'][0]:.1f}" for r in runs) + ".",
        "",
        "Command: `" + result["command"] + "`",
    ]
    for name, summary in result["summary"].items():
        lines += scenario_lines(name, summary, runs)
    if result.get("findings"):
        lines += ["", "## Findings", "", result["findings"]]
    return "\n".join(lines) + "\n"


def write(runs: list[dict], name: str, findings: str | None) -> dict:
    names = [n for n in SCENARIOS if any(n in r["scenarios"] for r in runs)]
    summary = {n: summarise(runs, n) for n in names}
    result = {"benchmark": NAME, "command": runs[0]["command"], "runs": runs, "summary": summary}
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
            write([json.loads(p.read_text()) for p in sorted(run_dir.glob("seed*.json"))
                   if p.stem.endswith("-quick") == args.quick], NAME + ("-quick" if args.quick else ""), None)
    quick = args.quick
    runs = [json.loads(p.read_text()) for p in sorted(run_dir.glob("seed*.json")) if p.stem.endswith("-quick") == quick]
    if runs:
        write(runs, NAME + ("-quick" if quick else ""), None if quick else findings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
