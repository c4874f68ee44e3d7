"""The twin calibrated on a live cluster at a light load, and the figures that compare it with the runtime
(docs/simulator.md, *The hard regime*; ``python -m bench.twin_hard`` and ``bench.twin_spans`` use it).

    stages = profile_stages(bundle, cores, x)                      # cis.sim.twin_stages
    cal = calibrate(cluster.addresses, x, spec, {k: stages[k][1] for k in stages}, rate=30, n=600, seed=1,
                    spans=read_my_spans, profile=stages)
    SimConfig(visit_overhead=cal["visit_overhead_s"], idle_slowdown=..., hop_rtt=tuple(cal["hop_rtt_s"]), ...)

- :func:`calibrate`: requests one at a time, then one light Poisson load (:func:`cis.runtime.loadgen.run_spec_load`),
  give the per-request node work, how much slower a node runs after idling, and the per-visit messaging; with
  the nodes' spans, each node's work per batch and the cores' interference (:mod:`cis.sim.twin_batches`);
- :func:`summarise_runtime` / :func:`summarise_sim`: the same figures (arrived, answered, shares, degraded and
  capped shares, latency) from a runtime load and from the simulator's request log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cis.core.records import latency_summary
from cis.runtime.loadgen import LoadResult, run_spec_load
from cis.sim.twin_batches import batch_overheads, interference, span_messaging

PERCENTILES = ("p50", "p95", "p99")
IDLE_BINS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)  # seconds: the idle-time bins of the slowdown table


def node_counters(addresses: Mapping[str, str], keys: Sequence[str] = ("overloaded", "capped", "degraded", "batches",
                                                                          "requests")) -> dict:  # fmt: skip
    """Each node's counters ``keys`` and its latency summary, from its status reply."""
    from cis.runtime.client import Client

    out = {}
    for nid, addr in addresses.items():
        with Client(addr) as c:
            st = c.status(timeout=5)
        out[nid] = {k: st.get(k, 0) for k in keys} | {"latency": st.get("latency")}
    return out


def root_work(addresses: Mapping[str, str], x: np.ndarray, spec: Any, back_to_back: int) -> float:
    """The root's mean seconds in node (arrival to reply, its ``status``) over ``back_to_back`` one-sample
    requests sent one at a time, after a warm-up of every entry node: the root never idles more than a round
    trip, so this beyond its stages' time is a node's work per request."""
    from cis.runtime.client import Client
    from cis.sim.calibration import warm_up

    root = spec.root.id
    clients = {nid: Client(addresses[nid]) for nid in addresses if spec.node(nid).arrival_rate > 0}
    try:
        warm_up(clients, x)
        before = node_counters({root: addresses[root]})[root]["latency"]
        leaf = next(iter(clients.values()))
        for i in range(back_to_back):
            leaf.infer(x[i % len(x) : i % len(x) + 1])
        after = node_counters({root: addresses[root]})[root]["latency"]
    finally:
        for c in clients.values():
            c.close()
    # the mean of these requests at the root (its window of 4096 results holds them all: fresh nodes); a mean, as
    # the stage profile's: what a node can serve per second follows from means
    served = after["count"] - before["count"]
    return (after["mean_s"] * after["count"] - (before["mean_s"] or 0.0) * before["count"]) / served


def _hot(spec: Any, stage_seconds: Mapping[int, float], nid: str, entry: int) -> float:
    """Seconds a node's stages take on a request that enters it at stage ``entry``."""
    return sum(stage_seconds[k] for k in range(entry, spec.node(nid).exit + 1))


def _entry_stage(spec: Any, nid: str) -> int:
    kids = spec.children(nid)
    return min(k.exit for k in kids) + 1 if kids else 1


