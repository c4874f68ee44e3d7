"""What bench/twin_hard.py's regimes share: the pause, the bundles, calibration, loads, the twin.

- :func:`paused`: stop other jobs (processes whose working directory is under a
  path, e.g. the training campaign) for a measurement, and always resume them;
- :func:`wide_cloud_bundle` (an untrained ViT whose last stage is 14 blocks wide,
  its first two one block each) and :func:`digits_bundle` (the demo model, fp32
  or int8 carries), cached under ``--work``;
- :func:`profile_stages`: each stage's seconds per call by batch size, measured
  on the core that runs it (the simulator's ``latency_profile``);
- :func:`spread`: how a stage's time spreads around its mean (the simulator's
  ``service_spread``);
- :func:`calibrate`: requests one at a time, then one light load, on the live
  system give the per-request node work (the root's time in node beyond its
  stages), how much slower stages run after idling (by how long the system
  idled before each request), and the per-visit messaging costs (what the
  answered requests' latency holds beyond all that, per node visited);
- :func:`run_load`: Poisson arrivals sent to the leaves at their times;
  :func:`summarise_runtime` / :func:`summarise_sim`: the same figures from the
  runtime's answers and the simulator's log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.campaign import stopped
from cis.core.records import latency_summary

PERCENTILES = ("p50", "p95", "p99")


# ---------------------------------------------------------------- other jobs off the cores while measuring


def _pids_under(paths: list[str]) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if any(cwd == p or cwd.startswith(p.rstrip("/") + "/") for p in paths):
            out.append(int(proc.name))
    return out


@contextlib.contextmanager
def paused(paths: list[str]):
    """SIGSTOP every process whose working directory is under one of ``paths``; SIGCONT them on the way out
    (also on an exception or Ctrl-C). Yields the pids stopped."""
    with stopped(_pids_under(paths) if paths else []) as pids:
        if pids:
            time.sleep(0.5)  # let the cores go quiet
        yield pids


def load_now() -> dict:
    """The machine's load (1-minute average) and how busy each core was over the last 0.5 s."""
    def ticks():
        rows = [line.split() for line in Path("/proc/stat").read_text().splitlines() if line.startswith("cpu")]
        return {r[0]: (sum(map(int, r[1:])), int(r[4]) + int(r[5])) for r in rows if r[0] != "cpu"}

    a = ticks()
    time.sleep(0.5)
    b = ticks()
    busy = {cpu: 1 - (b[cpu][1] - a[cpu][1]) / max(1, b[cpu][0] - a[cpu][0]) for cpu in a}
    return {"load_avg_1m": os.getloadavg()[0], "busy": busy}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- bundles


def wide_cloud_bundle(work: Path, cifar: str) -> Path:
    """An untrained ViT (dim 128, 16 blocks) cut after blocks 1, 2 and 16: the cloud's stage is 14 blocks; int8
    carries (8 kB a forward instead of 33 kB: less copying on the shared core)."""
    out = work / "wide-cloud"
    if (out / "bundle" / "manifest.json").is_file():
        return out / "bundle"
    import torch

    from bench.harness import ensure_cifar

    cifar = str(ensure_cifar(Path(cifar)))

    from cis.core.spec import spec_to_dict
    from cis.core.topologies import make_spec
    from cis.exporter import export_bundle
    from cis.training.architectures import build_model
    from cis.training.checkpoint import save_checkpoint
    from cis.training.data.loading import CIFAR10_MEAN, CIFAR10_STD

    torch.manual_seed(0)
    model = build_model({"arch": "vit", "exits": [1, 2, 16], "dim": 128, "depth": 16, "heads": 4}).eval()
    meta = {
        "classes": [str(i) for i in range(10)],
        "normalisation": {"mean": list(CIFAR10_MEAN), "std": list(CIFAR10_STD)},
        "dataset": f"cifar10:{cifar}",
        "seed": 0,
        "val_size": 200,
        "spec": spec_to_dict(make_spec("paper-7", "0-0-100")),
        "note": "untrained ViT with a wide last stage, for bench/twin_hard.py",
    }
    save_checkpoint(out / "run", model, meta)
    export_bundle(out / "run", out / "bundle", feature_dtype="int8", latency_repeats=3)
    return out / "bundle"


