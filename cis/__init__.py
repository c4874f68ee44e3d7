"""cis: collaborative inference systems with early-exit and nested models.

This package holds what every node needs (the spec and its rate calculus, the
exit policy, the bundle format, the ZeroMQ runtime, the CLI) and never imports
torch, so an edge node can run it with numpy, pyzmq and onnxruntime only.
"""

__version__ = "0.1.0"
