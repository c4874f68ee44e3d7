"""Runtime overhead of the ZeroMQ CIS runtime against onnxruntime in one process and a bare pyzmq chain.

For each model width (``--widths``, default 0.25 and 1: an *untrained* ResNet18EE
paper-7 CIFAR-10 bundle cut into three ONNX stages; latency and bytes do not
depend on the weights), in one run on one machine:

(a) latency: single-sample requests forced through all three tiers (device ->
    edge -> cloud; ``--threshold inf --no-cap`` below the root), three ways side
    by side in every block: the three stages chained in one process (onnxruntime,
    one thread); a **bare 3-process pyzmq chain** of the same stage files (DEALER
    -> ROUTER per hop, raw frames, no header, no validation, no policy: the
    transport floor); and ``cis serve`` (every node its own process, as the
    harness's ``cluster`` starts them: the launcher, in this process). Per-hop
    overhead = (p50 - in-process p50) / 3 for the raw chain and for cis, and
    their ratio (targets at width 0.25: at most
    1.5, goal 1.2), and cis p50 / in-process p50 (target at width 1: at most
    1.15). Measured back to back (the next request as soon as the last is
    answered) and paced (one request every ``--gap`` s, so every process idles
    between requests as at light load). Medians over ``--repeats`` blocks.
(b) batched throughput at saturation: one node serving all stages with
    micro-batching (``--max-batch 32``, one-sample requests, 128 in flight) vs the
    same three stages run batched (32) in one process, both with onnxruntime on
    every core (target at least 0.95), medians over the same number of blocks;
(c) bytes per forwarded request with fp32, fp16 and int8 carries.

``--against DIR`` adds a fourth side to every block of (a): ``cis serve`` run from another checkout of the
project (``DIR``, e.g. ``git archive BASE | tar -x -C DIR``; its nodes import ``cis`` from there: the harness's
``cluster`` with DIR first on their ``PYTHONPATH`` and ``PYTHONSAFEPATH`` set, Python 3.11+), timed on the
same requests with the same client, request by request in turn with this code's (one of each, in alternating
order), so that whatever else the machine does falls on both alike. It reports the per-hop overhead of both
and their ratio (``hop_vs_base``: this code's per hop / the base's), medians over blocks: what a change costs
per hop, measured side by side; the CPU time the node processes of each used per request; and a leaf's own
work on one forwarded request in both, in process (decode, admission, micro-batch, decision, the forward and its
answer encoded and decoded, the reply, with stages that cost nothing: the minimum over short repeats, in processes
of each checkout taken in turn, ``--codec-rounds`` times), which a loaded machine disturbs far less than a latency.
``--latency-only`` skips (b) and (c).

Export needs the CIFAR-10 validation split (for calibration); the bundles are
cached in ``--work``/w<width>/bundle.

    python -m bench.runtime_overhead                 # both widths, 5 blocks (about 10 minutes)
    python -m bench.runtime_overhead --quick         # smoke run
    python -m bench.runtime_overhead --spin          # cis nodes busy-poll (for machines with a core per node)
    python -m bench.runtime_overhead --widths 0.25 --against /tmp/base --latency-only --out runtime_overhead_ab

Writes bench/results/runtime_overhead.json and .md (``--quick``: runtime_overhead-quick; ``--out NAME``: NAME).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import REPO, cluster, ensure_cifar, machine, write_results

HOPS = 3  # client -> device -> edge -> cloud


def make_bundle(out: Path, dataset: str, width: float) -> Path:
    import torch

    from cis.core.spec import spec_to_dict
    from cis.core.topologies import make_spec
    from cis.exporter import export_bundle
    from cis.training.architectures import build_model
    from cis.training.checkpoint import save_checkpoint
    from cis.training.data.loading import CIFAR10_MEAN, CIFAR10_STD
    from cis.training.models.cnns import default_model_config

    torch.manual_seed(0)
    model = build_model(default_model_config("cifar10", width=width)).eval()
    meta = {
        "classes": [str(i) for i in range(10)],
        "normalisation": {"mean": list(CIFAR10_MEAN), "std": list(CIFAR10_STD)},
        "dataset": dataset,
        "seed": 0,
        "val_size": 200,
        "spec": spec_to_dict(make_spec("paper-7", "60-30-10")),
        "note": "untrained ResNet18EE for runtime benchmarks",
    }
    save_checkpoint(out / "run", model, meta)
    report = export_bundle(out / "run", out / "bundle", latency_repeats=2)
    (out / "export_report.json").write_text(json.dumps(report, indent=2, default=str))
    return out / "bundle"


# ---------------------------------------------------------------- the bare pyzmq chain (the transport floor)


def raw_node(model: str, inputs: list, outputs: list, carry: list, bind: str, nxt: str | None, ready) -> None:
    """One process of the bare chain: a ROUTER in, a DEALER to the next stage; frames are [id, tensors...]
    in the stage's input order, no header and no checks; the last stage answers [id, class]."""
    import onnxruntime as ort
    import zmq

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = 1, 1, 3
    sess = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.bind(bind)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    up = None
    if nxt:
        up = ctx.socket(zmq.DEALER)
        up.connect(nxt)
        poller.register(up, zmq.POLLIN)
    waiting: dict[bytes, bytes] = {}
    ready.set()
    while True:
        for sock, _ in poller.poll():
            if sock is front:
                ident, rid, *frames = front.recv_multipart(copy=False)
                feeds = {n: np.frombuffer(f, dt).reshape(-1, *shape) for (n, dt, shape), f in zip(inputs, frames)}
                out = dict(zip(outputs, sess.run(outputs, feeds)))
                if up is None:
                    front.send_multipart([ident, rid, out["logits"].argmax(-1)], copy=False)
                else:
                    waiting[rid.bytes] = ident
                    up.send_multipart([rid, *(out[n] for n in carry)], copy=False)
            else:
                rid, *rest = up.recv_multipart(copy=False)
                front.send_multipart([waiting.pop(rid.bytes), rid, *rest], copy=False)