def digits_bundle(work: Path, feature_dtype: str) -> Path:
    """The demo digits model (trained 300 steps), exported with ``feature_dtype`` carries."""
    out = work / f"digits-{feature_dtype}"
    if (out / "bundle" / "manifest.json").is_file():
        return out / "bundle"
    from cis.exporter import export_bundle
    from cis.exporter.fixture_bundle import make_demo_run

    run = work / "digits-run"
    if not (run / "meta.json").is_file() and not any(run.glob("*")):
        make_demo_run(run, steps=300)
    export_bundle(run, out / "bundle", feature_dtype=feature_dtype, latency_repeats=3)
    return out / "bundle"


def profile_stages(bundle_dir: Path, cores: dict[int, int], x: np.ndarray, batches=(1, 2, 4, 8, 16, 32),
                   repeats: int = 30, min_seconds: float = 1.0) -> dict:
    """{stage: {batch: mean seconds per call}}: each stage run alone (onnxruntime, one thread) on ``cores[stage]``,
    the core its node runs on, on the carries of the samples ``x`` the loads send (a stage's time depends on its
    values: twin_spans found a later stage 1.3-1.6 times slower on real carries than on random ones at batch 2 and
    more). The mean, not the median: a queue sees every slow call; over ``min_seconds`` at least (5 calls of a
    batch of 32 were 0.5 s, and the capacity they set moved 282 / 310 / 353 requests/s between three runs)."""
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import StageRunner, stage_runners
    from cis.exporter.profile import stage_inputs

    bundle = load_bundle(bundle_dir)
    before = os.sched_getaffinity(0)
    chain = stage_runners(bundle, threads=1)
    real = {b: stage_inputs(chain, x, b) for b in batches}
    out: dict[int, dict[int, float]] = {}
    try:
        for k in range(1, bundle.num_exits + 1):
            os.sched_setaffinity(0, {cores[k]})
            runner = StageRunner(bundle, k, threads=1)
            out[k] = {}
            for b in batches:
                feeds = real[b][k - 1]
                for _ in range(3):
                    runner.run(feeds)
                times: list[float] = []
                began = time.perf_counter()
                while len(times) < max(5, repeats * 4 // b) or time.perf_counter() - began < min_seconds:
                    t0 = time.perf_counter()
                    runner.run(feeds)
                    times.append(time.perf_counter() - t0)
                out[k][b] = float(np.mean(times))
    finally:
        os.sched_setaffinity(0, before)
    return out


# ---------------------------------------------------------------- loads


def poisson_times(n: int, rate: float, seed: int) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def leaf_entries(spec, n: int, seed: int) -> dict[str, np.ndarray]:
    """Request i goes to a leaf with arrivals, at random in proportion to their arrival rates."""
    leaves = [node for node in spec.nodes if node.arrival_rate > 0]
    p = np.array([node.arrival_rate for node in leaves])
    pick = np.random.default_rng(seed + 7919).choice(len(leaves), size=n, p=p / p.sum())
    return {node.id: np.flatnonzero(pick == j) for j, node in enumerate(leaves)}


def run_load(addresses: dict, x: np.ndarray, spec, rate: float, seconds: float, seed: int) -> dict:
    """Poisson arrivals at ``rate`` for ``seconds``; request i carries sample i mod len(x). Returns the
    answers (in arrival order), the entries and the intended send times."""
    from cis.runtime.client import Client, infer_spread

    n = max(1, int(round(rate * seconds)))
    times = poisson_times(n, rate, seed)
    entries = leaf_entries(spec, n, seed)
    xs = x[np.arange(n) % len(x)]
    clients = {nid: Client(addresses[nid], timeout=30) for nid in entries}
    try:
        results = infer_spread(clients, xs, entries, window=max(64, n), timeout=30.0, times=times)
    finally:
        for c in clients.values():
            c.close()
    return {"results": results, "entries": entries, "times": times}


def node_counters(addresses: dict, keys=("overloaded", "capped", "degraded", "batches", "requests")) -> dict:
    from cis.runtime.client import Client

    out = {}
    for nid, addr in addresses.items():
        with Client(addr) as c:
            st = c.status(timeout=5)
        out[nid] = {k: st.get(k, 0) for k in keys} | {"latency": st.get("latency")}
    return out


# ---------------------------------------------------------------- calibration at a light load


def spread(bundle_dir: Path, stage: int, core: int, x: np.ndarray, calls: int = 200) -> tuple[float, ...]:
    """Each call's time over the mean, ``calls`` batch-1 calls of ``stage`` back to back on ``core`` (on the
    carry of the first sample of ``x``): how a stage's time spreads (the simulator's service_spread)."""
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import StageRunner, stage_runners
    from cis.exporter.profile import stage_inputs

    bundle = load_bundle(bundle_dir)
    feeds = stage_inputs(stage_runners(bundle, stage, threads=1), x[:1], 1)[stage - 1]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        runner = StageRunner(bundle, stage, threads=1)
        for _ in range(5):
            runner.run(feeds)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            runner.run(feeds)
            times.append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, before)
    return tuple(float(t) for t in np.asarray(times) / np.mean(times))


