"""The whole pipeline in one call (``cis demo``): train, export, serve, replay, simulate, report.

    result = run_demo("cis-demo")          # DIR/report.md, DIR/report.json, plots, every artefact

On the built-in defaults (digits, paper-7, 60-30-10, serving-rate weights) with
nothing to download. The phases, each one progress line on stderr:

1. spec      the built-in topology at the request rate (``--rate``: every arrival
             rate and transfer cap scaled together, so the rate calculus keeps its shares);
2. train     ``cis.training.run.train_run`` (Algorithm 1) into DIR/run;
3. export    ``cis.exporter.bundle_writer.export_bundle`` into DIR/bundle;
4. offline   the bundle's graphs on the test samples (``cis.core.stages.runner.run_chain``) and
             ``cis.core.policy.exit_policy.evaluate_cis(policy=bundle.policy)``: the threshold rule the
             runtime applies, on the same samples, with the same entry nodes;
5. serve     ``cis.runtime.launcher.launch``: every node its own process on free loopback
             ports; then a calibration load (:mod:`cis.sim.calibration`: its own Poisson
             arrivals at the same rate) prices a node visit beyond the stages for the simulator;
6. replay    ``cis.runtime.client.infer_spread``: sample i to the leaf
             ``cis.core.policy.exit_policy.assign_entries`` gives it, at i / rate seconds (what
             ``cis infer --spec --rate`` does);
7. stop      ``Cluster.stop`` — always, also on an error, Ctrl-C or SIGTERM;
8. simulate  ``cis.sim.simulation.simulate`` with the bundle, the same spec, the same arrival times
             (a trace), the same samples at the same entry nodes (the test-sample
             profile replayed row by row) and the calibrated per-visit cost; and once more
             the way ``cis simulate --bundle`` runs by default (its validation profile,
             Poisson arrivals, the spec's links) for reference;
9. report    :mod:`cis.cli.reports.builder` (the same writer as ``cis report``).

torch is imported inside the training and export phases only (``cis`` never imports it
at module level).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cis.cli.interrupt import sigterm_as_interrupt
from cis.core.errors import CisError
from cis.core.records import write_requests
from cis.sim.calibration import calibrate_visits, warm_up

log = logging.getLogger(__name__)

DEFAULT_ROUNDS = 12
QUICK_ROUNDS = 4
QUICK_N = 200
MARKER = ".cis-demo"  # a folder holding this file may be replaced by another demo run
WINDOW = 32  # requests in flight per leaf (as cis infer)
CALIBRATION_N = 300  # requests of the calibration load that prices a node visit for the simulator

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    log.info(line)


# ---------------------------------------------------------------- pure helpers


def demo_spec(topology: str, serving: str, rate: float | None):
    """The built-in topology under ``serving``; ``rate`` requests/s in total (default: the
    topology's). Arrival rates and transfer caps scale together, so shares stay the calculus'."""
    from cis.core.topologies import DEFAULT_TOTAL_RATE, make_spec

    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise CisError(f"demo: --rate is {rate}; expected requests per second > 0")
    return make_spec(topology, serving, total_rate=rate or DEFAULT_TOTAL_RATE)


def total_rate(spec) -> float:
    return float(sum(n.arrival_rate for n in spec.nodes))


def replay_indices(n: int, available: int) -> np.ndarray:
    """Sample indices for n requests: the test set in order, cycled when n is larger."""
    return np.arange(n) % available


def replay_trace(entries: dict[str, np.ndarray], rate: float) -> dict[str, list[float]]:
    """The times ``infer_spread`` sends at: request i (in index order) at i / rate."""
    return {nid: (np.asarray(idx, float) / rate).tolist() for nid, idx in entries.items()}


def write_trace(path: Path, trace: dict[str, list[float]]) -> None:
    rows = sorted((t, nid) for nid, ts in trace.items() for t in ts)
    path.write_text(
        "# node,timestamp (s): the runtime replay's send times\n" + "".join(f"{nid},{t:.9f}\n" for t, nid in rows)
    )


# ---------------------------------------------------------------- the demo


class _Phases:
    def __init__(self, log: Log, total: int):
        self.log, self.total, self.k = log, total, 0
        self.seconds: dict[str, float] = {}

    def run(self, name: str, what: str, fn: Callable[[], Any]) -> Any:
        self.k += 1
        self.log(f"[{self.k}/{self.total}] {name}: {what} ...")
        t0 = time.perf_counter()
        out = fn()
        self.seconds[name] = time.perf_counter() - t0
        return out

    def done(self, line: str) -> None:
        name = list(self.seconds)[-1]
        self.log(f"      {line} ({self.seconds[name]:.1f} s)")


def _prepare(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise CisError(
                f"{out}: folder is not empty and holds no earlier demo; expected a new folder (or an old demo to "
                "replace) for --out"
            )
        for sub in ("run", "bundle", "runtime", "sim", "sim-bundle", "plots"):
            if (out / sub).is_dir():
                shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by cis demo\n")


@dataclass
class _Demo:
    """What every phase of one demo run reads: its folder, spec, settings and phase clock."""

    out: Path
    spec: Any
    spec_file: Path
    topology: str
    serving: str
    rounds: int
    rate: float
    n: int | None
    quick: bool
    seed: int
    phases: _Phases


def run_demo(
    out: str | Path = "cis-demo",
    serving: str = "60-30-10",
    topology: str = "paper-7",
    rounds: int | None = None,
    rate: float | None = None,
    n: int | None = None,
    quick: bool = False,
    seed: int = 0,
    log: Log = _stderr,
) -> dict:
    """Run the pipeline into ``out``; returns the report (also DIR/report.json)."""
    from cis.core.bundle import load_bundle
    from cis.core.policy.exit_policy import assign_entries
    from cis.core.spec import write_spec

    t_start = time.perf_counter()
    out = Path(out)
    if rounds is None:
        rounds = QUICK_ROUNDS if quick else DEFAULT_ROUNDS
    if rounds < 1:
        raise CisError(f"demo: --rounds is {rounds}; expected an integer >= 1")
    if n is not None and n < 1:
        raise CisError(f"demo: --n is {n}; expected an integer >= 1")
    spec = demo_spec(topology, serving, rate)
    _prepare(out)
    write_spec(spec, out / "spec.toml")
    demo = _Demo(out, spec, out / "spec.toml", topology, serving, rounds, total_rate(spec), n, quick, seed,
                 _Phases(log, 8))  # fmt: skip
    _train(demo)
    demo.phases.run("export", "ONNX stages, thresholds, profiles", lambda: _export(demo))
    bundle = load_bundle(out / "bundle")
    demo.phases.done(f"bundle with {bundle.num_exits} stages")
    x, y, logits, ev = demo.phases.run(
        "offline", "bundle graphs on the test set, threshold policy", lambda: _offline(demo, bundle)
    )
    demo.phases.done(f"{len(y)} samples, CIS accuracy {100 * ev.accuracy:.2f}%")
    entries = assign_entries(spec, len(y), seed)
    rt, cost = _serve_and_replay(demo, bundle, x, y, entries)
    sim, sim_ref = demo.phases.run(
        "simulate", "same load from the bundle's profiles (SimPy)",
        lambda: _simulate_both(demo, bundle, logits, y, entries, cost),
    )  # fmt: skip
    demo.phases.done(
        f"accuracy {100 * (sim['accuracy'] or 0):.2f}%, latency p50 {1000 * sim['latency']['p50_s']:.2f} ms"
    )
    comparison = _comparison(demo, len(y), ev, rt, sim, sim_ref, cost)
    return _report(demo, comparison, t_start)


def _train(demo: _Demo) -> None:
    from cis.training.config import make_config
    from cis.training.run import train_run

    settings = {"dataset": "digits", "spec": str(demo.spec_file), "strategy": "serving-rate"}
    config = make_config(None, {**settings, "rounds": demo.rounds, "seed": demo.seed})
    summary = demo.phases.run(
        "train",
        f"digits, {demo.spec.name} {demo.serving}, {demo.rounds} rounds, serving-rate weights",
        lambda: train_run(config, demo.out / "run", progress=False, log=lambda s: None),
    )
    demo.phases.done("exit accuracy " + " ".join(f"{100 * a:.1f}%" for a in summary["test"]["exit_accuracy"].values()))


def _export(demo: _Demo) -> None:
    from cis.exporter.bundle_writer import export_bundle

    export_bundle(demo.out / "run", demo.out / "bundle", spec=demo.spec)


def _offline(demo: _Demo, bundle) -> tuple[np.ndarray, np.ndarray, dict, Any]:
    """The same test samples through the bundle's graphs, and the CIS evaluation of the threshold policy."""
    from cis.core.policy.exit_policy import evaluate_cis
    from cis.core.stages.runner import run_chain
    from cis.training.data.loading import load_dataset

    test = load_dataset("digits", seed=demo.seed).test
    idx = replay_indices(demo.n or len(test.y), len(test.y))
    x, y = np.ascontiguousarray(test.x[idx]), test.y[idx]
    logits = run_chain(bundle, x)
    return x, y, logits, evaluate_cis(demo.spec, logits, y, policy=bundle.policy, seed=demo.seed)


def _serve_and_replay(demo: _Demo, bundle, x: np.ndarray, y: np.ndarray, entries: dict) -> tuple[dict, dict]:
    """Serve every node, price a node visit, replay the samples, stop the cluster (always); writes DIR/runtime.
    Returns (the runtime summary, the calibration's visit costs)."""
    from cis.runtime.launcher import launch
    from cis.runtime.result_summary import summarize

    out, spec, ph = demo.out, demo.spec, demo.phases
    restore = sigterm_as_interrupt()  # while the cluster runs, so it is stopped
    cluster = None
    try:
        cluster = ph.run(
            "serve",
            f"{len(spec.nodes)} node processes on loopback",
            lambda: launch(
                out / "bundle", spec, spec_file=str(demo.spec_file), free_ports=True,
                log_dir=str(out / "runtime" / "logs"),
            ),
        )  # fmt: skip
        results, cost, replay_wall = _replay(demo, cluster, bundle, x, entries)
        rt = summarize(results, y)
        ph.done(
            f"{rt['samples_answered']} answered, accuracy {100 * rt.get('accuracy', float('nan')):.2f}%, "
            f"errors {rt['errors'] or 'none'}"
        )
    finally:
        if cluster is not None:
            _stop(ph, cluster)
        restore()
    write_runtime(out / "runtime", spec, results, entries, y, rt, cost, replay_wall)
    return rt, cost


def _replay(demo: _Demo, cluster, bundle, x: np.ndarray, entries: dict) -> tuple[list, dict, float]:
    """Warm up, the calibration load, then the replay: (results, visit costs, the replay's wall seconds)."""
    from cis.runtime.client import Client, infer_spread

    ph, rate = demo.phases, demo.rate
    clients = {nid: Client(cluster.addresses[nid], timeout=30.0) for nid in entries}
    try:
        warm_up(clients, x)
        cost = calibrate_visits(clients, x[::-1].copy(), demo.spec, bundle, rate, n=CALIBRATION_N, seed=demo.seed + 1)
        ph.done(f"ready; calibration load of {cost['answered']} requests at {rate:g}/s: a node visit costs "
                f"{1000 * cost['visit_cost_median_s']:.2f} ms (median) beyond the stages")
        t_replay = time.perf_counter()
        results = ph.run(
            "replay",
            f"{len(x)} requests at {rate:g}/s through the leaves",
            lambda: infer_spread(clients, x, entries, WINDOW, rate, 30.0),
        )
        return results, cost, time.perf_counter() - t_replay
    finally:
        for c in clients.values():
            c.close()


def _stop(ph: _Phases, cluster) -> None:
    ph.k += 1
    ph.log(f"[{ph.k}/{ph.total}] stop: every node (SIGTERM) ...")
    t0 = time.perf_counter()
    codes = cluster.stop()
    ph.seconds["stop"] = time.perf_counter() - t0
    ph.log(f"      {len(codes)} nodes exited with {sorted(set(codes.values()), key=str)} ({ph.seconds['stop']:.1f} s)")


def _simulate_both(demo: _Demo, bundle, logits: dict, y: np.ndarray, entries: dict, cost: dict) -> tuple[dict, dict]:
    """The replay's twin (same arrival times, samples, entry nodes, visit cost) and, for reference, the way
    ``cis simulate --bundle`` runs by default: (its summary, the reference's)."""
    from cis.core.policy.exit_policy import exit_confidences, exit_correct
    from cis.sim.config import SimConfig
    from cis.sim.output import write_outputs
    from cis.sim.service import Profile
    from cis.sim.simulation import simulate

    out, spec, seed = demo.out, demo.spec, demo.seed
    measure = bundle.policy.measure if bundle.policy is not None else spec.confidence
    conf = exit_confidences(logits, measure)
    correct = exit_correct(logits, y)
    exits = range(1, spec.num_exits + 1)
    profile = Profile(np.stack([conf[e] for e in exits], 1), np.stack([correct[e] for e in exits], 1))
    (out / "sim").mkdir(parents=True, exist_ok=True)
    trace = out / "sim" / "trace.csv"
    write_trace(trace, replay_trace(entries, demo.rate))
    config = SimConfig(
        requests=len(y), seed=seed, arrivals="trace", trace=str(trace), loopback=True,
        hop_rtt=tuple(cost["visit_cost"]), visit_overhead=0.0,
    )  # fmt: skip
    res = simulate(spec, config, bundle, profile=profile, rows={k: v.tolist() for k, v in entries.items()})
    write_outputs(out / "sim", res.summary, res.requests)
    ref = simulate(spec, SimConfig(requests=max(len(y), 2000), seed=seed), bundle)
    write_outputs(out / "sim-bundle", ref.summary, ref.requests)
    return res.summary, ref.summary


def _comparison(demo: _Demo, requests: int, ev, rt: dict, sim: dict, sim_ref: dict, cost: dict) -> dict:
    """DIR/comparison.json: the settings, and accuracy and served shares offline, live and simulated."""
    from cis.core.rates import compute_rates

    calculus = compute_rates(demo.spec).exit_share
    settings = {"dataset": "digits", "topology": demo.topology, "serving": demo.serving, "strategy": "serving-rate"}
    return {
        "settings": {
            **settings, "rounds": demo.rounds, "rate": demo.rate, "requests": int(requests), "seed": demo.seed,
            "quick": demo.quick,
        },  # fmt: skip
        "accuracy": {
            "offline": ev.accuracy,
            "runtime": rt.get("accuracy"),
            "sim": sim["accuracy"],
            "sim_bundle_profile": sim_ref["accuracy"],
        },
        "served_share": {
            "calculus": {str(e): float(s) for e, s in calculus.items()},
            "offline": {str(e): float(s) for e, s in ev.exit_shares.items()},
            "runtime": {str(e): float(rt.get("served_share_per_exit", {}).get(str(e), 0.0)) for e in calculus},
            "sim": {str(e): float(sim["exits"][str(e)]["share"] or 0.0) for e in calculus},
            "sim_bundle_profile": {str(e): float(sim_ref["exits"][str(e)]["share"] or 0.0) for e in calculus},
        },
        "calibration": {k: v for k, v in cost.items() if k != "visit_cost"},
        "timings_s": dict(demo.phases.seconds),
    }


def _report(demo: _Demo, comparison: dict, t_start: float) -> dict:
    """Write comparison.json, then the report (as cis report), with every phase's seconds; returns the report."""
    from cis.cli.reports.builder import build_report, write_report

    out, ph = demo.out, demo.phases
    (out / "comparison.json").write_text(json.dumps(comparison, indent=2))
    t0 = time.perf_counter()
    report = build_report(out)
    ph.seconds["report"] = 0.0
    report["timings_s"] = {**ph.seconds, "report": time.perf_counter() - t0, "total": time.perf_counter() - t_start}
    ph.log(f"[8/8] report: {out / 'report.md'}, report.json, plots/ ...")
    write_report(report, out / "report.md")
    report["timings_s"]["report"] = time.perf_counter() - t0
    report["timings_s"]["total"] = time.perf_counter() - t_start
    comparison["timings_s"] = report["timings_s"]
    (out / "comparison.json").write_text(json.dumps(comparison, indent=2))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    ph.log(f"      done in {report['timings_s']['total']:.1f} s")
    return report


def write_runtime(
    folder: Path,
    spec,
    results,
    entries: dict[str, np.ndarray],
    labels: np.ndarray,
    summary: dict,
    cost: dict,
    wall: float,
) -> None:
    """DIR/runtime: summary.json and requests.csv (one row per sample, :data:`cis.core.records.REQUEST_COLUMNS`)."""
    folder.mkdir(parents=True, exist_ok=True)
    entry_of = {int(i): nid for nid, idx in entries.items() for i in idx}
    answered = [r is not None and r.error is None for r in results]
    sent = [r.sent if r is not None else math.nan for r in results]
    start = np.nanmin(sent) if np.isfinite(sent).any() else 0.0
    write_requests(folder / "requests.csv", {
        "id": list(range(len(results))),
        "entry": [entry_of.get(i, "") for i in range(len(results))],
        "node": [r.served_by[0] if ok else None for r, ok in zip(results, answered)],
        "exit": [int(r.exit[0]) if ok else None for r, ok in zip(results, answered)],
        "outcome": ["served" if ok else "error" for ok in answered],
        "correct": [int(r.cls[0] == labels[i]) if ok else None for i, (r, ok) in enumerate(zip(results, answered))],
        "arrive_s": [t - start if math.isfinite(t) else None for t in sent],
        "latency_s": [r.latency if ok else None for r, ok in zip(results, answered)],
        "flags": [int(r.flags[0]) if ok else None for r, ok in zip(results, answered)],
    })
    calibration = {k: v for k, v in cost.items() if k != "visit_cost"}
    (folder / "summary.json").write_text(
        json.dumps({**summary, "calibration": calibration, "wall_s": wall, "spec": spec.name}, indent=2)
    )
