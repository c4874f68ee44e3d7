"""Replicas of the cloud, measured (issue 41 items 3-4): the cloud-bound rate under a p99 target with 1, 2, 3 cloud
replicas at a cloud-heavy split, the simulator's prediction beside it; and the chaos case: an entry node SIGKILLed
under load, with and without client retries.

**Capacity.** paper-7 at 5-15-80 (80 % of requests served at the cloud's exit) on an untrained ViT (dim 64, 10
blocks) cut after blocks 1, 2 and 10: a device runs one block, an edge one, the cloud eight, so the cloud does ~75 %
of the work. Every process (the nodes and this load generator) is pinned with ``taskset`` to ``--cores`` (default:
every core this process may use; no ``taskset`` then), and the simulator's spec puts every node on one ``[hosts]``
host of that many cores: both share the same cores among all batches. For N = 1, 2, 3 cloud replicas (``replicas =
N``) one ``cis serve --all`` each, all up at once; a ladder of total rates (``--rates``), each loaded ``--repeats``
times on every cluster in turn, ``--seconds`` of Poisson arrivals through the four devices (on a shared machine the
load moves: side by side it falls on every count alike). A count's cloud-bound rate is the largest rate of the
ladder whose loads lost nothing and whose median p99 is within ``--slo-ms``. The simulator's is the largest rate of
a search (``cis simulate --sweep arrival_rate=LO:HI --slo-p99``) on that spec (loopback), with each stage's time
measured on those cores (one onnxruntime thread, as the nodes run; the twin's
``cis.sim.twin_stages.profile_stages``) and each node visit's messaging cost from a calibration load on the first
cluster (``cis.sim.calibration.calibrate_visits``, as the twin).

**Chaos.** The digits demo bundle on paper-7 (every threshold +inf, no cap: each request goes to the cloud), Poisson
``--chaos-rate`` requests/s through the four devices for ``--chaos-seconds``; ``device0`` is SIGKILLed at a third of
the run (``cis serve --all`` restarts it). Once with clients that retry (the default: each device's client retries a
request whose device died once, the same id, after the restart) and once with ``retry_after=0``; lost = requests
without an answer (timeout) or answered with an error.

The clusters start as the harness's ``start_cluster`` (the launcher, every node behind ``taskset``); the Poisson
send times are the load generator's (``cis.runtime.loadgen.schedule``) and each request's entry the offline
evaluation's split (``cis.core.policy.exit_policy.assign_entries``). The requests are not sent by the harness's
load generator, on purpose: the chaos case measures ``cis.Client``'s retries (``retry_after``, on or off, and how
many it retried), which the load generator has no knob for, so both parts send through the same ``cis.Client``
(``infer_spread``).

    python -m bench.replicas            # ~11 minutes: bench/results/replicas.{json,md}
    python -m bench.replicas --quick    # a smoke run (2 s loads, N = 1, 2; 10 s chaos): bench/results/replicas-quick.*

Timing: run it under the quiet lock (docs/runtime.md, *Benchmarks*); the JSON records the machine's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import ensure_cifar, machine, start_cluster, write_results
from bench.twin_bundles import untrained_vit_bundle

WORK = Path("/tmp/cis-bench/replicas")


def vit_bundle(work: Path, cifar: str) -> Path:
    """An untrained ViT (dim 64, 10 blocks, exits after 1, 2, 10: the cloud runs 8 blocks), its thresholds
    calibrated to paper-7 at 5-15-80; int8 carries."""
    arch = {"arch": "vit", "exits": [1, 2, 10], "dim": 64, "depth": 10, "heads": 4}
    return untrained_vit_bundle(work / "vit64-5-15-80", cifar, arch, "5-15-80", val_size=400, latency_repeats=2,
                                note="untrained ViT with a wide last stage, for bench/replicas.py")  # fmt: skip


def with_replicas(spec, n: int, cores: int | None = None):
    """The spec with ``n`` cloud replicas (free ports); with ``cores``, every node on one host of that many."""
    from cis.core.spec import Host, validate

    nodes = [dataclasses.replace(x, address=None, replicas=n if x.parent is None else 1,
                                 host="box" if cores else None) for x in spec.nodes]
    return validate(dataclasses.replace(spec, nodes=tuple(nodes), hosts=(Host("box", cores),) if cores else ()))


# ---------------------------------------------------------------- the runtime


def serve(bundle: Path, spec, cores: list[int], extra: list[str], logs: Path):
    """``cis serve --all`` of ``spec`` (written beside the logs), every process pinned to ``cores``."""
    from cis.core.spec import write_spec
    from cis.runtime.launcher import processes

    logs.mkdir(parents=True, exist_ok=True)
    path = logs / "spec.toml"
    write_spec(spec, path)
    # pinning to every core this process may use changes nothing: no taskset then (a machine may lack it)
    pin = [] if set(cores) == os.sched_getaffinity(0) else ["taskset", "-c", ",".join(map(str, cores))]
    return start_cluster(bundle, spec, spec_file=str(path), args=extra, log_dir=logs,
                         node_prefix={rid: pin for rid in processes(spec)} if pin else None, ready_timeout=180)


def load(cluster, spec, x: np.ndarray, rate: float, seconds: float, seed: int, retry: float | None = 3.0,
         during=None) -> dict:
    """Poisson requests at ``rate`` for ``seconds`` through the leaves (``during(t0)``: called in a thread when
    the load starts); p99 of the answers, lost requests (no answer, or an error), retried ones."""
    from cis.core.policy.exit_policy import assign_entries
    from cis.runtime.client import Client, infer_spread
    from cis.runtime.loadgen import schedule

    n = max(1, int(round(rate * seconds)))
    times = schedule("poisson", rate, requests=n, seed=seed)
    entries = assign_entries(spec, n, seed)
    xs = x[np.arange(n) % len(x)]
    clients = {nid: Client([cluster.addresses[r] for r in spec.node(nid).replica_ids], timeout=30,
                           retry_after=retry) for nid in entries}
    if during is not None:
        threading.Thread(target=during, args=(time.monotonic(),), daemon=True).start()
    try:
        results = infer_spread(clients, xs, entries, window=max(64, n), timeout=30.0, times=times)
    finally:
        for c in clients.values():
            c.close()
    ok = [r for r in results if r is not None and r.error is None]
    errors: dict[str, int] = {}
    for r in results:
        if r is None or r.error is not None:
            code = "timeout" if r is None or r.error is None else r.error.code
            errors[code] = errors.get(code, 0) + 1
    lat = np.array([r.latency for r in ok]) if ok else np.array([np.inf])
    return {"rate": rate, "requests": n, "answered": len(ok), "lost": n - len(ok), "errors": errors,
            "retried": sum(1 for r in results if r is not None and r.retried),
            "degraded": int(sum(int(r.degraded.sum()) for r in ok)),
            "p50_ms": float(np.percentile(lat, 50) * 1000), "p99_ms": float(np.percentile(lat, 99) * 1000)}


def capacities(bundle: Path, base, cores: list[int], args, x: np.ndarray) -> list[dict]:
    """Every replica count side by side: a ``cis serve --all`` cluster each, all up at once; each stage's time
    on the cores and the visit cost of a calibration load on the first cluster (the twin's ``calibrate_visits``);
    the simulator's capacity per count with both; then a ladder of rates, each rate loaded ``--repeats`` times
    on every cluster in turn (the order reversed every other time), so that the machine's load, which moves,
    falls on every count alike. A count's rate is the largest of the ladder whose loads all lost nothing and
    whose median p99 is within the target."""
    counts = [int(n) for n in args.replicas.split(",")]
    specs = {n: with_replicas(base, n) for n in counts}
    clusters: dict = {}
    try:
        for n in counts:
            clusters[n] = serve(bundle, specs[n], cores, ["--heartbeat", "0.2"], WORK / f"logs-{n}")
        profile, costs = calibrate(clusters[counts[0]], specs[counts[0]], bundle, cores, args, x)
        sims = {n: sim_capacity(bundle, with_replicas(specs[n], n, len(cores)), args, profile, costs["visit_cost"])
                for n in counts}
        tries: dict[int, dict[float, list]] = {n: {} for n in counts}
        for rate in (float(r) for r in args.rates.split(",")):
            for rep in range(args.repeats):
                for n in counts if rep % 2 == 0 else counts[::-1]:
                    got = load(clusters[n], specs[n], x, rate, args.seconds, rep)
                    tries[n].setdefault(rate, []).append(got)
                    print(f"replicas: N={n} {rate:g} req/s: p99 {got['p99_ms']:.1f} ms, lost {got['lost']}",
                          file=sys.stderr, flush=True)
            if all(_p99(tries[n][rate]) > 3 * args.slo_ms for n in counts):
                break  # every count far past the target: higher rates tell nothing more
    finally:
        for cluster in clusters.values():
            cluster.stop()
    visit = {k: costs[k] for k in ("visit_cost_median_s", "visit_cost_mean_s", "requests", "answered", "rate")}
    out = []
    for n in counts:
        meets = [r for r, got in tries[n].items() if _p99(got) <= args.slo_ms and not any(g["lost"] for g in got)]
        ladder = [{"rate": r, "p99_ms_median": _p99(got), "p99_ms": [g["p99_ms"] for g in got],
                   "lost": sum(g["lost"] for g in got)} for r, got in tries[n].items()]
        out.append({"replicas": n, "runtime": {"rate": max(meets, default=0.0), "ladder": ladder},
                    "simulator": sims[n], "visit_cost": visit, "stage_seconds": profile})
    return out


def _p99(got: list[dict]) -> float:
    return float(np.median([g["p99_ms"] for g in got]))


def calibrate(cluster, spec, bundle: Path, cores: list[int], args, x: np.ndarray) -> tuple[dict, dict]:
    """(each stage's seconds per batch size on the cores, one thread; the visit costs of a calibration load)."""
    from cis.runtime.client import Client
    from cis.sim.calibration import calibrate_visits, warm_up
    from cis.sim.twin_stages import profile_stages

    clients = {leaf.id: Client(cluster.addresses[leaf.id], timeout=30) for leaf in spec.leaves}
    try:
        warm_up(clients, x)
        profile = profile_stages(bundle, {k: cores[0] for k in (1, 2, 3)}, x, batches=(1, 4, 16, 32), min_seconds=0.5)
        costs = calibrate_visits(clients, x, spec, _Profiled(profile), args.calibration_rate, args.calibration_n)
    finally:
        for c in clients.values():
            c.close()
    print(f"replicas: visit cost median {costs['visit_cost_median_s'] * 1000:.2f} ms, cloud stage "
          f"{profile[3][1] * 1000:.1f} ms", file=sys.stderr, flush=True)
    return profile, costs


class _Profiled:
    """What calibrate_visits reads of a bundle: its stage times (here: measured on the benchmark's cores)."""

    def __init__(self, profile: dict) -> None:
        self.profile, self.num_exits = profile, len(profile)

    def latency_profile(self) -> dict:
        return self.profile


# ---------------------------------------------------------------- the simulator


def sim_capacity(bundle: Path, spec, args, profile: dict, visit_cost: list[float]) -> dict:
    """The simulator's largest rate with p99 <= the target: ``cis simulate --bundle B --loopback --latency-profile
    P --visit-cost ... --sweep arrival_rate=LO:HI --slo-p99 MS`` of the spec (factors on its 100 requests/s)."""
    from cis.sim import SimConfig
    from cis.sim.sweep import sweep

    config = SimConfig(requests=args.sim_requests, seed=0, loopback=True, latency_profile=profile,
                       hop_rtt=tuple(visit_cost), visit_overhead=0.0)
    found = sweep(spec, config, (0.05, 40.0), str(bundle), args.slo_ms, jobs=2, tolerance=0.03)
    cap = found["capacity"]
    return {"rate": cap["total_rate"] if cap else 0.0,
            "points": [{k: p[k] for k in ("total_rate", "p99_s", "meets_slo")} for p in found["points"]]}


# ---------------------------------------------------------------- chaos


def chaos(args, cores: list[int], retry: float | None) -> dict:
    """SIGKILL device0 a third into a Poisson load through the four devices; lost with or without retries."""
    from cis.core.bundle import load_bundle
    from cis.exporter.fixture_bundle import make_demo_bundle
    from cis.training.data.loading import load_dataset

    bundle = WORK / "digits" / "bundle"
    if not (bundle / "manifest.json").is_file():
        make_demo_bundle(WORK / "digits", steps=300)
    spec = with_replicas(load_bundle(bundle).spec, 1)
    x = load_dataset("digits", seed=0).test.x
    extra = ["--threshold", "inf", "--no-cap", "--heartbeat", "0.1", "--forward-timeout", "0.5"]
    cluster = serve(bundle, spec, cores, extra, WORK / f"chaos-{'retry' if retry else 'none'}")
    killed: dict = {}

    def kill(t0: float) -> None:
        time.sleep(max(0.0, t0 + args.chaos_seconds / 3 - time.monotonic()))
        killed["pid"] = cluster.procs["device0"].pid
        killed["at_s"] = time.monotonic() - t0
        os.kill(killed["pid"], signal.SIGKILL)

    stop = threading.Event()

    def supervise() -> None:  # what cis serve --all's loop does: restart the node that died
        while not stop.is_set():
            cluster.supervise()
            time.sleep(0.1)

    threading.Thread(target=supervise, daemon=True).start()
    try:
        got = load(cluster, spec, x, args.chaos_rate, args.chaos_seconds, 0, retry, during=kill)
    finally:
        stop.set()
        cluster.stop()
    return {**got, "killed": killed, "restarts": cluster.supervision["device0"].restarts, "retry_after": retry}


# ---------------------------------------------------------------- the report


def markdown(out: dict) -> list[str]:
    rows = ["# Replicas of the cloud (issue 41)", "",
            f"{'QUICK SMOKE RUN, not a result. ' if out['quick'] else ''}Machine: {out['machine']['cpus']} cpus, "
            f"load average {out['machine']['load_avg'][0]:.1f} before and {out['machine_after']['load_avg'][0]:.1f} "
            f"after (the machine is shared); processes on cores {out['cores']}. "
            f"Total {out['seconds'] / 60:.1f} min.", "",
            f"## Cloud-bound rate under p99 {out['slo_ms']:g} ms, paper-7 at 5-15-80 (ViT, the cloud 8 of 10 blocks)",
            "", "| cloud replicas | runtime (req/s) | simulator (req/s) | runtime / sim | runtime x 1 replica's | "
            "visit cost (median ms) | cloud stage, batch 1 (ms) |", "|---|---|---|---|---|---|---|"]
    one = out["capacity"][0]["runtime"]["rate"] or float("nan")
    for c in out["capacity"]:
        rt, sim = c["runtime"]["rate"], c["simulator"]["rate"]
        ratio = rt / sim if sim else float("nan")
        rt_top = rt >= max(step["rate"] for step in c["runtime"]["ladder"])  # the ladder's top: a lower bound
        sim_top = sim >= max(point["total_rate"] for point in c["simulator"]["points"])  # the search's top too
        rows.append(f"| {c['replicas']} | {'>= ' * rt_top}{rt:.1f} | {'>= ' * sim_top}{sim:.1f} | {ratio:.2f} | "
                    f"{'>= ' * rt_top}{rt / one:.2f} | "
                    f"{c['visit_cost']['visit_cost_median_s'] * 1000:.2f} | {c['stage_seconds'][3][1] * 1000:.1f} |")
    rows += ["", "The simulator: the same spec, every node on one host of as many cores as the processes are pinned "
             "to, each stage's time measured on them (one thread, the mean over 0.5 s per batch size), and each node "
             "visit's messaging cost from a "
             f"calibration load at {out['capacity'][0]['visit_cost']['rate']:g} req/s on the first cluster "
             "(cis.sim.calibration.calibrate_visits, as the twin). '>=': the rate met the target at the top of "
             "what was tried (the runtime's ladder, the simulator's search), so the capacity is at least that."]
    rows += ["", f"Runtime: every count's cluster up at once, each rate of the ladder loaded {out['repeats']} times on "
             f"each in turn ({out['seconds_per_load']:g} s of Poisson arrivals through the four devices); a rate meets "
             "the target when no load lost a request and the median of their p99s is within it. Median p99 (ms) per "
             "rate:", "", "| rate (req/s) | " + " | ".join(f"N = {c['replicas']}" for c in out["capacity"]) + " |",
             "|---|" + "---|" * len(out["capacity"])]
    for i, step in enumerate(out["capacity"][0]["runtime"]["ladder"]):
        cells = [f"{c['runtime']['ladder'][i]['p99_ms_median']:.0f}" + (" (lost)" if c["runtime"]["ladder"][i]["lost"]
                 else "") for c in out["capacity"]]
        rows.append(f"| {step['rate']:g} | " + " | ".join(cells) + " |")
    rows += ["", f"## Chaos: device0 SIGKILLed under {out['chaos'][0]['rate']:g} req/s (digits, paper-7, all to the "
             "cloud)", "", "| clients | requests | lost | retried | degraded | p99 ms | device0 restarts |",
             "|---|---|---|---|---|---|---|"]
    for c in out["chaos"]:
        who = f"retry after {c['retry_after']:g} s" if c["retry_after"] else "no retries"
        rows.append(f"| {who} | {c['requests']} | {c['lost']} {c['errors'] or ''} | {c['retried']} | "
                    f"{c['degraded']} | {c['p99_ms']:.0f} | {c['restarts']} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", help="cores to pin every process to, e.g. 0,1 (default: all this process may use)")
    ap.add_argument("--replicas", default="1,2,3", help="cloud replica counts (default 1,2,3)")
    ap.add_argument("--slo-ms", type=float, default=100.0, help="the p99 target (default 100 ms)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of each load (default 5)")
    ap.add_argument("--rates", default="25,50,100,150,200,300", help="the ladder of total rates, req/s")
    ap.add_argument("--repeats", type=int, default=3, help="loads per rate and replica count (default 3)")
    ap.add_argument("--sim-requests", type=int, default=20_000)
    ap.add_argument("--calibration-rate", type=float, default=15.0, help="requests/s of the visit-cost load")
    ap.add_argument("--calibration-n", type=int, default=150, help="requests of the visit-cost load")
    ap.add_argument("--chaos-rate", type=float, default=150.0)
    ap.add_argument("--chaos-seconds", type=float, default=30.0)
    ap.add_argument("--cifar", default=str(WORK / "cifar10"))
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 s loads at 25, 75 req/s, N = 1, 2; 10 s chaos")
    ap.add_argument("--name", default="replicas", help="results under bench/results/NAME.{json,md} (default replicas; "
                    "--quick: NAME-quick)")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rates, args.replicas, args.chaos_seconds, args.sim_requests = 2.0, "25,75", "1,2", 10.0, 5000
        args.calibration_n = 60
    cores = sorted(int(c) for c in args.cores.split(",")) if args.cores else sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores))  # the load generator on the same cores
    start, before = time.perf_counter(), machine()
    from cis.core.bundle import load_bundle
    from cis.training.data.loading import load_dataset

    WORK.mkdir(parents=True, exist_ok=True)
    bundle = vit_bundle(WORK, args.cifar)
    base = load_bundle(bundle).spec
    x = load_dataset(f"cifar10:{ensure_cifar(Path(args.cifar))}", seed=0).test.x[:512]
    found = capacities(bundle, base, cores, args, x)
    runs = [chaos(args, cores, 3.0), chaos(args, cores, None)]
    out = {"quick": args.quick, "machine": before, "machine_after": machine(), "cores": cores, "slo_ms": args.slo_ms,
           "seconds_per_load": args.seconds, "repeats": args.repeats, "capacity": found, "chaos": runs,
           "seconds": time.perf_counter() - start}
    write_results(f"{args.name}-quick" if args.quick else args.name, out, markdown(out))
    return 0


if __name__ == "__main__":
    tempfile.tempdir = str(WORK)
    raise SystemExit(main())
