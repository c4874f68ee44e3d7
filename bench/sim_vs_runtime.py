"""The simulator against the real runtime: the same bundle, spec and Poisson load.

    python -m bench.sim_vs_runtime                       # a quick digits bundle, paper-7 60-30-10, 100 req/s
    python -m bench.sim_vs_runtime --bundle cis-demo/bundle --requests 3000

1. Bundle: ``--bundle``, or a digits model trained centrally for a few hundred
   steps (``cis.exporter.fixture_bundle.make_demo_run``) exported with ``export_bundle``.
2. Load: ``--requests`` Poisson arrivals at ``--rate`` requests/s in total, each
   sent to the leaf ``cis.core.policy.exit_policy.assign_entries`` gives it; request i carries
   validation sample i mod n, the samples whose confidences are the bundle's
   profile (checked), so the simulator "calibrated from the bundle's profile"
   and the runtime see the same inputs.
3. Runtime: every node its own process on loopback (``launch``). --repeats
   times: a calibration load (``cis.sim.calibration.calibrate_visits``: --calibration
   requests at the same rate, with their own seed, arrival times, entries and
   samples), the measured load (requests sent at their arrival times, one sample
   each), and another calibration load. The two calibrations price a node visit
   beyond the stages (messaging, waking, node work) as the machine was around
   the measured load; on a shared machine that drifts within minutes.
4. Simulator, per repeat and twice, with the bundle and the spec, links as
   loopback, each request drawing one of that repeat's per-visit costs (see
   docs/simulator.md): *replay*: the same arrival times, entry nodes and
   samples; *poisson*: its own Poisson arrivals and random profile rows.
5. Targets (issue 6): served share per exit within 2 points, mean and p95 latency
   within 20 %; reported as medians over the repeats, each repeat listed.
   Writes bench/results/sim_vs_runtime.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import RESULTS, cluster, drive_load, machine
from cis.core.records import format_ms, latency_summary


def shares(exits: np.ndarray, num_exits: int) -> dict[str, float]:
    return {str(e): float(np.mean(exits == e)) for e in range(1, num_exits + 1)}


def compare(ref: dict, other: dict) -> dict:
    gap = max(abs(ref["shares"][e] - other["shares"][e]) for e in ref["shares"])
    rel = {
        k: abs(other["latency"][f"{k}_s"] - ref["latency"][f"{k}_s"]) / ref["latency"][f"{k}_s"]
        for k in ("mean", "p95")
    }
    return {
        "share_gap_points": 100 * gap,
        "latency_rel_error": rel,
        "shares_ok": gap <= 0.02,
        "latency_ok": all(v <= 0.2 for v in rel.values()),
    }


def compare_once(spec, bundle, tmp: Path, rows: np.ndarray, seed: int, load, visit_cost: list[float]) -> dict:
    """One repeat: the runtime's answers (a load of the load generator) against the simulator given this repeat's
    calibration."""
    from cis.sim.config import SimConfig
    from cis.sim.simulation import simulate

    times, entries = load.due, load.by_target()
    n, E = len(times), spec.num_exits
    ok = np.array([e is None for e in load.errors])
    rt_exit = np.array([a.exit if k and a is not None else 0 for a, k in zip(load.answers, ok)])
    rt_lat = load.latency[ok]
    runtime = {
        "answered": int(ok.sum()),
        "shares": shares(rt_exit[ok], E),
        "latency": latency_summary(rt_lat),
        "latency_per_exit": {
            str(e): latency_summary(rt_lat[rt_exit[ok] == e]) for e in range(1, E + 1) if (rt_exit == e).any()
        },
    }
    trace = tmp / f"trace-{seed}.csv"
    trace.write_text("".join(f"{load.targets[i]},{times[i]:.9f}\n" for i in range(n)))
    calib = dict(loopback=True, hop_rtt=tuple(visit_cost), visit_overhead=0.0, seed=seed, requests=n)
    views = {}
    for name, cfg, kw in (
        (
            "replay",
            SimConfig(arrivals="trace", trace=str(trace), **calib),
            {"rows": {nid: rows[idx].tolist() for nid, idx in entries.items()}},
        ),
        ("poisson", SimConfig(**calib), {}),
    ):
        req = simulate(spec, cfg, bundle, **kw).requests
        served = req["exit"] > 0
        lat = (req["finish"] - req["arrive"])[served]
        views[name] = {
            "shares": shares(req["exit"][served], E),
            "latency": latency_summary(lat),
            "latency_per_exit": {
                str(e): latency_summary(lat[req["exit"][served] == e])
                for e in range(1, E + 1)
                if (req["exit"][served] == e).any()
            },
        }
    return {
        "seed": seed,
        "visit_cost_median_ms": 1000 * float(np.median(visit_cost)),
        "visit_cost_mean_ms": 1000 * float(np.mean(visit_cost)),
        "runtime": runtime,
        "sim": views,
        "comparison": {k: compare(runtime, v) for k, v in views.items()},
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", help="bundle folder (default: a quick digits bundle in a temporary folder)")
    ap.add_argument("--serving", default="60-30-10")
    ap.add_argument(
        "--rate", type=float, default=100.0, help="requests per second in total (arrival rates and caps scale together)"
    )
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--calibration",
        type=int,
        default=400,
        help="requests of each calibration load (one before and one after each measured load)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measured loads (seeds --seed, --seed + 1, ...); errors reported as medians over them",
    )
    ap.add_argument("--out", default=str(RESULTS / "sim_vs_runtime"))
    return ap.parse_args()


def prepare(args: argparse.Namespace, tmp: Path):
    """(bundle folder, bundle, spec, spec file, the samples sent, their validation rows): the bundle's profile is
    the validation split, which the simulator replays."""
    from cis.cli.demo.pipeline import demo_spec
    from cis.core.bundle import load_bundle
    from cis.core.policy.exit_policy import exit_confidences
    from cis.core.spec import write_spec
    from cis.core.stages.runner import run_chain
    from cis.training.data.loading import load_dataset

    if args.bundle:
        bundle_dir = Path(args.bundle)
    else:
        from cis.exporter.bundle_writer import export_bundle
        from cis.exporter.fixture_bundle import make_demo_run

        run = make_demo_run(tmp / "run", serving=args.serving)
        bundle_dir = tmp / "bundle"
        export_bundle(run, bundle_dir)
    bundle = load_bundle(bundle_dir)
    spec = demo_spec("paper-7", args.serving, args.rate)
    spec_file = tmp / "spec.toml"
    write_spec(spec, spec_file)
    m = bundle.manifest
    val = load_dataset(str(m["dataset"]), seed=int(m.get("seed", 0))).val
    conf, _ = bundle.confidence_profile()
    mine = exit_confidences(run_chain(bundle, val.x), bundle.policy.measure)
    assert np.allclose(np.stack([mine[e] for e in sorted(mine)], 1), conf, atol=1e-4), (
        "the bundle's profile is not the validation split"
    )
    rows = np.arange(args.requests) % len(val.y)
    return bundle_dir, bundle, spec, spec_file, np.ascontiguousarray(val.x[rows]), rows


def measure(args: argparse.Namespace, bundle_dir: Path, bundle, spec, spec_file: Path, x: np.ndarray) -> list:
    """Per repeat (seed, the load, its visit costs): each measured load bracketed by two calibration loads (the
    machine drifts)."""
    from cis.runtime.client import Client
    from cis.sim.calibration import calibrate_visits, warm_up

    repeats = []
    with cluster(bundle_dir, spec, spec_file=str(spec_file)) as running:
        clients = {nid: Client(running.addresses[nid]) for nid in spec.ids if spec.node(nid).arrival_rate > 0}
        try:
            warm_up(clients, x)
            for r in range(args.repeats):
                seed = args.seed + r
                before = calibrate_visits(clients, x[::-1].copy(), spec, bundle, args.rate, n=args.calibration,
                                          seed=1000 + 2 * seed)  # fmt: skip
                load = drive_load(running.addresses, x, args.rate, spec=spec, requests=len(x), seed=seed)
                after = calibrate_visits(clients, x[::-1].copy(), spec, bundle, args.rate, n=args.calibration,
                                         seed=1001 + 2 * seed)  # fmt: skip
                repeats.append((seed, load, before["visit_cost"] + after["visit_cost"]))
                print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr)
        finally:
            for c in clients.values():
                c.close()
    return repeats


def medians(measured: list[dict]) -> dict:
    """Per simulator view, the median over repeats of its share gap and latency errors, against the targets."""
    median = {
        v: {
            "share_gap_points": float(np.median([m["comparison"][v]["share_gap_points"] for m in measured])),
            "latency_rel_error": {
                k: float(np.median([m["comparison"][v]["latency_rel_error"][k] for m in measured]))
                for k in ("mean", "p95")
            },
        }
        for v in measured[0]["sim"]
    }
    for c in median.values():
        c["shares_ok"] = c["share_gap_points"] <= 2
        c["latency_ok"] = all(e <= 0.2 for e in c["latency_rel_error"].values())
    return median


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sim_vs_runtime."))
    t0 = time.perf_counter()
    bundle_dir, bundle, spec, spec_file, x, rows = prepare(args, tmp)
    print(f"bundle ready ({time.perf_counter() - t0:.1f} s); {args.repeats} x {len(x)} Poisson requests at "
          f"{args.rate:g}/s", file=sys.stderr)  # fmt: skip
    repeats = measure(args, bundle_dir, bundle, spec, spec_file, x)
    measured = [compare_once(spec, bundle, tmp, rows, *rep) for rep in repeats]
    result = {
        "bundle": str(bundle_dir),
        "spec": f"paper-7 {args.serving}",
        "rate": args.rate,
        "requests": len(x),
        "seed": args.seed,
        "repeats": args.repeats,
        "calibration_requests": 2 * args.calibration,
        "machine": machine(),
        "comparison": medians(measured),
        "per_repeat": measured,
        "seconds": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    lines = [
        "# Simulator vs runtime",
        "",
        f"{r['spec']}, {r['repeats']} measured loads of {r['requests']} Poisson requests at {r['rate']:g}/s "
        f"(seeds {r['seed']}..{r['seed'] + r['repeats'] - 1}); "
        f"bundle `{r['bundle']}`; {r['machine']['cpus']} CPUs, load "
        f"average {', '.join(f'{v:.1f}' for v in r['machine']['load_avg'])}.",
        f"Each measured load is bracketed by two calibration loads ({r['calibration_requests'] // 2} Poisson requests "
        "each, their own seeds and samples); "
        "their per-visit costs (latency beyond the profiled stages / nodes visited) are what the simulator draws, "
        "once per request.",
        "",
        "| simulator | share gap (points, target <= 2) | mean latency error (target <= 20 %) | p95 latency error "
        "(target <= 20 %) |",
        "|---|---|---|---|",
    ]
    for k, c in r["comparison"].items():
        lines.append(
            f"| {k} (median of {r['repeats']}) | {c['share_gap_points']:.2f} {'ok' if c['shares_ok'] else 'MISS'} | "
            f"{100 * c['latency_rel_error']['mean']:.1f} % | {100 * c['latency_rel_error']['p95']:.1f} "
            f"% {'ok' if c['latency_ok'] else 'MISS'} |"
        )
    for m in r["per_repeat"]:
        lines += [
            "",
            f"## Seed {m['seed']}: a node visit cost {m['visit_cost_median_ms']:.3f} ms (median) "
            f"/ {m['visit_cost_mean_ms']:.3f} ms (mean) beyond the stages",
            "",
        ]
        rows = [("runtime", m["runtime"])] + [(f"simulator ({k})", v) for k, v in m["sim"].items()]
        exits = list(m["runtime"]["shares"])
        lines += [
            "| view | "
            + " | ".join(f"exit {e}" for e in exits)
            + " | mean ms | p50 ms | p95 ms | p99 ms | per exit mean / p95 ms |",
            "|---|" + "---|" * (len(exits) + 5),
        ]
        for name, v in rows:
            lat = v["latency"]
            per = "; ".join(
                f"{e}: {format_ms(s['mean_s'])} / {format_ms(s['p95_s'])}" for e, s in v["latency_per_exit"].items()
            )
            lines.append(
                f"| {name} | "
                + " | ".join(f"{100 * v['shares'][e]:.1f}%" for e in exits)
                + "".join(f" | {format_ms(lat[k])}" for k in ("mean_s", "p50_s", "p95_s", "p99_s"))
                + f" | {per} |"
            )
        lines += ["", "| simulator | share gap | mean error | p95 error |", "|---|---|---|---|"]
        for k, c in m["comparison"].items():
            lines.append(
                f"| {k} | {c['share_gap_points']:.2f} | {100 * c['latency_rel_error']['mean']:.1f} % "
                f"| {100 * c['latency_rel_error']['p95']:.1f} % |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
