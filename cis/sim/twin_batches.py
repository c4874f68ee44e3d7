"""The twin's calibration from a live cluster's spans (``cis serve --spans-file``; docs/simulator.md, *The hard
regime*): what each node's batches took beyond their profiled stage calls, and what that says.

- :func:`answers_sent`: when each compute span's batch had its answers and forward sent (the twin's batch holds
  the node's decision and sends; a runtime compute span ends before them);
- :func:`batch_overheads`: per node, its work per batch by how long it had idled before it
  (``SimConfig.batch_overhead``);
- :func:`interference`: how much the machine's cores slow each other (``SimConfig.interference``), from how long
  other nodes' batches ran beside each batch;
- :func:`stage_speed`: how fast the stages ran against the profile, per node;
- :func:`span_messaging`: a light load's messaging, the client's (``entry_rtt``) and each forward's (``hop_rtt``).

The columns are :func:`cis.sim.spans.read_spans`' (``node``, ``kind``, ``span_id``, ``parent_id``, ``start``,
``end``, ``seconds``, ``stage_from``, ``samples``, ...); ``profile`` is {stage: {batch: seconds per call}}
(:func:`cis.sim.twin_stages.profile_stages`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cis.runtime.loadgen import LoadResult


def answers_sent(cols: dict) -> np.ndarray:
    """Per span, for a runtime ``compute`` span: when its batch's answers and forward were sent (the latest,
    over the batch's requests, of the reply, or of the forward for a request whose samples went up); the
    span's own end for the others. A runtime node's compute span ends after the stages, before the exit
    decision and the sends; the twin's holds them (its node work per batch), so the two compare from here."""
    ends = cols["end"].copy()
    kind, node, sid, pid = cols["kind"], cols["node"], cols["span_id"], cols["parent_id"]
    request_end = {(n, i): e for n, i, e, k in zip(node, sid, cols["end"], kind) if k == "request"}
    forward_start = {(n, p): t for n, p, t, k in zip(node, pid, cols["start"], kind) if k == "forward"}
    sent: dict[tuple[str, float], float] = {}  # (node, batch start) -> the latest send of its requests
    compute = np.flatnonzero(kind == "compute")
    for i in compute:
        key = (node[i], pid[i])  # the request span of this request at this node
        t = forward_start.get(key, request_end.get(key, ends[i]))
        batch = (node[i], float(cols["start"][i]))
        sent[batch] = max(sent.get(batch, ends[i]), t)
    for i in compute:
        ends[i] = max(ends[i], sent[(node[i], float(cols["start"][i]))])
    return ends



def profiled_batch(profile: dict, stage_from: list[int], exit_: int) -> float:
    """Seconds the stage profile gives a batch whose requests enter at ``stage_from`` and run to ``exit_``
    (stage k runs once on every request that entered at k or before: cis.sim.station's batch time)."""
    total = 0.0
    for k in range(min(stage_from), exit_ + 1):
        joined = sum(1 for s in stage_from if s <= k)
        points = profile[k]
        sizes = sorted(points)
        total += float(np.interp(joined, sizes, [points[b] for b in sizes])) if joined <= sizes[-1] else (
            points[sizes[-1]] * joined / sizes[-1])
    return total


def node_batches(cols: dict, node_id: str) -> dict[float, list[int]]:
    """A runtime node's batches: {start: the rows of its requests' compute spans} (one span per request of a
    batch, all with the batch's start)."""
    batches: dict[float, list[int]] = {}
    for i in np.flatnonzero((cols["kind"] == "compute") & (cols["node"] == node_id)):
        batches.setdefault(float(cols["start"][i]), []).append(int(i))
    return batches


def entered(cols: dict, rows: list[int]) -> list[int]:
    """The stage each sample of a batch entered at (a message of k samples counts k times)."""
    return [int(cols["stage_from"][i]) for i in rows for _ in range(max(1, int(cols["samples"][i])))]


def stage_speed(cols: dict, profile: dict, spec, window: tuple[float, float], least: float = 0.002) -> dict:
    """Per node, the median over its batches that started in ``window`` of the batch's stage calls (its compute
    span, which ends when the stages have run) over their profiled time: above 1, the stages ran slower than the
    profile measured at the calibration; below, faster. Only batches whose profiled time is ``least`` seconds or
    more count (and a node with 20 such batches or more): the span also holds the batch's assembly (0.1-0.3
    ms), which would swamp a shorter stage."""
    out = {}
    for node in spec.nodes:
        ratios = []
        for t, rows in node_batches(cols, node.id).items():
            profiled = profiled_batch(profile, entered(cols, rows), node.exit)
            if window[0] <= t < window[1] and profiled >= least:
                ratios.append((cols["end"][rows[0]] - t) / profiled)
        if len(ratios) >= 20:
            out[node.id] = float(np.median(ratios))
    return out