def visit_rows(load: LoadResult, spec: Any, stage_seconds: Mapping[int, float],
               per_node: Mapping[str, float]) -> list[tuple[float, float, float, int]]:  # fmt: skip
    """Per answered request, in arrival order: (seconds the system had idled before it, the stage (and batch)
    work of the nodes it visited, its latency, how many nodes it visited)."""
    rows, last_end = [], -np.inf
    for i in np.argsort(load.due):
        i = int(i)
        answer, t = load.answers[i], float(load.due[i])
        if load.errors[i] is not None or answer is None:
            continue
        path = [node.id for node in spec.path_to_root(load.targets[i])]
        if answer.node not in path:
            continue
        visited = path[: path.index(answer.node) + 1]
        stages = sum(_hot(spec, stage_seconds, v, 1 if j == 0 else spec.node(visited[j - 1]).exit + 1)
                     for j, v in enumerate(visited))  # fmt: skip
        stages += sum(per_node.get(v, 0.0) for v in visited)  # the batch work of the nodes it visited
        latency = float(load.latency[i])
        rows.append((max(0.0, t - last_end), stages, latency, len(visited)))
        last_end = max(last_end, t + latency)
    return rows


def idle_slowdown(rows: Sequence[tuple[float, float, float, int]], work: float) -> tuple[tuple, list[float]]:
    """(the slowdown table ((idle seconds, extra seconds per visit), ...): each idle-time bin's median excess per
    visit over the shortest idle times', never decreasing; each request's messaging per visit beyond that)."""
    idle = np.array([g for g, *_ in rows])
    excess = np.array([(lat - st - k * work) / k for _, st, lat, k in rows])  # per node visited
    edges = (0.0, *IDLE_BINS, np.inf)
    bins = [(idle >= lo) & (idle < hi) for lo, hi in zip(edges, edges[1:])]
    filled = [b for b in bins if b.sum() >= 5]
    base = float(np.median(excess[filled[0]]))
    table, top = [(0.0, 0.0)], 0.0
    for b in filled[1:]:
        top = max(top, float(np.median(excess[b])) - base)  # the longer it idled, the longer it takes
        table.append((float(np.median(idle[b])), top))
    gaps, extra = zip(*table)
    costs = [max(0.0, (lat - st - k * work) / k - float(np.interp(g, gaps, extra))) for g, st, lat, k in rows]
    return tuple(table), costs


def calibrate(addresses: Mapping[str, str], x: np.ndarray, spec: Any, stage_seconds: Mapping[int, float],
              rate: float, n: int, seed: int, back_to_back: int = 200, spans: Callable[[], dict] | None = None,
              profile: dict | None = None) -> dict:  # fmt: skip
    """Calibrate the twin on the live system: node work, slowdown after idling, messaging.

    First ``back_to_back`` one-sample requests, one at a time (:func:`root_work`): the root's mean time in node
    beyond its stages' back-to-back time is the node's work per request (``visit_overhead``: receive, decode,
    admit, reply, send). Then a light Poisson load at ``rate`` (``n`` requests): each request's latency beyond
    its stages and that work at every node it visited, per node visited, against how long the system had been
    idle when it came, gives how much longer a node takes after idling (``idle_slowdown``: waking the process,
    cold caches); what stays, per node visited, is messaging (``hop_rtt``: sockets, the client, unshaped links).

    With the nodes' spans (``spans``: a function returning the span columns written so far, and the stage
    ``profile`` by batch size), the node work is measured where the runtime spends it, per node and per batch
    (:func:`cis.sim.twin_batches.batch_overheads`), so ``visit_overhead`` is 0; each request's messaging is what
    its latency holds beyond its stages and the mean batch work of the nodes it visited, and the batches' time
    beyond the profile against how long other nodes' batches ran beside them gives how much the machine's cores
    slow each other (:func:`cis.sim.twin_batches.interference`)."""
    root = spec.root.id
    hot_in_node = root_work(addresses, x, spec, back_to_back)
    wall = time.time()
    load = run_spec_load(spec, addresses, rate, requests=n, seed=seed, x=x, input_name="input", timeout=30.0)
    batch_work, batch_tables, beside, cols = None, None, None, None
    if spans is not None:
        cols = spans()
        window = (wall, time.time())
        batch_tables, batch_work = batch_overheads(cols, profile or {}, spec, window)
        beside = interference(cols, profile or {}, spec, window)
    root_hot = _hot(spec, stage_seconds, root, _entry_stage(spec, root))
    work = 0.0 if batch_work is not None else max(0.0, hot_in_node - root_hot)
    rows = visit_rows(load, spec, stage_seconds, batch_work or {})
    slow, costs = idle_slowdown(rows, work)
    messaging: dict = {}
    if cols is not None:  # measured where it happens: the client's messaging, and each forward's
        messaging = span_messaging(cols, load, spec, (wall, time.time()))
        slow = ((0.0, 0.0),)  # a node that slept: its batch work table
        costs = messaging["hop_rtt_s"] or costs
    out = {
        "rate": rate, "requests": n, "root_back_to_back_mean_s": hot_in_node, "root_stages_hot_s": root_hot,
        "visit_overhead_s": work, "batch_overhead_s": batch_tables or {}, "batch_overhead_mean_s": batch_work or {},
        "idle_slowdown": [list(p) for p in slow], "idle_bins": _idle_counts(rows), "hop_rtt_s": costs,
        "hop_rtt_median_s": float(np.median(costs)), "hop_rtt_mean_s": float(np.mean(costs)),
        **{k: v for k, v in messaging.items() if k != "hop_rtt_s"},
    }  # fmt: skip
    if beside is not None:
        out |= {"interference": beside["interference"], "interference_batches": beside["batches"],
                "window": [wall, time.time()]}  # fmt: skip
    return out