def alternating(measure, beside, rounds: int) -> list:
    """``rounds`` pairs (``measure()`` with the event ``beside`` clear, then with it set), alternating so that
    the machine's slow drifts fall on both alike."""
    pairs = []
    for _ in range(rounds):
        beside.clear()
        time.sleep(0.01)  # what the other thread had under way finishes
        alone = measure()
        beside.set()
        pairs.append((alone, measure()))
    return pairs


def beside_busy_core(bundle_dir: Path, stage: int, core: int, other: int, other_core: int, x: np.ndarray,
                     batch: int = 8, rounds: int = 8, seconds: float = 0.5) -> dict:
    """How much a busy core slows another (``SimConfig.interference``), measured in-process like the stage
    profile: ``stage`` at a batch of ``batch`` on ``core``, alone and while ``other`` (a batch of 1) runs back to
    back on ``other_core`` in a second thread, alternating for ``rounds`` rounds of ``seconds`` each; the median
    over rounds of (time beside / time alone - 1), never below 0."""
    import threading

    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import StageRunner, stage_runners
    from cis.exporter.profile import stage_inputs

    bundle = load_bundle(bundle_dir)
    chain = stage_runners(bundle, threads=1)
    feeds = stage_inputs(chain, x, batch)[stage - 1]
    other_feeds = stage_inputs(chain, x[:1], 1)[other - 1]
    before = os.sched_getaffinity(0)
    busy, stop = threading.Event(), threading.Event()

    def neighbour() -> None:  # Linux: the affinity of pid 0 is the calling thread's
        os.sched_setaffinity(0, {other_core})
        runner = StageRunner(bundle, other, threads=1)
        while not stop.is_set():
            if busy.wait(0.05):
                runner.run(other_feeds)

    def mean_call(runner) -> float:
        times: list[float] = []
        began = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - began < seconds:
            t0 = time.perf_counter()
            runner.run(feeds)
            times.append(time.perf_counter() - t0)
        return float(np.mean(times))

    thread = threading.Thread(target=neighbour, daemon=True)
    ratios: list[float] = []
    try:
        os.sched_setaffinity(0, {core})
        runner = StageRunner(bundle, stage, threads=1)
        thread.start()
        for _ in range(3):
            runner.run(feeds)
        ratios = [beside / alone for alone, beside in alternating(lambda: mean_call(runner), busy, rounds)]
    finally:
        stop.set()
        busy.set()
        thread.join()
        os.sched_setaffinity(0, before)
    return {"interference": max(0.0, float(np.median(ratios)) - 1.0), "ratios": [float(r) for r in ratios]}


IDLE_BINS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)  # seconds: the idle-time bins of the slowdown table


