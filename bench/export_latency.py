"""Per-stage latency: onnxruntime (CPU) vs torch eager, for the paper's ResNet-18.

ResNet-18 with the CIFAR-10 exits (after residual blocks 1, 4, 8) at full width
and at width 0.25 (the width of the Table 1 benchmark), random weights (latency
does not depend on them). Each stage is exported exactly as ``cis export``
does (cis.exporter.onnx_export.export_stage) and timed at batch 1 and 32: median
seconds per call over ``--repeats`` runs after warm-up, same thread count for
both runtimes. Writes bench/results/export_latency.json.

    python -m bench.export_latency [--repeats 20] [--threads N] [--widths 1.0 0.25]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from bench.harness import RESULTS, machine
from cis.core.bundle import StageInfo
from cis.core.stages.runner import StageRunner
from cis.exporter.onnx_export import export_stage, resolve_exporter, tensor_infos
from cis.training.architectures import build_model
from cis.training.models.cnns import default_model_config
from cis.training.models.stage_plan import describe_stages, run_plan

OUT = RESULTS / "export_latency.json"


def interleaved_medians(a, b, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median seconds of ``a`` and ``b``, timed alternately so that both see the same machine load."""
    for _ in range(warmup):
        a(), b()
    ta, tb = [], []
    for _ in range(max(1, repeats)):
        for fn, times in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(ta)), float(np.median(tb))


def _run_torch(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.inference_mode():
        module(*inputs)


def bench_width(width: float, batches: list[int], repeats: int, threads: int, exporter: str) -> dict:
    model = build_model(default_model_config("cifar10", width=width)).eval()
    plan = describe_stages(model)
    example = plan.example_inputs(2, torch.Generator().manual_seed(0))
    torch_outs = run_plan(plan, example)
    carry = dict(example)
    stages = {}
    for st, touts in zip(plan.stages, torch_outs):
        args = tuple(carry[n] for n in st.inputs)
        t0 = time.perf_counter()
        m = export_stage(st, args, 17, exporter)
        export_s = time.perf_counter() - t0
        info = StageInfo(st.index, st.exit, "-", tensor_infos(m.graph.input), tensor_infos(m.graph.output), 0, 0)
        runner = StageRunner.from_model(m.SerializeToString(), info, threads=threads)
        per_batch = {}
        for b in batches:
            inputs = tuple(torch.randn((b, *a.shape[1:])) for a in args)
            feeds = {n: t.numpy() for n, t in zip(st.inputs, inputs)}

            t_ort, t_torch = interleaved_medians(
                partial(runner.run, feeds), partial(_run_torch, st.module, inputs), repeats
            )
            with torch.inference_mode():
                ref = st.module(*inputs)[0].numpy()
            diff = float(np.abs(runner.run(feeds)["logits"] - ref).max())
            per_batch[str(b)] = {
                "onnxruntime_s": t_ort,
                "torch_eager_s": t_torch,
                "torch_over_onnxruntime": t_torch / t_ort,
                "max_abs_logit_diff": diff,
            }
            print(
                f"width {width:<5} stage {st.index} batch {b:>3}: onnxruntime {t_ort * 1e3:9.3f} ms  "
                f"torch {t_torch * 1e3:9.3f} ms  "
                f"ratio torch/ort {t_torch / t_ort:5.2f}  (max |diff| {diff:.1e})",
                flush=True,
            )
        stages[str(st.index)] = {
            "exit": st.exit,
            "inputs": [t.to_json() for t in info.inputs],
            "params": sum(p.numel() for p in st.module.parameters()),
            "onnx_bytes": len(m.SerializeToString()),
            "export_s": export_s,
            "batches": per_batch,
        }
        carry = {n: touts[n] for n in st.carry}
    return {"arch": "resnet18", "exits": list(model.config()["exits"]), "width": width, "stages": stages}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=float, nargs="+", default=[1.0, 0.25])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    p.add_argument("--exporter", default="auto", choices=["auto", "torchscript", "dynamo"])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    exporter, opset = resolve_exporter(args.exporter, 17)
    results = {
        "benchmark": "export_latency",
        "what": "median seconds per call of each stage, onnxruntime CPU vs torch eager (inference_mode), "
        "random weights",
        "repeats": args.repeats,
        "threads": args.threads,
        "exporter": exporter,
        "opset": opset,
        "machine": {**machine(), "processor": platform.processor()},
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "models": [bench_width(w, args.batches, args.repeats, args.threads, exporter) for w in args.widths],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
