"""Running a bundle's stages with onnxruntime or TensorRT engines (no torch); the names are
:mod:`cis.core.stages.contract`'s.

**Running stages**: one implementation shared by the exporter's verification,
the runtime node and the tests. A :class:`StageRunner` wraps one stage graph;
feeds and results are dicts of named numpy arrays, following the names the
manifest records. Carries are moved as they come out, in the dtype the manifest
states (float32, float16, or int8 with the scale baked into both graphs), so a
caller never converts anything.

    bundle = load_bundle("bundle/")              # verifies every sha256
    logits = run_chain(bundle, x)                 # {exit: (N, classes)}
    runner = StageRunner(bundle, 2)
    out = runner.run(carry)                       # {"logits": ..., "features": ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cis.core.errors import BundleError
from cis.core.stages.contract import LOGITS, carry_of

if TYPE_CHECKING:
    from cis.core.bundle import Bundle, StageInfo


# onnxruntime's execution provider for each provider of cis serve (cis.core.spec.PROVIDERS but auto)
ORT_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


class ProviderError(BundleError):
    """A stage cannot run on the provider asked for here (never a silent CPU fallback)."""

    def __init__(self, provider: str, reason: str) -> None:
        self.provider, self.reason = provider, reason
        super().__init__(f"provider {provider}: {reason}")


class StageInputError(BundleError):
    """A stage cannot run these inputs, though they have its dtypes and shapes (onnxruntime's INVALID_ARGUMENT,
    e.g. a token id outside an embedding): the request's fault, answered ``bad_input``, not the stage's."""


def _session(model: str | Path | bytes, provider: str, threads: int | None):
    """An onnxruntime session on ``provider`` (cpu, cuda or tensorrt) and nothing else.

    A GPU provider gets the CPU provider behind it for the operators it lacks
    (TensorRT: CUDA, then the CPU; onnxruntime's usual placement); if onnxruntime could not start the GPU
    provider at all (no GPU, missing CUDA libraries), it would silently run
    everything on the CPU: that is refused with :class:`ProviderError`.
    """
    import onnxruntime as ort

    wanted = ORT_PROVIDERS[provider]
    available = ort.get_available_providers()
    if wanted not in available:
        hint = "; it comes with onnxruntime-gpu on a machine with an NVIDIA GPU" if provider != "cpu" else ""
        raise ProviderError(
            provider, f"this onnxruntime {ort.__version__} has no {wanted} (it has {', '.join(available)}){hint}"
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    behind = [p for p in (ORT_PROVIDERS["cuda"], ORT_PROVIDERS["cpu"]) if p in available and p != wanted]
    chain = [wanted] if provider == "cpu" else [wanted, *behind]
    source = model if isinstance(model, bytes) else str(model)
    try:
        session = ort.InferenceSession(source, sess_options=opts, providers=chain)
    except Exception as exc:  # a corrupt graph: one line, not a traceback
        where = "<in-memory graph>" if isinstance(model, bytes) else str(model)
        raise BundleError(
            f"{where}: onnxruntime cannot load it ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None
    if session.get_providers()[0] != wanted:
        raise ProviderError(
            provider,
            f"onnxruntime could not start {wanted} here (no usable NVIDIA GPU, or its CUDA libraries are missing) "
            "and would run on the CPU",
        )
    return session


class StageRunner:
    """One stage of a bundle in an onnxruntime session (or a session-like TensorRT engine).

    ``StageRunner(bundle, k)`` loads ``bundle.stage(k).file`` on onnxruntime's
    CPU provider (``provider="cuda"`` or ``"tensorrt"``: its GPU providers, or a
    :class:`ProviderError`); the bundle was verified (sha256) by
    :func:`cis.core.bundle.load_bundle`. ``StageRunner.from_model`` wraps a graph given
    as bytes or a path with its :class:`StageInfo` (the exporter checks graphs
    this way before it writes them); ``StageRunner.from_session`` wraps any object
    with onnxruntime's ``get_inputs()`` and ``run(names, feeds)``, such as
    :class:`cis.core.stages.tensorrt_engines.EngineSession` (cis.core.stages.backends picks which).
    """

    def __init__(self, bundle: Bundle, stage_index: int, provider: str = "cpu", threads: int | None = None) -> None:
        if not 1 <= stage_index <= bundle.num_exits:
            raise BundleError(f"{bundle.root}: no stage {stage_index}; expected 1..{bundle.num_exits}")
        info = bundle.stage(stage_index)
        self._init(info, _session(bundle.path(info.file), provider, threads), provider, "onnxruntime")

    @classmethod
    def from_model(
        cls, model: str | Path | bytes, info: StageInfo, provider: str = "cpu", threads: int | None = None
    ) -> StageRunner:
        return cls.from_session(info, _session(model, provider, threads), provider, "onnxruntime")

    @classmethod
    def from_session(cls, info: StageInfo, session, backend: str, runtime: str) -> StageRunner:
        """A runner on a ready session: ``backend`` is the latency profile it matches (cpu, cuda,
        tensorrt), ``runtime`` what runs it, for errors (onnxruntime, TensorRT)."""
        self = cls.__new__(cls)
        self._init(info, session, backend, runtime)
        return self

    def _init(self, info: StageInfo, session, backend: str, runtime: str) -> None:
        self.info = info
        self.session = session
        self.backend, self.runtime = backend, runtime
        self.input_names = [t.name for t in info.inputs]
        self.output_names = [t.name for t in info.outputs]
        self._dtypes = {t.name: np.dtype(t.dtype) for t in info.inputs}
        graph_inputs = [i.name for i in session.get_inputs()]
        if sorted(graph_inputs) != sorted(self.input_names):
            raise BundleError(
                f"stage {info.index} ({info.file}): graph inputs {graph_inputs} differ from the "
                f"manifest's {self.input_names}"
            )

    @property
    def index(self) -> int:
        return self.info.index

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the stage on named inputs; returns ``logits`` and the carry by name."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BundleError(f"stage {self.index}: missing input {missing[0]!r}; expected {self.input_names}")
        ready = {}
        for name in self.input_names:
            arr = np.asarray(feeds[name])
            want = self._dtypes[name]
            if arr.dtype != want:
                if want.kind == "f" and arr.dtype.kind == "f":
                    arr = arr.astype(want)  # e.g. float64 images from a client
                else:
                    raise BundleError(f"stage {self.index}: input {name!r} has dtype {arr.dtype}; expected {want}")
            ready[name] = np.ascontiguousarray(arr)
        try:
            values = self.session.run(self.output_names, ready)
        except Exception as exc:  # shape mismatch and the like
            said = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            if type(exc).__name__ == "InvalidArgument":  # onnxruntime's INVALID_ARGUMENT: these inputs, not the stage
                raise StageInputError(f"stage {self.index} cannot take this input ({self.runtime}: {said})") from None
            raise BundleError(f"stage {self.index}: {self.runtime} failed ({said})") from None
        return dict(zip(self.output_names, values))


def stage_runners(
    bundle: Bundle, upto: int | None = None, provider: str = "cpu", threads: int | None = None
) -> list[StageRunner]:
    """Runners for stages 1..upto (default: all)."""
    upto = bundle.num_exits if upto is None else upto
    return [StageRunner(bundle, k, provider, threads) for k in range(1, upto + 1)]


def run_stages(
    runners: Sequence[StageRunner], feeds: Mapping[str, np.ndarray]
) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
    """Run consecutive stages from ``feeds`` (the first runner's inputs).

    Returns ({exit: logits}, the carry after the last runner). A request
    forwarded at exit e continues with runners for stages e+1.. and its carry.
    """
    logits: dict[int, np.ndarray] = {}
    carry = dict(feeds)
    for runner in runners:
        out = runner.run(carry)
        logits[runner.info.exit] = out[LOGITS]
        carry = carry_of(out)
    return logits, carry


def run_chain(
    bundle: Bundle | Sequence[StageRunner],
    x: np.ndarray | Mapping[str, np.ndarray],
    upto: int | None = None,
    batch_size: int = 256,
) -> dict[int, np.ndarray]:
    """Per-exit logits {exit: (N, classes)} of stages 1..upto on input ``x``.

    ``x`` is the array for stage 1's single input (normalised images) or a dict
    of stage 1's named inputs; it is processed in batches of ``batch_size``.
    """
    runners = list(bundle) if isinstance(bundle, Sequence) else stage_runners(bundle, upto)
    if upto is not None:
        runners = runners[:upto]
    if not runners:
        raise BundleError("run_chain: no stages to run")
    feeds = dict(x) if isinstance(x, Mapping) else {runners[0].input_names[0]: x}
    n = len(next(iter(feeds.values())))
    parts: dict[int, list[np.ndarray]] = {r.info.exit: [] for r in runners}
    for start in range(0, n, batch_size):
        logits, _ = run_stages(runners, {k: v[start : start + batch_size] for k, v in feeds.items()})
        for e, v in logits.items():
            parts[e].append(v)
    return {e: np.concatenate(v) for e, v in parts.items()}


def stage_inputs(runners: Sequence[StageRunner], x: np.ndarray, batch: int) -> list[dict[str, np.ndarray]]:
    """Each stage's inputs for ``batch`` samples of ``x`` (repeated when it has fewer): stage 1 gets the
    samples, every later stage what the one before passes on (the real carry, not random values)."""
    rows = np.resize(np.arange(len(x)), batch)
    feeds: dict[str, np.ndarray] = {runners[0].input_names[0]: np.ascontiguousarray(x[rows])}
    out = []
    for runner in runners:
        out.append({name: feeds[name] for name in runner.input_names})
        feeds = {k: v for k, v in runner.run(feeds).items() if k != LOGITS}
    return out
