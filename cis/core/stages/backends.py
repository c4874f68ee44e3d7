"""Which backend runs a node's stages: ``cis serve --provider cpu|cuda|tensorrt|auto`` (or the spec's ``provider``).

- ``cpu``: onnxruntime's CPU provider (the default);
- ``cuda``: onnxruntime's CUDA provider (``pip install onnxruntime-gpu`` and an NVIDIA GPU);
- ``tensorrt``: the bundle's TensorRT engines (``cis export --trt``) when it holds one for every stage
  the node runs, built for this GPU model (same compute capability), run by :mod:`cis.core.stages.tensorrt_engines`;
  otherwise onnxruntime's TensorRT provider on the ONNX graphs;
- ``auto``: CUDA when onnxruntime's CUDA provider runs here, else the CPU. Never TensorRT: its
  engines are fp16 by default and change the numbers the thresholds were calibrated on.

A provider that cannot run here stops the node with one line (:class:`cis.core.stages.runner.ProviderError`);
only ``auto`` falls back to the CPU, and says so (:attr:`Backend.note`). The chosen backend names
the latency profile the simulator takes for the node (cpu, cuda or tensorrt; see cis.sim.service).
The CUDA and TensorRT paths have not run on a real GPU yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cis.core.errors import CisError
from cis.core.stages.runner import ORT_PROVIDERS, ProviderError, StageRunner

if TYPE_CHECKING:
    from cis.core.bundle import Bundle
    from cis.core.spec import Node


@dataclass(frozen=True)
class Backend:
    provider: str  # what runs the stages: cpu, cuda or tensorrt (the latency profile it matches)
    engines: bool = False  # the bundle's TensorRT engines (else onnxruntime)
    note: str | None = None  # said once at start: what auto or tensorrt chose instead, and why

    def describe(self) -> str:
        if self.engines:
            return "TensorRT engines"
        return f"onnxruntime {ORT_PROVIDERS[self.provider]}"


def open_stages(
    bundle: Bundle, indices: Sequence[int], provider: str, threads: int | None = None
) -> tuple[dict[int, StageRunner], Backend]:
    """Runners for ``indices`` on ``provider`` and the backend that runs them; ProviderError if it cannot run."""
    if provider == "auto":
        try:
            return _onnxruntime(bundle, indices, "cuda", threads), Backend("cuda")
        except ProviderError as exc:
            runners = _onnxruntime(bundle, indices, "cpu", threads)
            return runners, Backend("cpu", note=f"provider auto: {exc.reason}; running on the CPU")
    if provider != "tensorrt":
        return _onnxruntime(bundle, indices, provider, threads), Backend(provider)
    why_not = _engines_unusable(bundle, indices)
    if why_not is None:
        return _engines(bundle, indices), Backend("tensorrt", engines=True)
    try:
        runners = _onnxruntime(bundle, indices, "tensorrt", threads)
    except ProviderError as exc:
        raise ProviderError("tensorrt", f"{why_not}, and {exc.reason}") from None
    return runners, Backend("tensorrt", note=f"provider tensorrt: {why_not}; running onnxruntime's TensorRT provider")


def node_provider(node: Node, asked: str | None) -> tuple[str, str]:
    """(provider, where it comes from) for a spec node: --provider, else the spec's, else cpu."""
    if asked:
        return asked, "--provider"
    if node.provider:
        return node.provider, "the spec's provider"
    return "cpu", "the default"


def refusal(node_id: str, exc: ProviderError, source: str) -> CisError:
    """The one line a node that cannot run its provider stops with."""
    return CisError(
        f"node {node_id!r}: provider {exc.provider} ({source}): {exc.reason}; "
        "use provider cpu, or auto to fall back to the CPU"
    )


def _onnxruntime(bundle: Bundle, indices: Sequence[int], provider: str, threads: int | None) -> dict[int, StageRunner]:
    return {k: StageRunner(bundle, k, provider, threads) for k in indices}


def _engines_unusable(bundle: Bundle, indices: Sequence[int]) -> str | None:
    """Why the bundle's engines cannot run here (a phrase), or None when they can."""
    missing = [k for k in indices if not bundle.stage(k).engine]
    if missing:
        return f"the bundle has no TensorRT engine for stage {missing[0]} (export with --trt on this GPU model)"
    from cis.core.stages.tensorrt_engines import gpu_info, runtime_missing

    problem = runtime_missing()
    if problem:
        return f"its engines cannot run: {problem}"
    built = (bundle.manifest.get("tensorrt") or {}).get("device") or {}
    here = gpu_info()
    if built.get("compute_capability") != here["compute_capability"]:
        return (
            f"its engines were built for {built.get('name', 'an unrecorded GPU')} "
            f"(compute capability {built.get('compute_capability', '?')}), this is {here['name']} "
            f"({here['compute_capability']})"
        )
    return None


def _engines(bundle: Bundle, indices: Sequence[int]) -> dict[int, StageRunner]:
    from cis.core.stages.tensorrt_engines import EngineSession

    out = {}
    for k in indices:
        info = bundle.stage(k)
        assert info.engine is not None  # checked by _engines_unusable
        session = EngineSession(bundle.path(info.engine).read_bytes(), where=f"stage {k} ({info.engine})")
        out[k] = StageRunner.from_session(info, session, "tensorrt", "TensorRT")
    return out