WORK_BINS = (0.0005, 0.002, 0.005, 0.02, 0.1)  # seconds a node idled before a batch: the bins of its work table


def batch_overheads(cols: dict, profile: dict, spec, window: tuple[float, float]) -> tuple[dict, dict]:
    """Per node, what each of its batches (compute spans starting in ``window``) took beyond the profiled time
    of its stage calls, until its answers and forward were sent (_spans.answers_sent), and, when the node had
    idled, from when it woke for the batch's first message (its queue span's start: reading the message), by
    how long the node had idled before the batch: ({node: ((median idle, median extra) of each idle bin with 5
    batches or more, never decreasing), ...}, {node: mean extra})."""
    tables, means = {}, {}
    sent = answers_sent(cols)
    admitted = {(n, p): t for n, p, t, k in zip(cols["node"], cols["parent_id"], cols["start"], cols["kind"])
                if k == "queue"}  # (node, its request span) -> admitted
    for node in spec.nodes:
        batches = node_batches(cols, node.id)
        if not batches:
            continue
        starts = np.array(sorted(batches))
        ends = np.array([sent[batches[t][0]] for t in starts])
        woke = np.array([min(admitted.get((node.id, cols["parent_id"][i]), t) for i in batches[t]) for t in starts])
        before = np.concatenate([[-np.inf], ends[:-1]])
        # a node that idled woke for the batch's first message: its reading (woken, received, decoded, admitted:
        # the runtime's queue span, 0.1-0.3 ms on a 2-core machine) is this batch's work too
        reading = np.where(woke >= before, starts - woke, 0.0)
        idle = np.maximum(0.0, np.minimum(starts, woke) - before)
        extra = reading + np.array([ends[j] - t - profiled_batch(profile, entered(cols, batches[t]), node.exit)
                                    for j, t in enumerate(starts)])
        inside = (starts >= window[0]) & (starts < window[1])
        if not inside.any():
            continue
        idle, extra = idle[inside], extra[inside]
        means[node.id] = max(0.0, float(np.mean(extra)))
        edges = (0.0, *WORK_BINS, np.inf)
        points, top = [], 0.0
        for lo, hi in zip(edges, edges[1:]):
            b = (idle >= lo) & (idle < hi)
            if b.sum() >= 5:
                top = max(top, float(np.median(extra[b])))  # the longer it slept, the longer it takes
                points.append((float(np.median(idle[b])), top))
        tables[node.id] = tuple(points) if points else ((0.0, means[node.id]),)
    return tables, means


def span_messaging(cols: dict, load: LoadResult, spec: Any, window: tuple[float, float]) -> dict:
    """A light load's messaging from the nodes' spans: each answered request's latency beyond its entry node's
    request span is its client's messaging (``entry_rtt_s``); each forward's span beyond the parent's request
    span of it (the span whose parent the forward is) is that hop's (``hop_rtt_s``). ``load``'s ``targets`` are
    the entry nodes' ids."""
    inside = (cols["start"] >= window[0]) & (cols["start"] < window[1])
    kind, node, sid, pid = cols["kind"], cols["node"], cols["span_id"], cols["parent_id"]
    first = {(n, r): s for n, r, s, k, p in zip(node, cols["req_id"], cols["seconds"], kind, pid)
             if k == "request" and not p}  # fmt: skip  (a client's request: a new trace at its entry node)
    under = {p: s for s, k, p in zip(cols["seconds"], kind, pid) if k == "request" and p}
    entry = []
    for nid, idx in load.by_target().items():  # one client per entry node: ids 1, 2, ... in send order
        for cid, i in enumerate(sorted(int(i) for i in idx), start=1):
            at = first.get((nid, cid))
            if load.errors[i] is None and at is not None:
                entry.append(max(0.0, float(load.latency[i]) - at))
    hops = [max(0.0, s - under[i]) for i, s, k, ok in zip(sid, cols["seconds"], kind, inside)
            if ok and k == "forward" and i in under]  # fmt: skip
    return {"entry_rtt_s": entry, "hop_rtt_s": hops,
            "entry_rtt_median_s": float(np.median(entry)) if entry else None,
            "forward_hop_median_s": float(np.median(hops)) if hops else None}  # fmt: skip


