"""TensorRT engines per stage (optional; ``pip install 'cis[tensorrt]'`` on a GPU machine).

One engine per stage graph, built with the TensorRT 10 Python API
(``build_serialized_network``, explicit batch, one optimisation profile with
the batch dimension at min 1 / opt 8 / max 64), FP16 by default. Every engine
is run on the GPU and compared with onnxruntime's outputs of the same graph;
buffers are torch CUDA tensors (torch is there at export time anyway).

Without an importable ``tensorrt`` or without a CUDA GPU, :func:`require_tensorrt`
raises one clear :class:`~cis.errors.CisError` line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cis.errors import CisError

PROFILE = (1, 8, 64)  # min, opt, max batch


class TensorRTError(CisError):
    """TensorRT is missing, or an engine failed to build or to match onnxruntime."""


def require_tensorrt():
    """The ``tensorrt`` module, when it is importable and a CUDA GPU is present."""
    try:
        import tensorrt as trt  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or a broken install (missing libnvinfer)
        raise TensorRTError(
            f"--trt needs TensorRT, which is not importable here ({type(exc).__name__}); install the optional extra "
            "'cis[tensorrt]' on a machine with an NVIDIA GPU, or export without --trt"
        ) from None
    import torch

    if not torch.cuda.is_available():
        raise TensorRTError(
            "--trt needs an NVIDIA GPU with CUDA, and torch sees none here; export without --trt or run on a GPU "
            "machine"
        )
    return trt


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


class EngineRunner:
    """Runs a serialized engine on CUDA tensors; ``run(feeds) -> {name: numpy}``."""

    def __init__(self, engine_bytes: bytes) -> None:
        trt = require_tensorrt()
        import torch

        self.trt, self.torch = trt, torch
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise TensorRTError("TensorRT could not deserialize the engine")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch, trt = self.torch, self.trt
        keep = []
        for name in self.inputs:
            t = torch.from_numpy(np.ascontiguousarray(feeds[name])).cuda()
            keep.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        results = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = torch.from_numpy(np.empty(0, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            t = torch.empty(shape, dtype=dtype, device="cuda")
            results[name] = t
            self.context.set_tensor_address(name, t.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise TensorRTError("TensorRT execution failed")
        stream.synchronize()
        return {k: v.cpu().numpy() for k, v in results.items()}


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
) -> dict[str, Any]:
    """One engine per stage graph beside it (``stages/stageK.plan``), each checked against onnxruntime at
    batch 1, an odd batch and a validation batch; the manifest's ``tensorrt`` block."""
    from cis.stages import carry_of
    from export.profile import random_feeds
    from export.verify import ODD_BATCH

    report: dict[str, Any] = {"precision": "fp16" if fp16 else "fp32", "profile": list(PROFILE), "stages": {}}
    rng = np.random.default_rng(0)
    carry: dict[str, dict[str, np.ndarray]] = {
        "batch1": random_feeds(infos[0].inputs, 1, rng),
        f"batch{ODD_BATCH}": random_feeds(infos[0].inputs, ODD_BATCH, rng),
        "validation": {infos[0].inputs[0].name: np.ascontiguousarray(x[: PROFILE[2]])},
    }
    for m, info, runner in zip(models, infos, runners):
        say(f"building TensorRT engine for stage {info.index}")
        engine = build_engine(m.SerializeToString(), fp16=fp16, where=f"stage {info.index}")
        rel = f"stages/stage{info.index}.plan"
        (root / rel).write_bytes(engine)
        trt_runner = EngineRunner(engine)
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
    return report
