"""TensorRT engines per stage (optional; ``pip install 'cis-inference[tensorrt]'`` on a GPU machine).

One engine per stage graph, built with the TensorRT 10 Python API
(``build_serialized_network``, explicit batch, one optimisation profile with
the batch dimension at min 1 / opt 8 / max 64), FP16 by default. Every engine
is run on the GPU by the serving backend itself (:class:`cis.core.stages.tensorrt_engines.EngineSession`,
torch-free) and compared with onnxruntime's outputs of the same graph; the
manifest records the GPU it was built for (``tensorrt.device``), which
``cis serve --provider tensorrt`` checks.

Without an importable ``tensorrt`` and cuda-python, or without a CUDA GPU,
:func:`require_tensorrt` raises one clear :class:`~cis.core.errors.CisError` line.
Never run on a real GPU so far (no session has had one with TensorRT).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import CisError
from cis.core.stages.runner import StageRunner
from cis.core.stages.tensorrt_engines import EngineSession, gpu_info, runtime_missing

PROFILE = (1, 8, 64)  # min, opt, max batch


class TensorRTError(CisError):
    """TensorRT is missing, or an engine failed to build or to match onnxruntime."""


def require_tensorrt():
    """The ``tensorrt`` module, when it, cuda-python and a CUDA GPU are present."""
    problem = runtime_missing()
    if problem:
        advice = "" if "pip install" in problem else "; install the optional extra 'cis-inference[tensorrt]'"
        raise TensorRTError(
            f"--trt needs TensorRT, cuda-python and an NVIDIA GPU, and here {problem}{advice} (on a machine with an "
            "NVIDIA GPU), or export without --trt"
        )
    import tensorrt as trt

    return trt


def engine_runner(engine: bytes, info, where: str) -> StageRunner:
    """A stage runner on a serialized engine: the same one ``cis serve --provider tensorrt`` uses."""
    return StageRunner.from_session(info, EngineSession(engine, where=where), "tensorrt", "TensorRT")


def build_engine(
    onnx_bytes: bytes,
    fp16: bool = True,
    profile: tuple[int, int, int] = PROFILE,
    workspace: int = 1 << 30,
    where: str = "stage",
) -> bytes:
    """Serialized engine for one ONNX stage graph."""
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    if explicit is not None:  # implied (and deprecated) in TensorRT 10, required before
        flags |= 1 << int(explicit)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTError(f"{where}: TensorRT cannot parse the ONNX graph ({errors})")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    opt = builder.create_optimization_profile()
    lo, mid, hi = profile
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        rest = tuple(tensor.shape)[1:]
        opt.set_shape(tensor.name, (lo, *rest), (mid, *rest), (hi, *rest))
    config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTError(f"{where}: TensorRT failed to build an engine (see its log above)")
    return bytes(serialized)


def compare(reference: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], fp16: bool) -> dict:
    """Max abs difference per output and argmax agreement of the logits."""
    atol, rtol = (5e-2, 2e-2) if fp16 else (1e-3, 1e-3)
    out: dict = {"outputs": {}, "passed": True}
    for name, ref in reference.items():
        g = got[name]
        if ref.dtype.kind == "i":  # an int8 carry: allow a couple of quantisation steps
            diff = float(np.max(np.abs(ref.astype(np.int32) - g.astype(np.int32)))) if ref.size else 0.0
            ok = diff <= 2
        else:
            diff = float(np.max(np.abs(ref.astype(np.float32) - g.astype(np.float32)))) if ref.size else 0.0
            ok = diff <= atol + rtol * float(np.max(np.abs(ref))) if ref.size else True
        out["outputs"][name] = diff
        out["passed"] &= bool(ok)
    if "logits" in reference:
        agree = float(np.mean(reference["logits"].argmax(-1) == got["logits"].argmax(-1)))
        out["argmax_agreement"] = agree
        out["passed"] &= agree >= 0.98
    return out



def build_engines(
    root: Path, models, infos, runners, x: np.ndarray, fp16: bool, say: Callable[[str], None]
) -> tuple[dict[str, Any], list[StageRunner]]:
    """One engine per stage graph beside it (``stages/stageK.plan``), each checked against onnxruntime at
    batch 1, an odd batch and a validation batch; the manifest's ``tensorrt`` block, and the engines'
    runners (for the tensorrt latency profile)."""
    from cis.core.stages.contract import carry_of
    from cis.exporter.profile import random_feeds
    from cis.exporter.verify import ODD_BATCH

    report: dict[str, Any] = {
        "precision": "fp16" if fp16 else "fp32",
        "profile": list(PROFILE),
        "device": gpu_info(),  # the GPU model the engines are for: cis serve --provider tensorrt checks it
        "stages": {},
    }
    rng = np.random.default_rng(0)
    carry: dict[str, dict[str, np.ndarray]] = {
        "batch1": random_feeds(infos[0].inputs, 1, rng),
        f"batch{ODD_BATCH}": random_feeds(infos[0].inputs, ODD_BATCH, rng),
        "validation": {infos[0].inputs[0].name: np.ascontiguousarray(x[: PROFILE[2]])},
    }
    trt_runners = []
    for m, info, runner in zip(models, infos, runners):
        say(f"building TensorRT engine for stage {info.index}")
        engine = build_engine(m.SerializeToString(), fp16=fp16, where=f"stage {info.index}")
        rel = f"stages/stage{info.index}.plan"
        (root / rel).write_bytes(engine)
        trt_runner = engine_runner(engine, info, f"stage {info.index}")
        trt_runners.append(trt_runner)
        checks = {}
        for label, feeds in carry.items():
            ref = runner.run(feeds)
            got = trt_runner.run(feeds)
            checks[label] = compare(ref, got, fp16)
            if not checks[label]["passed"]:
                raise TensorRTError(
                    f"stage {info.index}: TensorRT engine differs from onnxruntime at {label}: {checks[label]}"
                )
            carry[label] = carry_of(ref)
        report["stages"][str(info.index)] = {
            "engine": rel,
            "checks": checks,
            "sha256": hashlib.sha256(engine).hexdigest(),
        }
    return report, trt_runners