class RawChain:
    """The stages of ``bundle`` as a bare chain of processes at ``addresses`` (stage 1 first)."""

    def __init__(self, bundle, addresses: list[str]):
        import zmq

        ctx, k, self.procs = mp.get_context("spawn"), bundle.num_exits, []
        for i in reversed(range(k)):  # the last stage first: each connects to a bound next stage
            st = bundle.stage(i + 1)
            ready = ctx.Event()
            proc = ctx.Process(
                target=raw_node,
                daemon=True,
                args=(
                    str(bundle.path(st.file)),
                    [(t.name, t.dtype, tuple(t.shape[1:])) for t in st.inputs],
                    [t.name for t in st.outputs],
                    [t.name for t in bundle.stage(i + 2).inputs] if i + 1 < k else [],
                    addresses[i],
                    addresses[i + 1] if i + 1 < k else None,
                    ready,
                ),
            )
            proc.start()
            if not ready.wait(120):
                raise RuntimeError(f"raw chain stage {i + 1} did not start")
            self.procs.append(proc)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(addresses[0])
        self.rid = 0

    def infer(self, x: np.ndarray) -> np.ndarray:
        self.rid += 1
        self.sock.send_multipart([self.rid.to_bytes(8, "little"), x], copy=False)
        _, cls = self.sock.recv_multipart()
        return np.frombuffer(cls, np.int64)

    def close(self) -> None:
        self.sock.close(0)
        for proc in self.procs:
            proc.terminate()
            proc.join(5)


# ---------------------------------------------------------------- measuring