def calibrate(addresses: dict, x: np.ndarray, spec, stage_seconds: dict[int, float], rate: float, n: int,
              seed: int, back_to_back: int = 200, spans=None, profile: dict | None = None) -> dict:
    """Calibrate the twin on the live system: node work, slowdown after idling, messaging.

    First ``back_to_back`` one-sample requests, one at a time: the root (which runs its stages and
    nothing else) never idles more than a round trip, so its own mean latency (arrival at the node
    to the reply sent, ``status``) beyond its stages' back-to-back mean time is the node's work per request
    (``visit_overhead``: receive, decode, admit, reply, send). Then a light Poisson load at ``rate``:
    each request's latency beyond its stages and that work at every node it visited, per node visited,
    against how long the system had been idle when it came, gives how much longer a node takes after
    idling (``idle_slowdown``: the excess of each idle-time bin over the shortest idle times', in
    seconds per visit: waking the process, cold caches); what stays, per node visited, is messaging
    (``hop_rtt``: sockets, the client, unshaped links).

    With the nodes' spans (``spans``: a function returning the span columns written so far, and the stage
    ``profile`` by batch size), the node work is measured where the runtime spends it, per node and per
    batch: what each of the light load's batches took beyond its profiled stage calls, by how long the node
    had idled before it, is that node's ``batch_overhead`` table (:func:`batch_overheads`); the node's
    reading of a message is a few tens of microseconds (twin_spans: the time between batches), so
    ``visit_overhead`` is 0, and each request's messaging is what its latency holds beyond its stages and
    the mean batch work of the nodes it visited; the batches' time beyond the profile against how long other
    nodes' batches ran beside them gives how much the machine's cores slow each other (:func:`interference`)."""
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
        # the mean of these requests at the root (its window of 4096 results holds them all: fresh nodes);
        # a mean, as the stage profile's: what a node can serve per second follows from means
        served = after["count"] - before["count"]
        hot_in_node = (after["mean_s"] * after["count"] - (before["mean_s"] or 0.0) * before["count"]) / served
    finally:
        for c in clients.values():
            c.close()
    wall = time.time()
    load = run_load(addresses, x, spec, rate, n / rate, seed)
    batch_work, batch_tables = None, None
    if spans is not None:
        cols = spans()
        end = time.time()
        batch_tables, batch_work = batch_overheads(cols, profile, spec, (wall, end))
        beside = interference(cols, profile, spec, (wall, end))

    def entry_stage(nid: str) -> int:
        kids = spec.children(nid)
        return min(k.exit for k in kids) + 1 if kids else 1

    def hot(nid: str, entry: int) -> float:
        return sum(stage_seconds[k] for k in range(entry, spec.node(nid).exit + 1))

    root_hot = hot(root, entry_stage(root))
    work = max(0.0, hot_in_node - root_hot)
    if batch_work is not None:
        work = 0.0
    per_node = batch_work or {}
    entry_of = {int(i): nid for nid, idx in load["entries"].items() for i in idx}
    rows, last_end = [], -np.inf  # (idle seconds before the request, its stage times, latency, visits)
    for i in np.argsort(load["times"]):
        r, t = load["results"][int(i)], float(load["times"][int(i)])
        if r is None or r.error is not None:
            continue
        path = [node.id for node in spec.path_to_root(entry_of[int(i)])]
        if r.served_by[0] not in path:
            continue
        visited = path[: path.index(r.served_by[0]) + 1]
        stages = sum(hot(v, 1 if j == 0 else spec.node(visited[j - 1]).exit + 1) for j, v in enumerate(visited))
        stages += sum(per_node.get(v, 0.0) for v in visited)  # the batch work of the nodes it visited
        rows.append((max(0.0, t - last_end), stages, r.latency, len(visited)))
        last_end = max(last_end, t + r.latency)
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
    slow = tuple(table)
    gaps, extra = zip(*slow)
    costs = [max(0.0, (lat - st - k * work) / k - float(np.interp(g, gaps, extra))) for g, st, lat, k in rows]
    messaging = {}
    if spans is not None:  # measured where it happens: the client's messaging, and each forward's
        messaging = span_messaging(cols, load, spec, (wall, time.time()))
        slow = ((0.0, 0.0),)  # a node that slept: its batch work table
        costs = messaging["hop_rtt_s"] or costs
    return {
        "rate": rate,
        "requests": n,
        "root_back_to_back_mean_s": hot_in_node,
        "root_stages_hot_s": root_hot,
        "visit_overhead_s": work,
        "batch_overhead_s": batch_tables or {},
        "batch_overhead_mean_s": per_node,
        "idle_slowdown": [list(p) for p in slow],
        "idle_bins": [int(b.sum()) for b in bins],
        "hop_rtt_s": costs,
        "hop_rtt_median_s": float(np.median(costs)),
        "hop_rtt_mean_s": float(np.mean(costs)),
        **{k: v for k, v in messaging.items() if k != "hop_rtt_s"},
        **({"interference": beside["interference"], "interference_batches": beside["batches"],
            "window": [wall, end]} if spans is not None else {}),
    }


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
    from bench.spans import answers_sent

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


