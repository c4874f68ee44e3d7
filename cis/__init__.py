"""cis: collaborative inference systems with early-exit and nested models.

This package holds what every node needs (the spec and its rate calculus, the
exit policy, the bundle format, the ZeroMQ runtime, the CLI) and never imports
torch, so an edge node can run it with numpy, pyzmq and onnxruntime only.

The Python API, ``cis.train``, ``cis.export``, ``cis.serve`` and ``cis.infer`` (cis/cli/api.py), and
``cis.Client`` are imported when first used.
"""

from cis.core.version import __version__

__all__ = ["Client", "__version__", "export", "infer", "serve", "train"]
_API = ("train", "export", "serve", "infer")  # the Python API: cis/cli/api.py (docs/your-model.md, "The Python API")


def __getattr__(name: str):
    if name == "Client":  # lazily: importing cis does not import zmq
        from cis.runtime.client import Client

        return Client
    if name in _API:  # lazily: importing cis does not import torch, onnx or zmq
        from cis.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'cis' has no attribute {name!r}")