def timed(fn, n: int, gap: float) -> list[float]:
    """Wall time of fn(i) for i < n, starting one call every ``gap`` seconds (0: back to back)."""
    out, start = [], time.perf_counter()
    for i in range(n):
        if gap:
            time.sleep(max(0.0, start + i * gap - time.perf_counter()))
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def cpu_seconds(cluster) -> float:
    """CPU seconds (user + system, every thread) the cluster's node processes have used so far: what a request
    costs them, which other work on the machine disturbs far less than a latency."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for proc in cluster.procs.values():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def timed_pair(fa, fb, n: int, gap: float) -> tuple[list[float], list[float]]:
    """Wall times of fa(i) and fb(i) for i < n, called in turn (a then b for even i, b then a for odd), one call
    every ``gap`` seconds (0: back to back)."""
    out: dict = {fa: [], fb: []}
    start, k = time.perf_counter(), 0
    for i in range(n):
        for fn in (fa, fb) if i % 2 == 0 else (fb, fa):
            if gap:
                time.sleep(max(0.0, start + k * gap - time.perf_counter()))
            t = time.perf_counter()
            fn(i)
            out[fn].append(time.perf_counter() - t)
            k += 1
    return out[fa], out[fb]


def p50(values) -> float:
    return float(np.median(np.asarray(values)))


def median_of(rows: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in rows])) for k in rows[0]}


def chain_of(runners):
    def chain(batch):
        feeds = {runners[0].input_names[0]: batch}
        for r in runners:
            out = r.run(feeds)
            feeds = {k: v for k, v in out.items() if k != "logits"}
        return out["logits"]

    return chain


def tree_env(tree: str | Path) -> dict[str, str]:
    """The environment of processes that import ``cis`` from the checkout ``tree`` and from nowhere else:
    ``PYTHONPATH`` names it, and ``PYTHONSAFEPATH`` (Python 3.11+) keeps ``python -m`` (how the launcher starts a
    node) from putting its working directory first, which is this checkout when the benchmark runs from its root:
    without it the base's nodes would run this code. Checked before any node starts."""
    tree = Path(tree).resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    where = subprocess.run([sys.executable, "-c", "import cis; print(cis.__file__)"], env=env, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    if not where.startswith(str(tree) + os.sep):
        raise SystemExit(f"--against {tree}: its processes import cis from {where or 'nowhere'}; expected a checkout "
                         "of the project there (and Python 3.11+ for PYTHONSAFEPATH)")  # fmt: skip
    return env


def latency(bundle_dir: Path, x: np.ndarray, args, node_args: list[str]) -> dict:
    """(a): in-process, raw chain and cis side by side in every block (with ``--against``, the base's cis too)."""
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import stage_runners
    from cis.runtime.launcher import plan_addresses

    bundle = load_bundle(bundle_dir)
    spec = bundle.spec
    leaf = spec.leaves[0].id
    path = [n.id for n in spec.path_to_root(leaf)]
    sub = spec.replace_nodes(n for n in spec.nodes if n.id in path)  # only the three tiers run
    options = {"args": ["--no-cap", "--threads", "1", *node_args],
               "node_args": {n.id: ["--threshold", "inf"] for n in sub.nodes if n.parent is not None}}  # fmt: skip
    base_env = tree_env(args.against) if args.against else None
    chain = chain_of(stage_runners(bundle, threads=1))
    raw = RawChain(bundle, [plan_addresses(sub, free_ports=True)[n] for n in path])
    try:
        with contextlib.ExitStack() as stack:
            clusters = {"cis": stack.enter_context(cluster(bundle_dir, sub, **options))}
            if base_env is not None:  # the same tree from another checkout: the harness's cluster (the launcher, in
                # this process) starts its nodes with that checkout first on their path (tree_env)
                clusters["base"] = stack.enter_context(cluster(bundle_dir, sub, env=base_env, **options))
            blocks, exits, same, cpu = latency_blocks(clusters, leaf, chain, raw, x, args)
    finally:
        raw.close()
    if exits != {3} or not same:
        raise RuntimeError(f"forced requests were served at exits {exits}; classes agree: {same}")
    return {
        "requests_per_block": args.n,
        "repeats": args.repeats,
        "message_hops": HOPS,
        **cpu,
        **median_of(blocks["back_to_back"]),
        "paced": {"gap_s": args.gap, **median_of(blocks["paced"])},
        "blocks": blocks,
    }


def latency_blocks(clusters: dict, leaf: str, chain, raw, x: np.ndarray, args) -> tuple[dict, set, bool, dict]:
    """Every block times every side (in process, the raw chain, cis at ``clusters["cis"]``'s leaf and, given,
    the base's at ``clusters["base"]``'s, request by request in turn with this code's) under the same machine
    state, back to back and paced: (blocks, the exits that served the cis requests, whether every path gave the
    in-process class, each cluster's node CPU time per request)."""
    from cis.runtime.client import Client

    def one(i: int) -> np.ndarray:  # sample i, round the inputs (--n may exceed them)
        return x[i % len(x) : i % len(x) + 1]

    blocks: dict[str, list[dict]] = {"back_to_back": [], "paced": []}
    with contextlib.ExitStack() as stack:
        clients = {name: stack.enter_context(Client(c.addresses[leaf], timeout=30)) for name, c in clusters.items()}
        answers, same = warm_up(clients, chain, raw, x)
        ask = {name: (lambda i, c=c: answers.append(c.infer(one(i)))) for name, c in clients.items()}
        sides = {"in_process": lambda i: chain(one(i)), "raw_chain": lambda i: raw.infer(one(i))}
        cpu0 = {name: cpu_seconds(c) for name, c in clusters.items()}
        for _ in range(args.repeats):
            for mode, gap in (("back_to_back", 0.0), ("paced", args.gap)):
                t = {name: timed(fn, args.n, gap) for name, fn in sides.items()}
                if "base" in ask:  # this code and the base request by request in turn
                    t["cis"], t["base"] = timed_pair(ask["cis"], ask["base"], args.n, gap)
                else:
                    t["cis"] = timed(ask["cis"], args.n, gap)
                blocks[mode].append(block_figures(t))
        requests = 2 * args.n * args.repeats  # per cluster, both modes
        cpu = {f"{name}_cpu_per_request_us": (cpu_seconds(c) - cpu0[name]) / requests * 1e6
               for name, c in clusters.items()}  # fmt: skip
    return blocks, {int(r.exit[0]) for r in answers}, all(same), cpu


def warm_up(clients: dict, chain, raw, x: np.ndarray) -> tuple[list, list[bool]]:
    """20 requests down every path: (the cis answers, whether each path gave the in-process class)."""
    answers, same = [], []
    for i in range(20):
        want = int(chain(x[i : i + 1]).argmax())
        same.append(int(raw.infer(x[i : i + 1])[0]) == want)
        for c in clients.values():
            answers.append(c.infer(x[i : i + 1]))
            same.append(int(answers[-1].cls[0]) == want)
    return answers, same


def block_figures(t: dict[str, list[float]]) -> dict:
    """One block's p50s, per-hop overheads and ratios (with a base side: this code's against the base's)."""
    inp, rawp, cisp = p50(t["in_process"]), p50(t["raw_chain"]), p50(t["cis"])
    raw_hop, cis_hop = (rawp - inp) / HOPS, (cisp - inp) / HOPS
    out = {
        "in_process_p50_ms": inp * 1e3,
        "raw_chain_p50_ms": rawp * 1e3,
        "cis_p50_ms": cisp * 1e3,
        "cis_p99_ms": float(np.percentile(t["cis"], 99)) * 1e3,
        "raw_chain_per_hop_us": raw_hop * 1e6,
        "cis_per_hop_us": cis_hop * 1e6,
        "per_hop_ratio": cis_hop / raw_hop,
        "p50_ratio": cisp / inp,
    }
    if "base" in t:
        basep = p50(t["base"])
        base_hop = (basep - inp) / HOPS
        paired = float(np.median(np.subtract(t["cis"], t["base"])))  # request by request: the load falls on both
        out.update(
            base_p50_ms=basep * 1e3,
            base_per_hop_us=base_hop * 1e6,
            hop_vs_base=cis_hop / base_hop,
            p50_vs_base=cisp / basep,
            paired_per_hop_us=paired / HOPS * 1e6,
        )
    return out


CODEC_PER_HOP = r"""
import time, timeit
from collections import namedtuple
import numpy as np
from cis.runtime import protocol as P
from cis.runtime.executor import Executor
from cis.runtime.node_config import NodeConfig
T = namedtuple("T", "name shape dtype")
class S:  # a stage that costs nothing: what is left is the node's own work
    inputs = (T("input", (None, 4), "float32"),)
    outputs = (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32"))
    def run(self, f):
        return {"logits": f["input"][:, :3] * 10, "features": f["input"]}
class Out:  # what the node's outbox sends, encoded as the node encodes it
    parent_up = True
    def reply(self, req):
        ident = {"bundle": req.version.id, "v": req.v} if hasattr(req, "version") else {}
        P.result_frames(req.req_id, req.n, req.cls, req.conf, req.exit, req.flags, req.served_by, "leaf", **ident)
    def error(self, req, code, message):
        raise RuntimeError(message)
    def forward(self, pending, carry):
        ident = pending.version.wire if hasattr(pending, "version") else {}
        P.encode(P.FORWARD, 1, carry, stage=2, deadline=2e9, route=["leaf"], sender="leaf", **ident)
        self.pending = pending
        return True
ident = {"bundle_sha256": "a" * 64} if P.VERSION >= 2 else {}
ex = Executor(NodeConfig("leaf", 1, parent="tcp://x", threshold=0.9, **ident), {1: S()}, Out())
infer = [bytes(P._buffer(f)) for f in P.encode(P.INFER, 5, {"input": np.array([[0.1, 0, 0, 0]], np.float32)})]
four = (np.array([2]), np.array([1.0], np.float32), np.array([2], np.int32), np.zeros(1, np.uint8))
answer = [bytes(P._buffer(f)) for f in P.result_frames(1, 1, *four, ["root"], "root",
                                                        **({"bundle": "a" * 16} if P.VERSION >= 2 else {}))]
def hop():  # a leaf's work on one forwarded request: decode, admit, batch, decide, forward; the answer back
    ex.admit([b"c"], P.decode(infer, 1 << 26, kinds=P.REQUEST_KINDS), time.monotonic())
    ex.run_batch()
    ex.from_parent(ex.out.pending, P.decode(answer, 1 << 26, kinds=(P.RESULT, P.ERROR, P.PONG)))
print(min(timeit.repeat(hop, number=10, repeat=3000)) / 10)  # short repeats: the minimum is the work itself
"""


def codec_per_hop(against: str, rounds: int) -> dict:
    """Seconds of a leaf's own work on one forwarded request (decode, admission, micro-batch, decision, the
    forward and its answer encoded and decoded, the reply; stages that cost nothing), this checkout's and
    ``against``'s, each a process of its own, taken in turn ``rounds`` times; medians."""
    envs = {"this": tree_env(REPO), "base": tree_env(against)}  # each imports its own checkout's cis
    this, base = [], []
    for i in range(rounds):
        for which in ("this", "base") if i % 2 == 0 else ("base", "this"):
            out = subprocess.run([sys.executable, "-c", CODEC_PER_HOP], capture_output=True, text=True, check=True,
                                 env=envs[which], cwd="/")  # fmt: skip
            (this if which == "this" else base).append(float(out.stdout))
    return {"rounds": rounds, "this_us": float(np.median(this)) * 1e6, "base_us": float(np.median(base)) * 1e6,
            "this_all_us": [v * 1e6 for v in this], "base_all_us": [v * 1e6 for v in base]}  # fmt: skip


def throughput(bundle_dir: Path, x: np.ndarray, args, node_args: list[str]) -> dict:
    """(b): a node serving all stages with micro-batching vs batched onnxruntime in one process."""
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import stage_runners
    from cis.runtime.client import Client

    bundle = load_bundle(bundle_dir)
    spec = bundle.spec
    threads, bs = os.cpu_count() or 1, 32
    chain = chain_of(stage_runners(bundle, threads=threads))
    root = spec.root.id
    solo = spec.replace_nodes([n for n in spec.nodes if n.id == root])
    extra = ["--threads", str(threads), "--max-batch", str(bs), "--queue-limit", "4096", *node_args]
    blocks = []
    with cluster(bundle_dir, solo, args=extra) as running, Client(running.addresses[root], timeout=60) as c:
        c.infer_many(x[:256], window=128)
        chain(x[:bs])
        for _ in range(args.repeats):
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                chain(x[done % 224 : done % 224 + bs])
                done += bs
            local = done / (time.perf_counter() - t0)
            before = c.status()
            results, t0 = [], time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                results += c.infer_many(x[:256], batch_size=1, window=128)
            elapsed = time.perf_counter() - t0
            after = c.status()
            errors = sum(r.error is not None for r in results)
            remote = (len(results) - errors) / elapsed
            blocks.append(
                {
                    "in_process_samples_per_s": local,
                    "cis_samples_per_s": remote,
                    "ratio": remote / local,
                    "errors": errors,
                    "mean_batch": (after["samples"] - before["samples"])
                    / max(1, after["batches"] - before["batches"]),
                }
            )
    return {
        "max_batch": bs,
        "onnxruntime_threads": threads,
        "seconds": args.seconds,
        **median_of(blocks),
        "blocks": blocks,
    }


def carry_bytes(bundle_dir: Path) -> dict:
    """(c): bytes on the wire per forwarded request, by carry dtype."""
    from cis.core.bundle import load_bundle
    from cis.runtime import protocol as P

    bundle = load_bundle(bundle_dir)
    sizes = {}
    for stage in bundle.stages[:-1]:
        per = {}
        for dt, name in (("float32", "fp32"), ("float16", "fp16"), ("int8", "int8")):
            carry = {t.name: np.zeros((1, *t.shape[1:]), dt) for t in stage.carry_outputs}
            frames = P.encode(
                P.FORWARD, 1, carry, stage=stage.index + 1, deadline=time.time(), route=["device0"], sender="device0"
            )
            per[name] = {
                "carry_bytes": int(sum(a.nbytes for a in carry.values())),
                "message_bytes": int(sum(len(memoryview(f).cast("B")) for f in frames)),
            }
        sizes[f"after_exit_{stage.exit}"] = per
    return sizes


# ---------------------------------------------------------------- report


def markdown(result: dict) -> list[str]:
    m = result["machine"]
    lines = [
        "# Runtime overhead: cis serve vs a bare pyzmq chain vs one process",
        "",
        f"{'QUICK SMOKE RUN, not a result. ' if result.get('quick') else ''}"
        f"{result['model']}; {m['cpus']} CPUs, load average {', '.join(f'{v:.1f}' for v in m['load_avg'])} "
        f"at the start{' (SPIN: nodes busy-poll)' if result['spin'] else ''}. Medians over "
        f"{result['repeats']} blocks; each block times every path one after the other. Command: "
        f"`{result['command']}`.",
        "",
        "## (a) One sample forced through device -> edge -> cloud",
        "",
        "| width | mode | in-process p50 | raw chain p50 | cis serve p50 | raw per hop | cis per hop | "
        "per-hop ratio | cis / in-process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w, r in result["widths"].items():
        for mode, a in (("back to back", r["a_latency"]), ("paced", r["a_latency"]["paced"])):
            lines.append(
                f"| {w} | {mode} | {a['in_process_p50_ms']:.2f} ms | {a['raw_chain_p50_ms']:.2f} ms | "
                f"{a['cis_p50_ms']:.2f} ms | {a['raw_chain_per_hop_us']:.0f} us | {a['cis_per_hop_us']:.0f} us | "
                f"{a['per_hop_ratio']:.2f} | {a['p50_ratio']:.2f} |"
            )
    lines += [
        "",
        "Per hop = (p50 - in-process p50) / 3. Targets: per-hop ratio at most 1.5 at width 0.25 (goal 1.2); "
        "cis / in-process at most 1.15 at width 1.",
    ]
    lines += against_lines(result)
    if any("b_throughput" in r for r in result["widths"].values()):
        lines += throughput_lines(result)
    lines += ["", "## Targets", ""]
    for name, t in result["targets"].items():
        lines.append(f"- {name}: {t['value']:.2f} ({t['rule']}) {'met' if t['met'] else 'MISSED'}")
    return lines


def against_lines(result: dict) -> list[str]:
    """(a) side by side with another checkout (``--against``): per hop of both and their ratio, a row per width
    and mode; then each width's blocks, CPU time and a leaf's own work."""
    if not result.get("against"):
        return []
    lines = [
        "",
        f"### Side by side with `{result['against']}`",
        "",
        "| width | mode | base p50 | this p50 | base per hop | this per hop | this / base per hop (median of "
        "blocks) | this / base p50 | this - base per hop, paired |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w, r in result["widths"].items():
        for mode, a in (("back to back", r["a_latency"]), ("paced", r["a_latency"]["paced"])):
            lines.append(
                f"| {w} | {mode} | {a['base_p50_ms']:.3f} ms | {a['cis_p50_ms']:.3f} ms | "
                f"{a['base_per_hop_us']:.1f} us | {a['cis_per_hop_us']:.1f} us | {a['hop_vs_base']:.3f} | "
                f"{a['p50_vs_base']:.3f} | {a['paired_per_hop_us']:+.1f} us |"
            )
    for w, r in result["widths"].items():
        lines += ["", *against_width_lines(w, r)]
    return lines


def against_width_lines(w: str, r: dict) -> list[str]:
    """One width's side by side beyond the table: per block, CPU time per request, a leaf's own work."""
    a = r["a_latency"]
    blocks = a["blocks"]["back_to_back"]
    lines = [
        f"Width {w}, back to back, per block: this / base per hop "
        + ", ".join(f"{b['hop_vs_base']:.3f}" for b in blocks)
        + "; this - base per hop, paired: "
        + ", ".join(f"{b['paired_per_hop_us']:+.1f}" for b in blocks)
        + " us. *Paired*: the median over requests of (this request's latency - the base's next to it) / 3."
    ]
    if "base_cpu_per_request_us" in a:
        b_cpu, t_cpu = a["base_cpu_per_request_us"], a["cis_cpu_per_request_us"]
        lines.append(
            f"CPU time of the three node processes per request (every request of both modes): base {b_cpu:.0f} us, "
            f"this {t_cpu:.0f} us: {t_cpu / b_cpu:.3f}."
        )
    codec = r.get("a_codec_per_hop")
    if codec:
        extra = codec["this_us"] - codec["base_us"]
        lines.append(
            f"A leaf's own work on one forwarded request, in process (decode, admission, batch, decision, forward, "
            f"the answer, the reply; stages that cost nothing; median of {codec['rounds']} processes each, the "
            f"minimum over short repeats in each): base {codec['base_us']:.1f} us, "
            f"this {codec['this_us']:.1f} us: {extra:+.1f} us, "
            f"{100 * extra / a['base_per_hop_us']:+.2f} % of the base's per-hop overhead back to back."
        )
    return lines


def throughput_lines(result: dict) -> list[str]:
    lines = [
        "",
        "## (b) Batched throughput (one node, all stages, micro-batches of 32, one-sample requests)",
        "",
        "| width | in-process (batched) | cis serve | ratio | mean batch |",
        "|---|---|---|---|---|",
    ]
    for w, r in result["widths"].items():
        b = r["b_throughput"]
        lines.append(
            f"| {w} | {b['in_process_samples_per_s']:.0f} /s | {b['cis_samples_per_s']:.0f} /s | "
            f"{b['ratio']:.2f} | {b['mean_batch']:.1f} |"
        )
    return lines + ["", "Target: at least 0.95 at both widths."]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/tmp/cifar10", help="CIFAR-10 folder for calibration (unzipped when missing)")
    ap.add_argument("--work", default="/tmp/cis-runtime-bench", help="bundles are cached in WORK/w<width>/bundle")
    ap.add_argument("--widths", default="0.25,1", help="comma-separated model widths (default 0.25,1)")
    ap.add_argument("--n", type=int, default=150, help="sequential requests per path and block in (a)")
    ap.add_argument("--repeats", type=int, default=5, help="blocks; results are medians over blocks")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between paced requests in (a)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per path and block of (b)")
    ap.add_argument("--spin", action="store_true", help="run the cis nodes with --spin (busy-poll)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 40 requests, 2 blocks, 1 s throughput (result runtime_overhead-quick)")
    ap.add_argument("--out", help="result name in bench/results (default runtime_overhead, runtime_overhead-quick "
                    "with --quick)")  # fmt: skip
    ap.add_argument("--against", metavar="DIR", help="(a) also times cis serve from the checkout in DIR, side by side")
    ap.add_argument("--latency-only", action="store_true", help="(a) only: skip the throughput and bytes parts")
    ap.add_argument("--codec-rounds", type=int, default=10, help="with --against: processes of each in turn")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats, args.gap, args.seconds = 40, 2, 0.02, 1.0
    args.out = args.out or ("runtime_overhead-quick" if args.quick else "runtime_overhead")
    return args


def one_width(w: float, args: argparse.Namespace, node_args: list[str]) -> dict:
    """(a), with ``--against`` the leaf's own work in both, and unless ``--latency-only`` (b) and (c), at width
    ``w`` (its bundle made when not cached)."""
    out = Path(args.work) / f"w{w:g}"
    bundle_dir = out / "bundle"
    if not (bundle_dir / "manifest.json").is_file():
        make_bundle(out, f"cifar10:{ensure_cifar(Path(args.data))}", w)
    x = np.random.default_rng(0).standard_normal((256, 3, 32, 32)).astype(np.float32)
    r: dict = {"bundle": str(bundle_dir)}
    r["a_latency"] = latency(bundle_dir, x, args, node_args)
    if args.against:
        r["a_codec_per_hop"] = codec_per_hop(args.against, args.codec_rounds)
    print(f"width {w:g} (a): {json.dumps({k: v for k, v in r['a_latency'].items() if k != 'blocks'})}", flush=True)
    if not args.latency_only:
        r["b_throughput"] = throughput(bundle_dir, x, args, node_args)
        print(f"width {w:g} (b): {json.dumps({k: v for k, v in r['b_throughput'].items() if k != 'blocks'})}",
              flush=True)  # fmt: skip
        r["c_bytes_per_forwarded_request"] = carry_bytes(bundle_dir)
    return r


def targets_of(ws: dict, against: str | None) -> dict:
    """Each target's value, rule and whether it was met, for the widths measured."""
    targets = {}
    if "0.25" in ws:
        v = ws["0.25"]["a_latency"]["per_hop_ratio"]
        targets["per-hop ratio cis / raw chain, width 0.25"] = {"value": v, "rule": "<= 1.5, goal 1.2", "met": v <= 1.5}
    if "1" in ws:
        v = ws["1"]["a_latency"]["p50_ratio"]
        targets["p50 cis / in-process, width 1"] = {"value": v, "rule": "<= 1.15", "met": v <= 1.15}
    for w, r in ws.items():
        if "b_throughput" in r:
            v = r["b_throughput"]["ratio"]
            targets[f"batched throughput cis / in-process, width {w}"] = {"value": v, "rule": ">= 0.95",
                                                                           "met": v >= 0.95}  # fmt: skip
    for w, r in ws.items():
        if "hop_vs_base" in r["a_latency"]:
            v = r["a_latency"]["hop_vs_base"]
            targets[f"per hop, this code / {against}, width {w}"] = {"value": v, "rule": "<= 1.02", "met": v <= 1.02}
    return targets


def main() -> int:
    args = parse_args()
    node_args = ["--spin"] if args.spin else []
    widths = [float(w) for w in args.widths.split(",") if w.strip()]
    result: dict = {
        "model": "ResNet18EE (untrained), paper-7 three stages, CIFAR-10 input (3x32x32), batch 1",
        "machine": {**machine(), "python": sys.version.split()[0]},
        "command": " ".join(["python", "-m", "bench.runtime_overhead", *sys.argv[1:]]),
        "repeats": args.repeats,
        "quick": args.quick,
        "spin": args.spin,
        "against": args.against,
        "widths": {f"{w:g}": one_width(w, args, node_args) for w in widths},
    }
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["targets"] = targets_of(result["widths"], args.against)
    write_results(args.out, result, markdown(result))
    print("\n".join(markdown(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
