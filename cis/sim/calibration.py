"""What a node visit costs on a live cluster beyond the stages: the simulator's per-visit cost (``hop_rtt``).

    costs = calibrate_visits(clients, x, spec, bundle, rate)   # a calibration load on the running nodes
    SimConfig(loopback=True, hop_rtt=tuple(costs["visit_cost"]), visit_overhead=0.0)

Used by ``cis demo`` (:mod:`cis.cli.demo.pipeline`) and ``bench/sim_vs_runtime.py``; see docs/simulator.md. The
twin of the hard regime calibrates more on a live cluster: :mod:`cis.sim.twin_calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cis.core.arrivals import poisson, send_times
from cis.core.errors import CisError


def visit_costs(spec, stage_seconds: dict[int, float], entry: Sequence[str], results: Sequence[Any]) -> list[float]:
    """Seconds per node visit beyond the stages, from answered one-sample requests.

    A request that entered at ``entry[i]`` and was served by the k-th node on its path
    to the root visited k nodes and ran the serving node's stages 1..exit; what its
    latency holds beyond those stages' time (``stage_seconds``: batch-1 seconds per
    stage, the bundle's profile) is messaging, waking processes and node work, spread
    evenly over its k visits. The simulator draws one of these per visit (``hop_rtt``)."""
    out = []
    for nid, r in zip(entry, results):
        if r is None or r.error is not None or len(r.served_by) != 1:
            continue
        path = [n.id for n in spec.path_to_root(nid)]
        served = r.served_by[0]
        if served not in path:
            continue
        stages = sum(stage_seconds[k] for k in range(1, spec.node(served).exit + 1))
        out.append(max(0.0, (r.latency - stages) / (path.index(served) + 1)))
    return out


def calibrate_visits(
    clients: dict, x: np.ndarray, spec, bundle, rate: float, n: int = 300, seed: int = 1
) -> dict[str, Any]:
    """A calibration load on the live cluster: ``n`` one-sample Poisson requests at ``rate``/s
    (its own seed, entries and arrival times), and the per-visit costs they show (:func:`visit_costs`).

    Why a load and not pings: on a shared machine a message hop costs mostly the OS
    waking a process, and that depends on how busy the machine is; a ping at rest
    understates it, pings from a prober running beside the load overstate it (the
    prober competes for the same cores)."""
    from cis.core.policy.exit_policy import assign_entries
    from cis.runtime.client import infer_spread

    n = min(n, len(x))
    entries = assign_entries(spec, n, seed)
    entry = [""] * n
    for nid, idx in entries.items():
        for i in idx:
            entry[int(i)] = nid
    times = send_times(poisson(rate, np.random.default_rng(seed)), count=n)
    results = infer_spread({nid: clients[nid] for nid in entries}, x[:n], entries, window=n, timeout=30.0, times=times)
    stage_s = {k: bundle.latency_profile()[k][1] for k in range(1, bundle.num_exits + 1)}
    costs = visit_costs(spec, stage_s, entry, results)
    if not costs:
        raise CisError("calibration: no request of the calibration load was answered")
    return {
        "visit_cost": costs,
        "visit_cost_median_s": float(np.median(costs)),
        "visit_cost_mean_s": float(np.mean(costs)),
        "requests": n,
        "answered": len(costs),
        "rate": rate,
        "seed": seed,
    }


def warm_up(clients: dict, x: np.ndarray, per_client: int = 8) -> None:
    """A few requests through every leaf before anything is measured: sessions, sockets and
    connections are set up on first use (tens of ms), which no steady state has."""
    from cis.runtime.client import infer_spread

    k = min(per_client, len(x))
    xs = np.concatenate([x[:k]] * len(clients))
    infer_spread(clients, xs, {nid: np.arange(j * k, (j + 1) * k) for j, nid in enumerate(clients)}, 4, None, 10.0)
