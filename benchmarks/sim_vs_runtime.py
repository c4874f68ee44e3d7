"""The simulator against the real runtime: the same bundle, spec and Poisson load.

    python benchmarks/sim_vs_runtime.py                       # a quick digits bundle, paper-7 60-30-10, 100 req/s
    python benchmarks/sim_vs_runtime.py --bundle cis-demo/bundle --requests 3000

1. Bundle: ``--bundle``, or a digits model trained centrally for a few hundred
   steps (``export.demo.make_demo_run``) exported with ``export_bundle``.
2. Load: ``--requests`` Poisson arrivals at ``--rate`` requests/s in total, each
   sent to the leaf ``cis.policy.assign_entries`` gives it; request i carries
   validation sample i mod n, the samples whose confidences are the bundle's
   profile (checked), so the simulator "calibrated from the bundle's profile"
   and the runtime see the same inputs.
3. Runtime: every node its own process on loopback (``launch``); requests sent at
   their arrival times, one sample each. Meanwhile a thread pings every node
   (``cis.pipeline.Pinger``): the messaging round trips under this load.
4. Simulator, twice, with the bundle and the spec, links as loopback, each node
   visit costing one measured round trip and the node work measured once at rest
   (``cis.pipeline.measure_messaging``, see docs/simulator.md):
   *replay*: the same arrival times, entry nodes and samples;
   *poisson*: its own Poisson arrivals and random profile rows (the same rates).
5. Targets (issue 6): served share per exit within 2 points, mean and p95 latency
   within 20 %. Writes benchmarks/results/sim_vs_runtime.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def poisson_times(n: int, rate: float, seed: int) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def shares(exits: np.ndarray, num_exits: int) -> dict[str, float]:
    return {str(e): float(np.mean(exits == e)) for e in range(1, num_exits + 1)}


def lat_stats(seconds: np.ndarray) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"mean": float(ms.mean()), "p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)), "p99": float(np.percentile(ms, 99))}


def compare(ref: dict, other: dict) -> dict:
    gap = max(abs(ref["shares"][e] - other["shares"][e]) for e in ref["shares"])
    rel = {k: abs(other["latency_ms"][k] - ref["latency_ms"][k]) / ref["latency_ms"][k] for k in ("mean", "p95")}
    return {"share_gap_points": 100 * gap, "latency_rel_error": rel, "shares_ok": gap <= 0.02, "latency_ok": all(v <= 0.2 for v in rel.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", help="bundle folder (default: a quick digits bundle in a temporary folder)")
    ap.add_argument("--serving", default="60-30-10")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second in total (arrival rates and caps scale together)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "sim_vs_runtime"))
    args = ap.parse_args()

    from cis.bundle import load_bundle
    from cis.pipeline import Pinger, demo_spec, measure_messaging, under_load, warm_up
    from cis.policy import assign_entries, exit_confidences
    from cis.runtime.client import Client, infer_spread
    from cis.runtime.launcher import launch
    from cis.spec import write_spec
    from cis.stages import run_chain
    from sim.config import SimConfig
    from sim.run import simulate
    from training.data import load_dataset

    tmp = Path(tempfile.mkdtemp(prefix="sim_vs_runtime."))
    t0 = time.perf_counter()
    if args.bundle:
        bundle_dir = Path(args.bundle)
    else:
        from export.bundle_writer import export_bundle
        from export.demo import make_demo_run

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
    assert np.allclose(np.stack([mine[e] for e in sorted(mine)], 1), conf, atol=1e-4), "the bundle's profile is not the validation split"
    n, E = args.requests, spec.num_exits
    times = poisson_times(n, args.rate, args.seed)
    entries = assign_entries(spec, n, args.seed)
    entry = [""] * n
    for nid, idx in entries.items():
        for i in idx:
            entry[int(i)] = nid
    rows = np.arange(n) % len(val.y)
    x = np.ascontiguousarray(val.x[rows])
    print(f"bundle ready ({time.perf_counter() - t0:.1f} s); {n} Poisson requests at {args.rate:g}/s", file=sys.stderr)

    cluster = launch(bundle_dir, spec, spec_file=str(spec_file), free_ports=True)
    try:
        clients = {nid: Client(cluster.addresses[nid]) for nid in entries}
        try:
            warm_up(clients, x)
            rest = measure_messaging(cluster, spec, bundle, x)
            with Pinger([cluster.addresses[nd.id] for nd in spec.nodes]) as pinger:
                results = infer_spread(clients, x, entries, window=len(x), timeout=30.0, times=times)
            cost = under_load(rest, pinger.rtts)
        finally:
            for c in clients.values():
                c.close()
    finally:
        cluster.stop()
    ok = [r is not None and r.error is None for r in results]
    rt_exit = np.array([r.exit[0] if k else 0 for r, k in zip(results, ok)])
    rt_lat = np.array([r.latency for r, k in zip(results, ok) if k])
    runtime = {"answered": int(sum(ok)), "capped": int(sum(int(r.capped[0]) for r, k in zip(results, ok) if k)),
               "shares": shares(rt_exit[np.array(ok)], E), "latency_ms": lat_stats(rt_lat),
               "latency_ms_per_exit": {str(e): lat_stats(rt_lat[rt_exit[np.array(ok)] == e]) for e in range(1, E + 1) if (rt_exit == e).any()}}

    trace = tmp / "trace.csv"
    trace.write_text("".join(f"{entry[i]},{times[i]:.9f}\n" for i in range(n)))
    calib = dict(loopback=True, hop_rtt=tuple(cost["hop_rtt"]), visit_overhead=cost["visit_overhead"], seed=args.seed, requests=n)
    views = {}
    for name, cfg, kw in (
        ("replay", SimConfig(arrivals="trace", trace=str(trace), **calib), {"rows": {nid: rows[idx].tolist() for nid, idx in entries.items()}}),
        ("poisson", SimConfig(**calib), {}),
    ):
        res = simulate(spec, cfg, bundle, **kw)
        req = res.requests
        served = req["exit"] > 0
        lat = (req["finish"] - req["arrive"])[served]
        views[name] = {"shares": shares(req["exit"][served], E), "latency_ms": lat_stats(lat),
                       "latency_ms_per_exit": {str(e): lat_stats(lat[req["exit"][served] == e]) for e in range(1, E + 1) if (req["exit"][served] == e).any()},
                       "capped": int(sum(s["capped_rate"] or 0 for s in res.summary["nodes"].values()) * res.summary["horizon_s"])}
    result = {
        "bundle": str(bundle_dir), "spec": f"paper-7 {args.serving}", "rate": args.rate, "requests": n, "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "messaging": {k: v for k, v in cost.items() if k != "hop_rtt"} | {"pings_during_load": len(cost["hop_rtt"])},
        "runtime": runtime, "sim": views,
        "comparison": {k: compare(runtime, v) for k, v in views.items()},
        "seconds": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    rows = [("runtime", r["runtime"])] + [(f"simulator ({k})", v) for k, v in r["sim"].items()]
    exits = list(r["runtime"]["shares"])
    lines = [
        "# Simulator vs runtime",
        "",
        f"{r['spec']}, {r['requests']} Poisson requests at {r['rate']:g}/s, seed {r['seed']}; bundle `{r['bundle']}`; "
        f"{r['machine']['cpus']} CPUs, load average {', '.join(f'{v:.1f}' for v in r['machine']['load_avg'])}.",
        f"Messaging given to the simulator: ping round trip at rest {1000 * r['messaging'].get('ping_rtt_at_rest_s', r['messaging']['ping_rtt_s']):.3f} ms, "
        f"during the load median {1000 * r['messaging']['ping_rtt_s']:.3f} ms / mean {1000 * r['messaging']['ping_rtt_mean_s']:.3f} ms "
        f"({r['messaging']['pings_during_load']} pings); node work per visit beyond the stages {1000 * r['messaging']['visit_overhead']:.3f} ms.",
        "",
        "| view | " + " | ".join(f"exit {e}" for e in exits) + " | mean ms | p50 ms | p95 ms | p99 ms |",
        "|---|" + "---|" * (len(exits) + 4),
    ]
    for name, v in rows:
        lat = v["latency_ms"]
        lines.append(f"| {name} | " + " | ".join(f"{100 * v['shares'][e]:.1f}%" for e in exits) + f" | {lat['mean']:.2f} | {lat['p50']:.2f} | {lat['p95']:.2f} | {lat['p99']:.2f} |")
    lines += ["", "| simulator | share gap (points, target <= 2) | mean latency error (target <= 20 %) | p95 latency error (target <= 20 %) |", "|---|---|---|---|"]
    for k, c in r["comparison"].items():
        lines.append(f"| {k} | {c['share_gap_points']:.2f} {'ok' if c['shares_ok'] else 'MISS'} | {100 * c['latency_rel_error']['mean']:.1f} % | {100 * c['latency_rel_error']['p95']:.1f} % {'ok' if c['latency_ok'] else 'MISS'} |")
    lines += ["", "Per exit (ms, mean / p95):", ""]
    for name, v in rows:
        lines.append(f"- {name}: " + "; ".join(f"exit {e} {s['mean']:.2f} / {s['p95']:.2f}" for e, s in v["latency_ms_per_exit"].items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