def _idle_counts(rows: Sequence[tuple[float, float, float, int]]) -> list[int]:
    """How many requests fell in each idle-time bin (of :data:`IDLE_BINS`)."""
    idle = np.array([g for g, *_ in rows])
    edges = (0.0, *IDLE_BINS, np.inf)
    return [int(((idle >= lo) & (idle < hi)).sum()) for lo, hi in zip(edges, edges[1:])]


# ---------------------------------------------------------------- the same figures from runtime and simulator


def _figures(latency: np.ndarray, exits: np.ndarray, flags: np.ndarray, num_exits: int, arrived: int) -> dict:
    lat = latency_summary(latency)
    return {
        "arrived": arrived,
        "answered": int(len(latency)),
        "shares": {str(e): float(np.mean(exits == e)) if len(exits) else 0.0 for e in range(1, num_exits + 1)},
        "degraded_share": float(np.mean(flags & 1 > 0)) if len(flags) else 0.0,
        "capped_share": float(np.mean(flags & 2 > 0)) if len(flags) else 0.0,
        "latency": {k: lat[f"{k}_s"] for k in ("mean", *PERCENTILES)},
    }


def summarise_runtime(load: LoadResult, num_exits: int, window: tuple[float, float] | None = None) -> dict:
    """Figures of a load's answered requests (those due within ``window`` seconds of its start, if given)."""
    keep = [i for i in range(len(load.due)) if window is None or window[0] <= load.due[i] < window[1]]
    ok = [i for i in keep if load.errors[i] is None]
    errors: dict[str, int] = {}
    for i in keep:
        code = load.errors[i]
        if code is not None:
            errors[code] = errors.get(code, 0) + 1
    answers = [load.answers[i] for i in ok]
    out = _figures(
        np.array([load.latency[i] for i in ok]),
        np.array([a.exit if a else 0 for a in answers]),
        np.array([a.flags if a else 0 for a in answers], dtype=np.uint8),
        num_exits,
        len(keep),
    )
    out["errors"] = errors
    return out


def summarise_sim(requests: dict, num_exits: int, window: tuple[float, float] | None = None) -> dict:
    """The same figures from the simulator's request log (all runs pooled)."""
    keep = np.ones(len(requests["arrive"]), bool)
    if window is not None:
        keep = (requests["arrive"] >= window[0]) & (requests["arrive"] < window[1])
    served = keep & (requests["exit"] > 0)
    out = _figures(
        (requests["finish"] - requests["arrive"])[served],
        requests["exit"][served],
        requests["flags"][served],
        num_exits,
        int(keep.sum()),
    )
    out["errors"] = {"overloaded": int((keep & (requests["exit"] == 0)).sum())}
    return out


def pool(logs: list[dict]) -> dict:
    """Several simulator runs' request logs as one."""
    return {k: np.concatenate([log[k] for log in logs]) for k in logs[0]}


def rel(sim: float | None, runtime: float | None) -> float | None:
    """(sim - runtime) / runtime as a magnitude; None when either is unknown or the runtime's is 0."""
    if sim is None or runtime is None or runtime == 0:
        return None
    return abs(sim - runtime) / abs(runtime)
