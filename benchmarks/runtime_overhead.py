"""Runtime overhead of the ZeroMQ CIS runtime against onnxruntime in one process.

(a) latency: single-sample requests forced through all three tiers of a paper-7
    CIFAR-10 ResNet-18 bundle (thresholds +inf everywhere except the root, no
    transfer cap) vs the same three stages chained in one process: p50 ratio
    (target <= 1.15) and overhead per message hop (client->device->edge->cloud);
    measured twice: back to back (the next request as soon as the last is
    answered) and paced (one request every --gap seconds, so that every process
    idles between requests as at light load; on a shared VM a core that idled
    runs the same work measurably slower for a while, which the back-to-back
    in-process chain never sees and every node of the runtime does);
(b) throughput at saturation: a node serving all stages with micro-batching,
    many requests in flight, vs in-process batched onnxruntime on the same cores
    (target >= 0.85);
(c) bytes per forwarded request with fp32, fp16 and int8 carries (the message
    on the wire: header + carry frames, and the carry alone).

The model is an *untrained* ResNet18EE (width 0.25 by default): latency and
bytes do not depend on the weights. Export needs the CIFAR-10 validation split
(for calibration), so pass --dataset cifar10:PATH.

    unzip -q /work/shared/data/cifar10-jpeg.zip -d /tmp/cifar10   # a few hundred images per class suffice
    python benchmarks/runtime_overhead.py --dataset cifar10:/tmp/cifar10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from _common import RESULTS, machine


def make_bundle(out: Path, dataset: str, width: float) -> Path:
    import torch

    from cis.spec import spec_to_dict
    from cis.topologies import make_spec
    from export import export_bundle
    from training.architectures import build_model
    from training.checkpoint import save_checkpoint
    from training.data import CIFAR10_MEAN, CIFAR10_STD
    from training.models import default_model_config

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


def p(values, q):
    return float(np.percentile(np.asarray(values), q))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--dataset",
        default="cifar10:/tmp/cifar10",
        help="CIFAR-10 folder for calibration (unzip ../shared/data/cifar10-jpeg.zip there)",
    )
    ap.add_argument("--bundle", help="reuse a bundle instead of exporting one")
    ap.add_argument("--work", default="/tmp/cis-runtime-bench")
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--n", type=int, default=150, help="sequential requests per block of (a)")
    ap.add_argument("--repeats", type=int, default=5, help="blocks of (a), each timing both sides; medians over blocks")
    ap.add_argument(
        "--gap", type=float, default=0.05, help="seconds between paced requests in (a), the light-load variant"
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run (b)")
    ap.add_argument("--out", default=str(RESULTS / "runtime_overhead.json"))
    args = ap.parse_args()

    from cis.bundle import load_bundle
    from cis.runtime import protocol as P
    from cis.runtime.client import Client
    from cis.runtime.launcher import launch
    from cis.stages import stage_runners

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bundle_dir = Path(args.bundle) if args.bundle else make_bundle(work, args.dataset, args.width)
    bundle = load_bundle(bundle_dir)
    spec = bundle.spec
    rng = np.random.default_rng(0)
    shape = tuple(bundle.stage(1).inputs[0].shape[1:])
    x = rng.standard_normal((max(args.n, 256), *shape)).astype(np.float32)
    result: dict = {"bundle": str(bundle_dir), "model": f"ResNet18EE (untrained), width {args.width:g}, CIFAR-10 input",
                    "machine": {**machine(), "python": sys.version.split()[0]}}

    # ---------------------------------------------------------------- (a) latency, in-process chain
    runners = stage_runners(bundle, threads=1)

    def chain(batch):
        feeds = {runners[0].input_names[0]: batch}
        for r in runners:
            out = r.run(feeds)
            feeds = {k: v for k, v in out.items() if k != "logits"}
        return out["logits"]

    leaf = spec.leaves[0].id
    forced = {n.id: ["--threshold", "inf"] for n in spec.nodes if n.parent is not None}
    path = [n.id for n in spec.path_to_root(leaf)]
    sub = spec.replace_nodes(n for n in spec.nodes if n.id in path)  # only the three tiers run
    hops = len(path)  # client->device, device->edge, edge->cloud
    blocks: dict[str, list[dict]] = {"back_to_back": [], "paced": []}
    cluster = launch(bundle_dir, sub, free_ports=True, extra_args=["--no-cap", "--threads", "1"], node_args=forced)
    try:
        with Client(cluster.addresses[leaf], timeout=30) as c:
            answers = []
            for i in range(20):
                chain(x[i : i + 1])
                answers.append(c.infer(x[i : i + 1]))
            for _ in range(args.repeats):  # side by side: each repeat times both, under the same machine state
                for mode, gap in (("back_to_back", 0.0), ("paced", args.gap)):
                    local = timed(lambda i: chain(x[i : i + 1]), args.n, gap)
                    remote = timed(lambda i: answers.append(c.infer(x[i : i + 1])), args.n, gap)
                    blocks[mode].append({
                        "in_process_p50_ms": p(local, 50) * 1e3, "runtime_p50_ms": p(remote, 50) * 1e3,
                        "runtime_p99_ms": p(remote, 99) * 1e3, "p50_ratio": p(remote, 50) / p(local, 50),
                        "overhead_per_hop_us": (p(remote, 50) - p(local, 50)) / hops * 1e6,
                    })
            exits = {int(r.exit[0]) for r in answers}
    finally:
        cluster.stop()
    assert exits == {3}, exits

    def median_of(rows: list[dict]) -> dict:
        return {k: float(np.median([r[k] for r in rows])) for k in rows[0]}

    result["a_latency"] = {
        "requests_per_block": args.n,
        "repeats": args.repeats,
        "message_hops": hops,
        "target_ratio_max": 1.15,
        **median_of(blocks["back_to_back"]),
        # one request every --gap seconds: every process idles between requests, as at light load
        "paced": {"gap_s": args.gap, **median_of(blocks["paced"])},
        "blocks": blocks,
    }
    print(json.dumps(result["a_latency"]), flush=True)

    # ---------------------------------------------------------------- (b) throughput at saturation
    threads = os.cpu_count() or 1
    runners_t = stage_runners(bundle, threads=threads)

    def chain_t(batch):
        feeds = {runners_t[0].input_names[0]: batch}
        for r in runners_t:
            out = r.run(feeds)
            feeds = {k: v for k, v in out.items() if k != "logits"}

    bs = 32
    chain_t(x[:bs])
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        chain_t(x[(done % 224) : (done % 224) + bs])
        done += bs
    local_tput = done / (time.perf_counter() - t0)
    root = spec.root.id
    solo = spec.replace_nodes([n for n in spec.nodes if n.id == root])
    cluster = launch(
        bundle_dir,
        solo,
        free_ports=True,
        extra_args=["--threads", str(threads), "--max-batch", str(bs), "--queue-limit", "4096"],
    )
    try:
        with Client(cluster.addresses[root], timeout=60) as c:
            c.infer_many(x[:256], window=128)
            results = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                results += c.infer_many(x[:256], batch_size=1, window=128)
            elapsed = time.perf_counter() - t0
            st = c.status()
    finally:
        cluster.stop()
    errors = sum(r.error is not None for r in results)
    remote_tput = (len(results) - errors) / elapsed
    result["b_throughput"] = {
        "in_process_samples_per_s": local_tput,
        "runtime_samples_per_s": remote_tput,
        "ratio": remote_tput / local_tput,
        "target_ratio_min": 0.85,
        "max_batch": bs,
        "onnxruntime_threads": threads,
        "requests": len(results),
        "errors": errors,
        "mean_batch": st["samples"] / max(st["batches"], 1),
    }
    print(json.dumps(result["b_throughput"]), flush=True)

    # ---------------------------------------------------------------- (c) bytes per forwarded request
    sizes = {}
    for stage in bundle.stages[:-1]:
        per = {}
        for dt in ("float32", "float16", "int8"):
            carry = {t.name: np.zeros((1, *t.shape[1:]), dt) for t in stage.carry_outputs}
            frames = P.encode(
                P.FORWARD,
                1,
                carry,
                stage=stage.index + 1,
                deadline=time.time(),
                route=["device0", "edge0"],
                sender="edge0",
            )
            per[{"float32": "fp32", "float16": "fp16", "int8": "int8"}[dt]] = {
                "carry_bytes": int(sum(a.nbytes for a in carry.values())),
                "message_bytes": int(sum(len(memoryview(f).cast("B")) for f in frames)),
            }
        sizes[f"after_exit_{stage.exit}"] = per
    result["c_bytes_per_forwarded_request"] = sizes
    print(json.dumps(sizes), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