def interference(cols: dict, profile: dict, spec, window: tuple[float, float]) -> dict:
    """How much the cores of the machine slow each other (cis.sim.cores, ``SimConfig.interference``), from a load's
    spans: each batch's time beyond its profiled stage calls (until its answers were sent, as the twin's batch
    runs) against how long other nodes' batches ran beside it (on another host, or on cores of their own), both
    taken relative to the node's own mean among batches after a like idle time (the idle time's own slowdown is
    the batch work table's), pooled over the nodes: the least-squares slope, seconds lost per second beside
    another busy core (never below 0). Returns {"interference", "batches", "overlap_mean_s"}."""
    sent = answers_sent(cols)
    admitted = {(n, p): t for n, p, t, k in zip(cols["node"], cols["parent_id"], cols["start"], cols["kind"])
                if k == "queue"}
    runs: dict[str, list[tuple[float, float, list[int]]]] = {}  # node -> (start, answers sent, stage_from per sample)
    busy: dict[str, list[tuple[float, float]]] = {}  # node -> its batches from its reading (after idling) to sent
    for node in spec.nodes:
        batches: dict[float, list[int]] = {}
        for i in np.flatnonzero((cols["kind"] == "compute") & (cols["node"] == node.id)):
            batches.setdefault(float(cols["start"][i]), []).append(int(i))
        runs[node.id] = [(t, float(sent[idx[0]]), [int(cols["stage_from"][i]) for i in idx
                                                    for _ in range(max(1, int(cols["samples"][i])))])
                         for t, idx in sorted(batches.items())]
        busy[node.id], last = [], -np.inf
        for t, idx in sorted(batches.items()):
            woke = min(admitted.get((node.id, cols["parent_id"][i]), t) for i in idx)
            busy[node.id].append((woke if woke >= last else t, float(sent[idx[0]])))
            last = float(sent[idx[0]])
    host = {n.id: n.host or n.id for n in spec.nodes}
    xs, ys = [], []
    for node in spec.nodes:
        mine = runs[node.id]
        others = [(s, e) for other, rs in busy.items() if host[other] != host[node.id] for s, e in rs]
        starts = np.array([s for s, _ in others]) if others else np.zeros(0)
        ends = np.array([e for _, e in others]) if others else np.zeros(0)
        rows = []
        last = -np.inf
        for start, end, sf in mine:
            idle, last = max(0.0, start - last), end
            if not window[0] <= start < window[1]:
                continue
            beside = float(np.clip(np.minimum(ends, end) - np.maximum(starts, start), 0.0, None).sum())
            rows.append((int(np.searchsorted(WORK_BINS, idle)), beside, end - start - profiled_batch(profile, sf,
                                                                                                       node.exit)))
        for b in {r[0] for r in rows}:
            group = np.array([r[1:] for r in rows if r[0] == b])
            if len(group) >= 5:
                xs.append(group[:, 0] - group[:, 0].mean())
                ys.append(group[:, 1] - group[:, 1].mean())
    x, y = (np.concatenate(xs), np.concatenate(ys)) if xs else (np.zeros(0), np.zeros(0))
    slope = robust_slope(x, y)
    return {"interference": max(0.0, slope), "batches": int(len(x)),
            "overlap_mean_s": float(np.mean(np.abs(x))) if len(x) else 0.0}


def robust_slope(x: np.ndarray, y: np.ndarray, rounds: int = 3, cut: float = 3.0) -> float:
    """The least-squares slope through the origin of centred ``y`` on ``x``, refitted without the points whose
    residual is beyond ``cut`` times the residuals' median absolute deviation (a batch that another process
    preempted is no measure of the cores' interference)."""
    keep = np.ones(len(x), bool)
    slope = 0.0
    for _ in range(rounds):
        xs, ys = x[keep], y[keep]
        if not len(xs) or xs @ xs <= 0:
            return slope
        slope = float(xs @ ys / (xs @ xs))
        resid = y - slope * x
        mad = float(np.median(np.abs(resid - np.median(resid)))) or 1e-12
        keep = np.abs(resid - np.median(resid)) <= cut * 1.4826 * mad
    return slope
