"""A parent is down when it leaves a ping unanswered for heartbeat_timeout while the node listens
(docs/runtime.md, *Reliability*): a node busy in a long micro-batch, or stopped, reads no pong and sends no
ping meanwhile, and that is not its parent's silence. Found by a hunt: a 60,000-sample batch of 1.09 s
served every sample it should have forwarded from its own exit, flagged degraded, with the parent up.

Real ZeroMQ sockets; the clock is the node's ``now`` and ``listened``, given explicitly."""

from __future__ import annotations

import pytest
import zmq

from cis.runtime import protocol as P
from cis.runtime.node_config import NodeConfig
from cis.runtime.ports import free_port
from cis.runtime.upstream import Upstream


@pytest.fixture
def link():
    """A node's Upstream to one parent (a real ROUTER), and the parent: (parent, upstream, its DEALER)."""
    port = free_port()
    ctx = zmq.Context()
    parent = ctx.socket(zmq.ROUTER)
    parent.bind(f"tcp://127.0.0.1:{port}")
    cfg = NodeConfig("device", 1, parent=f"tcp://127.0.0.1:{port}", parent_id="cloud")
    up = Upstream(cfg, 0.0)
    (sock,) = up.open(ctx)
    yield parent, up, sock
    up.close()
    parent.close(0)
    ctx.term()


def _ping_pong(parent, up, sock, now: float) -> None:
    """The node pings at ``now``; the parent answers; the node reads the answer at ``now`` (as it would)."""
    for _ in range(50):  # ZMQ_IMMEDIATE: a ping before the connection is up is not sent
        up.heartbeat(now, lambda: P.encode(P.PING, 1, node="device"))
        if parent.poll(100):
            break
    assert parent.poll(0), "the ping reached the parent"
    who, *frames = parent.recv_multipart()
    parent.send_multipart([who, *P.encode(P.PONG, 1)])
    assert sock.poll(5000), "the pong came back"
    sock.recv_multipart()
    up.listened = now
    up.answered(sock, now)


def test_a_long_batch_of_the_node_is_not_its_parents_silence(link):
    parent, up, sock = link
    timeout = up.cfg.heartbeat_timeout
    assert not up.is_up(0, 0.0), "down until it first answers"
    _ping_pong(parent, up, sock, 0.0)
    assert up.is_up(0, 0.0)
    # a ping goes out just before a batch of 3 timeouts; the node reads nothing until the batch ends
    up.heartbeat(0.1, lambda: P.encode(P.PING, 2, node="device"))
    assert up.is_up(0, 0.1 + 3 * timeout), "its own batch: the parent's pong waits unread"
    # the node looks again: the pong was there, so the parent was up all along
    _ping_pong(parent, up, sock, 0.2 + 3 * timeout)
    assert up.is_up(0, 0.2 + 3 * timeout)


def test_a_node_that_was_stopped_does_not_call_its_parent_down_before_it_asks(link):
    parent, up, sock = link
    _ping_pong(parent, up, sock, 0.0)
    later = 10 * up.cfg.heartbeat_timeout  # SIGSTOP, or a batch: no ping went out meanwhile
    up.listened = later
    assert up.is_up(0, later), "not asked since its last answer: still up"


def test_a_parent_that_stops_answering_while_the_node_listens_is_down(link):
    parent, up, sock = link
    timeout = up.cfg.heartbeat_timeout
    _ping_pong(parent, up, sock, 0.0)
    t = 0.0
    while up.is_up(0, t):  # pings every 0.2 s, none answered, the node listening between them
        t += 0.2
        up.listened = t
        up.heartbeat(t, lambda: P.encode(P.PING, 3, node="device"))
        assert t < 3 * timeout, "never called down"
    assert timeout <= t <= timeout + 0.2 + 1e-9, "down one timeout after the first unanswered ping"
    assert up.watches[0].up is False
