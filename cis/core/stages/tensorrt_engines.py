"""TensorRT engines as a stage backend, beside onnxruntime (``cis serve --provider tensorrt``).

A bundle exported with ``cis export --trt`` holds one serialized engine per
stage (``stages/stageK.plan``) built for one GPU model (the manifest's
``tensorrt.device``). :class:`EngineSession` runs such an engine and looks like
an onnxruntime session to :class:`cis.core.stages.runner.StageRunner` (``get_inputs()``,
``run(output_names, feeds)``), so the runtime node sees the same stage
interface whichever backend runs it.

torch-free, like the rest of the core: TensorRT's own runtime deserializes and
runs the engine, cuda-python allocates the device buffers and the stream
(``pip install 'cis-inference[tensorrt]'`` installs both). Batches beyond the engine's
optimisation profile (``max`` batch, 64 by default) run in slices.

**Not yet run on a GPU**: no session of this project has had one with TensorRT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from cis.core.errors import CisError


class EngineError(CisError):
    """TensorRT, cuda-python or a GPU is missing, or an engine cannot run here."""


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def runtime_missing() -> str | None:
    """Why TensorRT engines cannot run here (one phrase), or None when they can."""
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (libnvinfer missing)
        return f"TensorRT is not importable ({type(exc).__name__}); pip install 'cis-inference[tensorrt]'"
    try:
        cudart = _cudart()
    except Exception as exc:
        return f"cuda-python is not importable ({type(exc).__name__}); pip install 'cis-inference[tensorrt]'"
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count < 1:
        return "CUDA sees no GPU"
    return None


def _ok(result: tuple) -> Any:
    """cuda-python returns (error, *values): raise on an error, return the value(s)."""
    err, *values = result
    if err != _cudart().cudaError_t.cudaSuccess:
        raise EngineError(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


def gpu_info(device: int = 0) -> dict[str, str]:
    """{"name": ..., "compute_capability": "9.0"} of a CUDA device: what an engine is built for."""
    props = _ok(_cudart().cudaGetDeviceProperties(device))
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"name": name, "compute_capability": f"{props.major}.{props.minor}"}


class EngineSession:
    """One deserialized engine on one GPU, with the two methods of an onnxruntime session that StageRunner uses."""

    def __init__(self, engine_bytes: bytes, where: str = "engine", device: int = 0) -> None:
        missing = runtime_missing()
        if missing:
            raise EngineError(f"{where}: cannot run a TensorRT engine: {missing}")
        import tensorrt as trt

        self.trt, self.cudart, self.where = trt, _cudart(), where
        _ok(self.cudart.cudaSetDevice(device))
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise EngineError(f"{where}: TensorRT cannot deserialize it (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.max_batch = min(int(self.engine.get_tensor_profile_shape(n, 0)[2][0]) for n in self.inputs)
        self.stream = _ok(self.cudart.cudaStreamCreate())
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes), grown on demand

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=n) for n in self.inputs]

    def run(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        n = len(next(iter(feeds.values())))
        if n <= self.max_batch:
            return self._run(output_names, feeds)
        parts = [
            self._run(output_names, {k: v[i : i + self.max_batch] for k, v in feeds.items()})
            for i in range(0, n, self.max_batch)
        ]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(output_names))]

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, size = self.buffers.get(name, (0, 0))
        if size < nbytes:
            if ptr:
                _ok(self.cudart.cudaFree(ptr))
            ptr, size = int(_ok(self.cudart.cudaMalloc(nbytes))), nbytes
            self.buffers[name] = (ptr, size)
        return ptr

    def _run(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        cudart, ctx = self.cudart, self.context
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        keep = []  # host arrays must live until the copies are done
        for name in self.inputs:
            arr = np.ascontiguousarray(feeds[name], dtype=self.dtypes[name])
            keep.append(arr)
            ptr = self._buffer(name, max(1, arr.nbytes))
            _ok(cudart.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, self.stream))
            ctx.set_input_shape(name, tuple(arr.shape))
            ctx.set_tensor_address(name, ptr)
        results = {}
        for name in self.outputs:
            out = np.empty(tuple(ctx.get_tensor_shape(name)), self.dtypes[name])
            results[name] = out
            ctx.set_tensor_address(name, self._buffer(name, max(1, out.nbytes)))
        if not ctx.execute_async_v3(self.stream):
            raise EngineError(f"{self.where}: TensorRT execution failed")
        for name, out in results.items():
            _ok(cudart.cudaMemcpyAsync(out.ctypes.data, self.buffers[name][0], out.nbytes, d2h, self.stream))
        _ok(cudart.cudaStreamSynchronize(self.stream))
        return [results[name] for name in output_names]

    def __del__(self) -> None:
        cudart = getattr(self, "cudart", None)
        if cudart is None:
            return
        for ptr, _ in getattr(self, "buffers", {}).values():
            cudart.cudaFree(ptr)
        if getattr(self, "stream", None) is not None:
            cudart.cudaStreamDestroy(self.stream)