def span_messaging(cols: dict, load: dict, spec, window: tuple[float, float]) -> dict:
    """A light load's messaging from the nodes' spans: each answered request's latency beyond its entry node's
    request span is its client's messaging (``entry_rtt_s``); each forward's span beyond the parent's request
    span of it (the span whose parent the forward is) is that hop's (``hop_rtt_s``)."""
    inside = (cols["start"] >= window[0]) & (cols["start"] < window[1])
    kind, node, sid, pid = cols["kind"], cols["node"], cols["span_id"], cols["parent_id"]
    first = {(n, r): s for n, r, s, k, p in zip(node, cols["req_id"], cols["seconds"], kind, pid)
             if k == "request" and not p}  # a client's request: a new trace at its entry node
    under = {p: s for s, k, p in zip(cols["seconds"], kind, pid) if k == "request" and p}
    entry = []
    for nid, idx in load["entries"].items():  # a fresh client per entry node: ids 1, 2, ... in send order
        for cid, i in enumerate(sorted(int(i) for i in idx), start=1):
            r = load["results"][i]
            at = first.get((nid, cid))
            if r is not None and r.error is None and at is not None:
                entry.append(max(0.0, r.latency - at))
    hops = [max(0.0, s - under[i]) for i, s, k, ok in zip(sid, cols["seconds"], kind, inside)
            if ok and k == "forward" and i in under]
    return {"entry_rtt_s": entry, "hop_rtt_s": hops,
            "entry_rtt_median_s": float(np.median(entry)) if entry else None,
            "forward_hop_median_s": float(np.median(hops)) if hops else None}


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


def summarise_runtime(load: dict, num_exits: int, window: tuple[float, float] | None = None) -> dict:
    """Figures of the answered requests (those sent within ``window`` of the load, if given)."""
    res, times = load["results"], load["times"]
    keep = [i for i in range(len(res)) if window is None or window[0] <= times[i] < window[1]]
    ok = [i for i in keep if res[i] is not None and res[i].error is None]
    errors: dict[str, int] = {}
    for i in keep:
        if i not in set(ok):
            code = "timeout" if res[i] is None else res[i].error.code
            errors[code] = errors.get(code, 0) + 1
    out = _figures(
        np.array([res[i].latency for i in ok]),
        np.array([int(res[i].exit[0]) for i in ok]),
        np.array([int(res[i].flags[0]) for i in ok], dtype=np.uint8),
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
    """Several simulator runs' request logs as one (ids made unique)."""
    return {k: np.concatenate([log[k] for log in logs]) for k in logs[0]}


def rel(sim: float | None, runtime: float | None) -> float | None:
    if sim is None or runtime is None or runtime == 0:
        return None
    return abs(sim - runtime) / abs(runtime)


def interference(cols: dict, profile: dict, spec, window: tuple[float, float]) -> dict:
    """How much the cores of the machine slow each other (cis.sim.cores, ``SimConfig.interference``), from a load's
    spans: each batch's time beyond its profiled stage calls (until its answers were sent, as the twin's batch
    runs) against how long other nodes' batches ran beside it (on another host, or on cores of their own), both
    taken relative to the node's own mean among batches after a like idle time (the idle time's own slowdown is
    the batch work table's), pooled over the nodes: the least-squares slope, seconds lost per second beside
    another busy core (never below 0). Returns {"interference", "batches", "overlap_mean_s"}."""
    from bench.spans import answers_sent

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
    slope = _robust_slope(x, y)
    return {"interference": max(0.0, slope), "batches": int(len(x)),
            "overlap_mean_s": float(np.mean(np.abs(x))) if len(x) else 0.0}


def _robust_slope(x: np.ndarray, y: np.ndarray, rounds: int = 3, cut: float = 3.0) -> float:
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
