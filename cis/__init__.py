"""cis: collaborative inference systems with early-exit and nested models.

This package holds what every node needs (the spec and its rate calculus, the
exit policy, the bundle format, the ZeroMQ runtime, the CLI) and never imports
torch, so an edge node can run it with numpy, pyzmq and onnxruntime only.
"""

from cis.core.version import __version__

__all__ = ["Client", "__version__"]


def __getattr__(name: str):
    if name == "Client":  # lazily: importing cis does not import zmq
        from cis.runtime.client import Client

        return Client
    raise AttributeError(f"module 'cis' has no attribute {name!r}")
