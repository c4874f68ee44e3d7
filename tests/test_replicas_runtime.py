"""Replicas of a parent at a child (issue 41 item 3), with real sockets and, for the kill, real processes: the child
spreads its forwards over the healthy replicas, skips a dead one at once, loses nothing when one is SIGKILLed under
load (its forwards go to another replica, not to the degraded fallback), finds a restarted one again, and serves
beside a replica that never comes up."""

from __future__ import annotations

import logging
import signal
import time

import numpy as np
import pytest
from replica_nodes import UNSURE, Running, leaf, spawn, stages

from cis.runtime.client import Client
from cis.runtime.node import Node, NodeConfig
from cis.runtime.ports import free_port


def _addr() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def _wait(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _ups(node: Node) -> list[bool]:
    return [p["up"] for p in node.status()["parents"]]


@pytest.fixture
def closing():
    started: list = []
    yield started
    for thing in reversed(started):
        if isinstance(thing, Running):
            thing.close()
        elif thing.poll() is None:
            thing.kill()
            thing.wait(10)


def test_forwards_spread_over_every_replica_of_the_parent(closing):
    addrs = [_addr() for _ in range(3)]
    roots = [Running(Node(NodeConfig("root", 2, bind=a, name=f"root#{i}"), stages())) for i, a in enumerate(addrs)]
    closing += roots
    child = leaf(_addr(), addrs)
    closing.append(child)
    _wait(lambda: all(_ups(child.node)))
    with Client(child.node.cfg.bind, timeout=10) as c:
        results = c.infer_many(np.tile(UNSURE, (90, 1)), batch_size=1, window=1)
        st = c.status()
    assert all(r.error is None and r.exit.tolist() == [2] and r.served_by == ["root"] for r in results)
    served = [r.node.status()["served"] for r in roots]
    assert sum(served) == 90 and min(served) >= 20, served  # each replica took its share
    assert [p["replica"] for p in st["parents"]] == ["root#0", "root#1", "root#2"]
    assert st["parents"][1]["address"] == addrs[1] and st["parent_up"] and st["degraded"] == 0
    assert roots[1].node.status()["replica"] == "root#1" and roots[1].node.status()["node"] == "root"


def test_a_replica_killed_under_load_loses_nothing_and_is_found_again(closing):
    addrs = [_addr(), _addr()]
    procs = [spawn(f"root#{i}", a, delay=0.02) for i, a in enumerate(addrs)]
    closing += procs
    child = leaf(_addr(), addrs)
    closing.append(child)
    _wait(lambda: all(_ups(child.node)))
    got = []
    with Client(child.node.cfg.bind, timeout=30) as c:
        for _ in range(300):
            c.submit(UNSURE)
        while len(got) < 100:
            got += c.poll(5)
        assert child.node.upstream.outstanding[0] > 0  # replica 0 holds forwards when it dies
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        while len(got) < 300:
            more = c.poll(10)
            assert more, f"{len(got)} of 300 answered"
            got += more
        st = c.status()
    results = [r for _, r in got]
    assert all(r.error is None for r in results)
    assert sum(int(r.degraded.sum()) for r in results) == 0  # sent again to replica 1, not served degraded
    assert all(r.exit.tolist() == [2] for r in results)
    assert st["degraded"] == 0 and [p["up"] for p in st["parents"]] == [False, True]
    procs.append(spawn("root#0", addrs[0]))  # restarted at its address: found again, and forwarded to
    closing.append(procs[-1])
    _wait(lambda: all(_ups(child.node)))
    with Client(child.node.cfg.bind, timeout=10) as c:
        c.infer_many(np.tile(UNSURE, (20, 1)), batch_size=1, window=1)
    with Client(addrs[0]) as c:
        assert c.status()["served"] > 0


def test_a_replica_that_never_comes_up_is_skipped_and_logged(closing, caplog):
    live, never = _addr(), _addr()  # nothing ever binds the second address
    closing.append(Running(Node(NodeConfig("root", 2, bind=live, name="root#0"), stages())))
    with caplog.at_level(logging.INFO, logger="cis.runtime.node"):
        child = leaf(_addr(), [live, never])
        closing.append(child)
        _wait(lambda: child.node.parent_up)
        with Client(child.node.cfg.bind, timeout=10) as c:
            results = c.infer_many(np.tile(UNSURE, (40, 1)), batch_size=1, window=4)
        _wait(lambda: any(r.getMessage().startswith("node leaf: parent root#1") for r in caplog.records))
    assert all(r.error is None and r.exit.tolist() == [2] and not r.degraded.any() for r in results)
    assert _ups(child.node) == [True, False]
    pytest.importorskip("prometheus_client")
    from test_runtime_metrics import scrape

    from cis.runtime.metrics_http import MetricsServer

    metrics = MetricsServer("leaf", "127.0.0.1", 0)
    try:
        metrics.attach(child.node)
        m = scrape(metrics.url)
    finally:
        metrics.close()
    assert m[("cis_parent_replica_up", (("address", live), ("replica", "root#0")))] == 1
    assert m[("cis_parent_replica_up", (("address", never), ("replica", "root#1")))] == 0
    assert m[("cis_parent_up", ())] == 1
    down = [r for r in caplog.records if getattr(r, "event", "") == "parent_down"]
    assert len(down) == 1 and down[0].fields["parent"] == "root#1" and down[0].fields["address"] == never
    assert "its forwards go to the other replicas" in down[0].getMessage()


def test_with_every_replica_down_the_child_serves_degraded(closing):
    child = leaf(_addr(), [_addr(), _addr()], forward_timeout=0.5)
    closing.append(child)
    with Client(child.node.cfg.bind, timeout=10) as c:
        r = c.infer(np.vstack([UNSURE, [[5, 0, 0, 0]]]).astype(np.float32))
    assert r.exit.tolist() == [1, 1] and r.degraded.tolist() == [True, False]


def test_a_duplicate_request_id_is_answered_once(closing):
    """A client's retry that reaches the node holding (or having answered) the first try gets no second answer."""
    import zmq

    from cis.runtime import protocol as P

    root = Running(Node(NodeConfig("root", 2, bind=_addr()), stages(delay=0.3)))
    closing.append(root)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.connect(root.node.cfg.bind)
    try:
        frames = P.encode(P.INFER, 7, {"features": np.zeros((1, 4), np.float32)}, stage=2)
        P.send(s, frames)
        P.send(s, frames)  # the retry, while the first is still running
        assert s.poll(5000)
        assert P.decode(s.recv_multipart()).id == 7
        assert not s.poll(800)  # no second answer
        P.send(s, frames)  # a retry after the answer
        assert not s.poll(800)
        P.send(s, P.encode(P.INFER, 8, {"features": np.zeros((1, 4), np.float32)}, stage=2))
        assert s.poll(5000) and P.decode(s.recv_multipart()).id == 8  # a new id is served
    finally:
        s.close()
    st = root.node.status()
    assert st["duplicates"] == 2 and st["requests"] == 2 and st["served"] == 2


def test_a_request_refused_on_arrival_is_not_remembered_so_its_retry_is_served(closing):
    """docs/protocol.md: a refusal such as ``overloaded`` says "retry later"; a retry with the same id over the same
    connection is a new request (it was not run), not a duplicate answered by silence."""
    import zmq

    from cis.runtime import protocol as P

    root = Running(Node(NodeConfig("root", 2, bind=_addr(), queue_limit=1), stages()))
    closing.append(root)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.connect(root.node.cfg.bind)
    try:
        P.send(s, P.encode(P.INFER, 9, {"features": np.zeros((2, 4), np.float32)}, stage=2))
        assert s.poll(5000)
        first = P.decode(s.recv_multipart())
        assert first.id == 9 and first.kind == P.ERROR and first.head.code == "too_many_samples"
        P.send(s, P.encode(P.INFER, 9, {"features": np.zeros((1, 4), np.float32)}, stage=2))  # the same id, again
        assert s.poll(5000)
        again = P.decode(s.recv_multipart())
        assert again.id == 9 and again.kind == P.RESULT
    finally:
        s.close()
    assert root.node.status()["duplicates"] == 0
