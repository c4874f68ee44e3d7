"""Where the runtime's per-hop overhead goes: a timeline of one request through three tiers.

The three nodes of a paper-7 path (device, edge, cloud) run as real processes
(``multiprocessing``, each a :class:`cis.runtime.node.Node` built by
``cis.runtime.factory.build_node``), with thresholds +inf below the root so every request goes all
the way up, as in ``runtime_overhead.py`` (a). Each node records wall-clock
timestamps (``time.time()``, one clock for every process on the machine) at the
entry and exit of its handlers and stage runs; the client sends one-sample
requests back to back. For every request the time between consecutive events
is attributed to a step (client -> device transit, device stage 1, device
decision + forward, ...); the medians per step are written out.

    python -m bench.runtime_hop_breakdown --bundle /tmp/cis-runtime-bench/w0.25/bundle
Writes bench/results/runtime_hop_breakdown.json.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import RESULTS, machine

HANDLERS = ("_on_front", "_on_parent", "reply", "forward")  # on the node; run_batch is the executor's


def serve(bundle_dir: str, node_id: str, addresses: dict, parent: str | None, log_path: str, ready, stop) -> None:
    from cis.core.bundle import load_bundle
    from cis.runtime.factory import build_node

    bundle = load_bundle(bundle_dir)
    node = build_node(
        bundle,
        node_id,
        bundle.spec,
        addresses[node_id],
        parent,
        math.inf if parent else None,
        transfer_cap=False,
        threads=1,
    )
    log: list[tuple[str, str, float]] = []

    def traced(name: str, fn):
        def call(*a, **k):
            log.append((name, "in", time.time()))
            out = fn(*a, **k)
            log.append((name, "out", time.time()))
            return out

        return call

    for name in HANDLERS:
        setattr(node, name, traced(name, getattr(node, name)))
    node.executor.run_batch = traced("run_batch", node.executor.run_batch)
    for k, stage in node.stages.items():
        stage.run = traced(f"stage{k}", stage.run)
    node.run(install_signals=False, ready=ready.set, stop=stop.is_set)
    Path(log_path).write_text(json.dumps(log))


def steps(path: list[str], exits: dict[str, int]) -> list[str]:
    """The events of one forced request, in the order they happen. A message's send is timed from the
    entry of ``forward``/``reply``: the receiver often starts before the sender's call returns (the send
    wakes ZeroMQ's I/O thread, which may take the sender's core), so each transit step holds encoding,
    sending and the transit itself."""
    up, down = [], []
    for nid in path:
        k = exits[nid]
        up += [f"{nid}._on_front.in", f"{nid}.stage{k}.in", f"{nid}.stage{k}.out"]
        if nid != path[-1]:
            up += [f"{nid}.forward.in"]
    for nid in reversed(path):
        if nid != path[-1]:
            down += [f"{nid}._on_parent.in"]
        down += [f"{nid}.reply.in"]
    return up + down


def hot_stage_ms(bundle, x: np.ndarray, warm: int = 20) -> list[float]:
    """Each stage's median milliseconds in process, one sample at a time, after ``warm`` calls."""
    from cis.core.stages.runner import stage_runners

    runners = stage_runners(bundle, threads=1)
    hot = []
    for i in range(len(x)):
        feeds, times = {runners[0].input_names[0]: x[i : i + 1]}, []
        for r in runners:
            t = time.perf_counter()
            out = r.run(feeds)
            times.append(time.perf_counter() - t)
            feeds = {k: v for k, v in out.items() if k != "logits"}
        hot.append(times)
    return (np.median(np.array(hot[warm:]), axis=0) * 1e3).tolist()


