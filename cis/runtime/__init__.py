"""The ZeroMQ runtime: protocol codec, node, client, launcher, CurveZMQ helpers.

:func:`cis.runtime.factory.build_node` makes a :class:`cis.runtime.node.Node` from a
verified bundle; ``Client`` talks to any node. See docs/runtime.md and docs/protocol.md.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "Client":
        from cis.runtime.client import Client

        return Client
    raise AttributeError(name)
