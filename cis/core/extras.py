"""The optional parts of cis (pip extras) and the one line a command prints when one is missing.

The core install (``pip install cis-inference``: numpy, pyzmq, msgpack, msgspec, cryptography, simpy,
tomli-w, tqdm, prometheus-client) runs ``cis spec``, ``rates``, ``inspect``, ``status``,
``keys``, ``simulate``, ``report`` and ``infer`` on arrays or image folders; ``serve`` (with
``--metrics-port``) needs one onnxruntime besides: the ``cpu`` extra (onnxruntime) or the
``gpu`` extra (onnxruntime-gpu), never both (they install the same module). Training, export
and Flower need torch and friends, which come with an extra; a command that needs one checks
here first (by module lookup, without importing anything), so a core install answers with the
pip command instead of a traceback.
"""

from __future__ import annotations

import importlib.util

from cis.core.errors import CisError

# extra -> the top-level modules it must provide (import names, not package names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "cpu": ("onnxruntime",),
    "gpu": ("onnxruntime",),  # onnxruntime-gpu installs the same module
    "train": ("torch", "sklearn", "PIL"),
    "export": ("torch", "sklearn", "PIL", "onnx"),
    "flower": ("torch", "sklearn", "PIL", "flwr"),
    "hf": ("datasets",),
    "plot": ("matplotlib",),
    "metrics": ("prometheus_client",),
    "tensorrt": ("tensorrt", "cuda"),
    "http": ("httptools",),
    "grpc": ("grpc", "grpc_health", "google.protobuf"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),  # cis serve --otlp-endpoint
}


class MissingExtra(CisError):
    """A command needs an extra that is not installed; the CLI prints it without 'error:'."""

    def __init__(self, extra: str, missing: list[str], what: str = "") -> None:
        self.extra, self.missing = extra, missing
        lead = f"{what} needs" if what else "needs"
        other = " (or 'cis-inference[gpu]' for onnxruntime-gpu on an NVIDIA GPU)" if extra == "cpu" else ""
        super().__init__(
            f"{lead} the '{extra}' extra: pip install 'cis-inference[{extra}]'{other} "
            f"(not installed: {', '.join(missing)})"
        )


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken parent
        return False


def require(extra: str, what: str = "") -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` is installed."""
    missing = [m for m in EXTRAS[extra] if not installed(m)]
    if missing:
        raise MissingExtra(extra, missing, what)
