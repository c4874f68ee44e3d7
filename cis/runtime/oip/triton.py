"""What Triton's tools read about a model beside the Open Inference Protocol, in Triton's own forms: its
configuration (``GET /v2/models/{name}/config``, gRPC ``ModelConfig``: Triton's model_config.proto) and its
statistics (``GET /v2/models/{name}/stats``, gRPC ``ModelStatistics``: grpc_service.proto), from a node's
model and counters. Plain dicts with the protobuf field names; each door writes them its way (docs/runtime.md,
*Open Inference Protocol*).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cis.runtime.oip.codec import PLATFORM, Model

# the protocol's datatype -> Triton's DataType (model_config.proto)
DATA_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING",
}  # fmt: skip


def config(model: Model, node: Any, versions: Sequence[str]) -> dict:
    """Triton's ModelConfig of the model a node serves: its inputs and outputs without the batch dimension (a
    per-sample output is ``dims [1]`` reshaped to ``[]``, as Triton writes a scalar per sample), and
    ``max_batch_size`` the most samples one request may carry (the node's queue limit)."""
    inputs = [
        {"name": t.name, "data_type": DATA_TYPES[t.datatype], "format": "FORMAT_NONE", "dims": list(t.shape[1:])}
        for t in model.inputs
    ]
    outputs = []
    for t in model.outputs:
        out: dict[str, Any] = {"name": t.name, "data_type": DATA_TYPES[t.datatype], "dims": list(t.shape[1:]) or [1]}
        if len(t.shape) == 1:
            out["reshape"] = {"shape": []}
        outputs.append(out)
    return {
        "name": model.name,
        "platform": PLATFORM,
        "backend": PLATFORM,
        "version_policy": {"latest": {"num_versions": len(versions)}},
        "max_batch_size": int(node.cfg.queue_limit),
        "input": inputs,
        "output": outputs,
    }


def _duration(count: int, seconds: float) -> dict:
    return {"count": int(count), "ns": int(seconds * 1e9)}


def statistics(model: Model, node: Any, version: str) -> dict:
    """Triton's ModelStatistics of a node: every request it took, from any door or ZeroMQ (the model is the
    node's). ``success``/``fail``: its answered requests and errors (``ns``: their latency, arrival to answer);
    ``queue`` and ``compute_infer``: its requests' queue time and its micro-batches' compute time;
    ``inference_count``: samples, ``execution_count``: micro-batches. The times come from the histograms the
    node keeps (installed with its doors, or its metrics server: :func:`cis.runtime.metrics_http.node_timings`);
    a node without them reports 0 ns."""
    ok = sum(n for (kind, outcome), n in node.outcomes.items() if kind in ("infer", "forward") and outcome == "ok")
    failed = sum(n for (kind, outcome), n in node.outcomes.items() if kind in ("infer", "forward") and outcome != "ok")
    latency = getattr(node.observe_latency, "__self__", None)  # the Buckets whose observe the node calls
    timings = node.executor.timings
    none = _duration(0, 0.0)
    queue = compute = none
    last = 0
    if timings is not None:
        queue = _duration(sum(timings.queue.counts), timings.queue.sum)
        compute = _duration(sum(timings.compute.counts), timings.compute.sum)
        last = int(timings.last * 1000)
    stats = {
        "success": _duration(ok, getattr(latency, "sum", 0.0)),
        "fail": _duration(failed, 0.0),
        "queue": queue,
        "compute_input": none,
        "compute_infer": compute,
        "compute_output": none,
        "cache_hit": none,
        "cache_miss": none,
    }
    model_stats = {
        "name": model.name,
        "version": version,
        "last_inference": last,
        "inference_count": int(node.counters["samples"]),
        "execution_count": int(node.counters["batches"]),
        "inference_stats": stats,
        "batch_stats": [],
    }
    return {"model_stats": [model_stats]}
