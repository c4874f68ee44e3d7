"""How fast is the simulator? Simulated requests per second on paper-7 and paper-17,
against a bare SimPy M/M/1 loop timed in the same run.

The comparison is per hop: a hop is one node visit (a request served at exit 3
of paper-7 makes three hops, with two link transfers between them), and a bare
M/M/1 customer is one hop. ``hop_ratio = CIS hops/s / bare customers/s``
(target >= 0.5). SimPy events per second are reported too. Rates are per
second of process CPU time (wall time is recorded beside it), and runs
alternate between the bare loop and the CIS models, so that other processes
on the machine disturb both alike; the numbers are medians over the repeats.
Finally one 1,000,000-request paper-17 run is timed end to end (plan, run,
summary), in wall and CPU seconds.

    python -m bench.sim_speed [--requests 100000] [--repeats 5] [--big 1000000]

Writes bench/results/sim_speed.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import simpy

from bench.harness import RESULTS as HARNESS_RESULTS
from cis.core.topologies import make_spec
from cis.sim.build import run_model
from cis.sim.config import SimConfig
from cis.sim.simulation import plan_run, simulate

SERVING = "60-30-10"
BURST_S = 10.0  # a deep token bucket, so the flow through the tree is the rate calculus's 60-30-10
RESULTS = HARNESS_RESULTS / "sim_speed.json"


def events_scheduled(env: simpy.Environment) -> int:
    """SimPy numbers every scheduled event from a counter; its next value is the count so far."""
    return next(env._eid)


def bare_mm1(customers: int, seed: int, rho: float = 0.8) -> dict:
    """The plainest SimPy M/M/1 model: a source and one process per customer."""

    def customer(env, server, service):
        with server.request() as turn:
            yield turn
            yield env.timeout(service)

    def source(env, server, rng):
        for _ in range(customers):
            yield env.timeout(rng.expovariate(rho))
            env.process(customer(env, server, rng.expovariate(1.0)))

    env = simpy.Environment()
    env.process(source(env, simpy.Resource(env, 1), random.Random(seed)))
    start, cpu_start = time.perf_counter(), time.process_time()
    env.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"wall_s": wall, "cpu_s": cpu, "hops_per_s": customers / cpu, "events_per_s": events_scheduled(env) / cpu}


def cis_run(topology: str, requests: int, seed: int) -> dict:
    """One ``cis simulate --burst 10`` run (no bundle) of a built-in topology."""
    plan = plan_run(make_spec(topology, SERVING), SimConfig(requests=requests, seed=seed, burst=BURST_S))
    start, cpu_start = time.perf_counter(), time.process_time()
    model = run_model(plan)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    hops = sum(st.received for st in model.stations.values())
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_s": requests / cpu,
        "hops_per_request": hops / requests,
        "hops_per_s": hops / cpu,
        "events_per_s": events_scheduled(model.env) / cpu,
    }


def big_run(topology: str, requests: int) -> dict:
    """A whole ``simulate()`` (plan, run, summary) of many requests, timed end to end."""
    spec = make_spec(topology, SERVING)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(spec, SimConfig(requests=requests, seed=0, burst=BURST_S))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "requests": requests,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_s_wall": requests / wall,
        "p99_latency_s": result.summary["latency"]["p99_s"],
    }


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests (and bare customers) per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big", type=int, default=1_000_000, help="requests in the timed paper-17 run (0: skip)")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {"bare_mm1": [], "paper-7": [], "paper-17": []}
    for seed in range(args.repeats):
        runs["bare_mm1"].append(bare_mm1(args.requests, seed))
        for topology in ("paper-7", "paper-17"):
            runs[topology].append(cis_run(topology, args.requests, seed))
    medians = {name: median_of(r) for name, r in runs.items()}
    bare = medians["bare_mm1"]
    result = {
        "machine": {
            "python": platform.python_version(),
            "simpy": simpy.__version__,
            "processor": platform.processor() or platform.machine(),
        },
        "serving": SERVING,
        "burst_s": BURST_S,
        "clock": "process CPU time",
        "requests_per_repeat": args.requests,
        "repeats": args.repeats,
        "bare_mm1": bare,
        **{
            topology: {
                **medians[topology],
                "hop_ratio": medians[topology]["hops_per_s"] / bare["hops_per_s"],
                "event_ratio": medians[topology]["events_per_s"] / bare["events_per_s"],
            }
            for topology in ("paper-7", "paper-17")
        },
    }
    if args.big:
        result["paper-17_big"] = big_run("paper-17", args.big)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
