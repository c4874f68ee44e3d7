"""A node's front socket: the ROUTER its children, clients and operators reach, with its limits and security.

A bind that fails (the address is taken, or names no interface of this machine) stops the node with one line
naming the node (a replica by its own id, e.g. cloud#1) and the address, not a traceback.
"""

from __future__ import annotations

import zmq

from cis.core.errors import CisError
from cis.runtime.node_config import NodeConfig
from cis.runtime.security import secure_server

UNREAD_REPLIES = 10000  # replies held for a peer that does not read them; beyond, they count as undeliverable


def bind_front(ctx: zmq.Context, cfg: NodeConfig) -> zmq.Socket:
    """The node's ROUTER, bound to ``cfg.bind`` (port 0: ``cfg.bind`` becomes the endpoint bound)."""
    front = ctx.socket(zmq.ROUTER)
    front.linger = 0
    front.maxmsgsize = cfg.max_message_bytes  # per frame: a bigger one is never valid; ZeroMQ drops the peer
    front.rcvhwm = cfg.rcv_hwm
    front.rcvbuf = cfg.rcv_buf
    front.sndhwm = UNREAD_REPLIES
    front.router_mandatory = True  # a reply that cannot be delivered raises, so it is counted, not lost unseen
    secure_server(front, cfg.curve)
    try:
        front.bind(cfg.bind)
    except zmq.ZMQError as exc:
        front.close(0)
        why = zmq.strerror(exc.errno) if exc.errno is not None else str(exc)
        raise CisError(
            f"node {cfg.name}: cannot bind {cfg.bind} ({why}); expected a free port on an address of this machine"
        ) from None
    if cfg.bind.strip().rpartition(":")[2] == "0":  # a free port: node_start and status say the one bound
        cfg.bind = front.last_endpoint.decode()
    return front