def run_chain(bundle_path: str, sub, path: list[str], x: np.ndarray, tmp: Path) -> list[tuple[float, float]]:
    """The path's nodes, each an instrumented node process (:func:`serve`, the root first), and one request at a
    time through the leaf: each request's (send, receive) wall-clock time; each node's log in ``tmp``."""
    from cis.runtime.client import Client
    from cis.runtime.launcher import plan_addresses

    addresses = plan_addresses(sub, free_ports=True)
    ctx = mp.get_context("spawn")
    stop, procs = ctx.Event(), []
    for nid in reversed(path):  # the root first
        parent = sub.node(nid).parent
        ready = ctx.Event()
        p = ctx.Process(target=serve, args=(bundle_path, nid, addresses, addresses[parent] if parent else None,
                                            str(tmp / f"{nid}.json"), ready, stop))  # fmt: skip
        p.start()
        ready.wait(60)
        procs.append(p)
    time.sleep(1.0)  # heartbeats: the children see their parent up
    sends = []
    try:
        with Client(addresses[path[0]], timeout=30) as c:
            for i in range(len(x)):
                t = time.time()
                c.infer(x[i : i + 1])
                sends.append((t, time.time()))
    finally:
        stop.set()
        for p in procs:
            p.join(30)
    return sends


def step_gaps(logs: dict, order: list[str], sends: list[tuple[float, float]]) -> dict[str, float]:
    """Per step, the median milliseconds since the step before of the same request (the events between its send
    and its reply, in ``order``), and the client's receive."""
    gaps: dict[str, list[float]] = {k: [] for k in order + ["client.recv"]}
    for t_send, t_recv in sends:
        first: dict[str, float] = {}
        for nid, log in logs.items():
            for name, io, t in log:
                if t_send <= t <= t_recv and name != "run_batch":
                    first.setdefault(f"{nid}.{name}.{io}", t)
        last = t_send
        for k in order:
            if k in first:
                gaps[k].append(first[k] - last)
                last = first[k]
        gaps["client.recv"].append(t_recv - last)
    return {k: float(np.median(v) * 1e3) for k, v in gaps.items() if v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bundle", required=True, help="a paper-7 bundle (runtime_overhead.py caches them in WORK/w<width>/bundle)"
    )
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default=str(RESULTS / "runtime_hop_breakdown.json"))
    args = ap.parse_args()

    from cis.core.bundle import load_bundle

    bundle = load_bundle(args.bundle)
    spec = bundle.spec
    path = [n.id for n in spec.path_to_root(spec.leaves[0].id)]
    sub = spec.replace_nodes(n for n in spec.nodes if n.id in path)
    x = np.random.default_rng(0).standard_normal((args.n + 20, *bundle.stage(1).inputs[0].shape[1:])).astype(np.float32)
    hot_ms = hot_stage_ms(bundle, x)
    tmp = Path(tempfile.mkdtemp(prefix="hop_breakdown."))
    sends = run_chain(str(args.bundle), sub, path, x, tmp)
    logs = {nid: json.loads((tmp / f"{nid}.json").read_text()) for nid in path}
    step_ms = step_gaps(logs, steps(path, {nid: sub.node(nid).exit for nid in path}), sends[20:])
    total = float(np.median([b - a for a, b in sends[20:]]) * 1e3)
    stage_ms = {k: v for k, v in step_ms.items() if ".stage" in k and k.endswith(".out")}
    result = {
        "bundle": str(args.bundle),
        "requests": args.n,
        "path": path,
        "machine": machine(),
        "request_p50_ms": total,
        "in_process_stage_p50_ms": hot_ms,
        "in_process_chain_ms": float(sum(hot_ms)),
        "step_p50_ms": step_ms,
        "stages_in_nodes_ms": float(sum(stage_ms.values())),
        "everything_else_ms": float(sum(step_ms.values()) - sum(stage_ms.values())),
        "note": "step = time since the previous event of the same request; '.in' of _on_front / _on_parent is the "
        "message before it: encoding and sending (from the entry of forward / reply), the transit and the wake-up",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for k, v in step_ms.items():
        print(f"{k:28s} +{v:7.3f} ms")
    print(
        f"request p50 {total:.2f} ms; stages in the nodes {result['stages_in_nodes_ms']:.2f} ms (in process, "
        f"hot: {result['in_process_chain_ms']:.2f} ms); "
        f"everything else {result['everything_else_ms']:.2f} ms; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
