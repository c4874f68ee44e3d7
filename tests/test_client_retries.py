"""Client retries (issue 41 item 4), with real node processes that a test kills: a request whose entry node died
(its connection closed, 'shutting_down', or no reply by the retry deadline) is sent once more with the same id, to
another entry node or to the same address once the node is back; nothing is lost."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from replica_nodes import Running, spawn, stages

from cis.runtime.client import Client, ServerError
from cis.runtime.node import Node, NodeConfig
from cis.runtime.ports import free_port
from cis.runtime.result_summary import summarize

X = np.array([[0.1, 0, 0, 0]], np.float32)  # served at stage 2 of an entry node of exit 2: class 2


def _addr() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def procs():
    started: list = []
    yield started
    for p in started:
        if isinstance(p, Running):
            p.close()
        elif p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)


def _collect(c: Client, want: int, got: list, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < end, f"{len(got)} of {want} answered"
        got += c.poll(0.2)


def test_an_entry_node_killed_under_load_loses_nothing_its_requests_go_to_another(procs):
    a, b = _addr(), _addr()
    procs += [spawn("root", a, delay=0.02), spawn("root", b, delay=0.02)]
    got: list = []
    with Client([a, b], timeout=30) as c:
        for _ in range(300):
            c.submit(X)
        _collect(c, 100, got)
        procs[0].send_signal(signal.SIGKILL)  # requests in flight there die with it
        procs[0].wait(10)
        _collect(c, 300, got)
    results = [r for _, r in got]
    assert len({rid for rid, _ in got}) == 300 and all(r.error is None for r in results)
    assert all(r.cls.tolist() == [2] for r in results)
    summary = summarize(results)
    assert summary["errors"] == {} and 0 < summary["retried"] == sum(r.retried for r in results)


def test_with_one_entry_node_the_retry_waits_for_its_restart(procs):
    a = _addr()
    procs.append(spawn("root", a, delay=0.02))
    got: list = []
    with Client(a, timeout=30) as c:
        for _ in range(100):
            c.submit(X)
        _collect(c, 30, got)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        got += c.poll(0.3)  # the client sees the connection close, and sends again into the same address
        procs.append(spawn("root", a))  # the launcher's restart
        _collect(c, 100, got)
    results = [r for _, r in got]
    assert all(r.error is None and r.cls.tolist() == [2] for r in results) and len(results) == 100
    assert any(r.retried for r in results)


def test_no_reply_by_the_retry_deadline_goes_to_another_entry_node(procs):
    a, b = _addr(), _addr()
    procs += [spawn("root", a), spawn("root", b)]
    procs[0].send_signal(signal.SIGSTOP)  # hangs: connected, but never answers
    with Client([a, b], timeout=10, retry_after=0.5) as c:
        results = c.infer_many(np.tile(X, (6, 1)), window=6)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # without retries, a request to the hung node gets no answer
            with Client(a, timeout=1.0, retry_after=0) as single:
                single.infer(X)
        assert time.monotonic() - t0 < 5
    assert all(r.error is None for r in results) and sum(r.retried for r in results) == 3
    assert all(r.latency >= 0.5 for r in results if r.retried)  # sent again after the deadline, not before


def _until(condition, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "the node never got there"
        time.sleep(0.01)


def test_shutting_down_is_retried_on_another_entry_node(procs):
    a, b = _addr(), _addr()
    slow = Running(Node(NodeConfig("root", 2, bind=a, max_batch=1), stages(delay=0.5)))
    procs += [slow, Running(Node(NodeConfig("root", 2, bind=b), stages()))]
    with Client(a, timeout=10) as busy:
        for _ in range(6):
            busy.submit(X)  # keeps node a draining for 3 s
        _until(lambda: slow.node.counters["requests"] == 6)  # all six read (and held) before the stop
        slow.node.request_stop()
        with Client([a, b], timeout=10) as c:  # its first request goes to a, which refuses: stopping
            r = c.infer(X)
        assert r.retried and r.cls.tolist() == [2]
        got: list = []
        _collect(busy, 6, got)  # the requests a held are still answered
    assert slow.node.errors_by_code["shutting_down"] == 1


def test_with_one_entry_node_shutting_down_is_the_answer_not_a_silent_retry(procs):
    """The stopping node would take a retry of the same id as a duplicate: with no other entry node the client
    answers shutting_down at once instead of waiting for nothing."""
    a = _addr()
    slow = Running(Node(NodeConfig("root", 2, bind=a, max_batch=1), stages(delay=0.5)))
    procs.append(slow)
    with Client(a, timeout=10) as busy:
        for _ in range(6):
            busy.submit(X)
        _until(lambda: slow.node.counters["requests"] == 6)  # all six read (and held) before the stop
        slow.node.request_stop()
        with Client(a, timeout=5) as c, pytest.raises(ServerError) as err:
            c.infer(X)
        assert err.value.code == "shutting_down"
        got: list = []
        _collect(busy, 6, got)


def test_a_stopping_node_answers_what_waits_unread_instead_of_dropping_it(procs):
    """Requests that reach a node while its last batch runs wait unread in its socket; when it stops after that
    batch they are answered 'shutting_down' (a client with another entry node retries there), never silence."""
    a = _addr()
    slow = Running(Node(NodeConfig("root", 2, bind=a, max_batch=1), stages(delay=1.0)))
    procs.append(slow)
    with Client(a, timeout=10, retry_after=0) as c:
        c.submit(X)
        _until(lambda: slow.node.counters["batches"] == 1)  # its one batch runs for a second
        for _ in range(3):
            c.submit(X)
        time.sleep(0.1)
        slow.node.request_stop()
        got: list = []
        _collect(c, 4, got)
    codes = sorted(r.error.code if r.error else "ok" for _, r in got)
    assert codes == ["ok", "shutting_down", "shutting_down", "shutting_down"]
    slow.thread.join(10)
    assert not slow.thread.is_alive() and slow.node.errors_by_code["shutting_down"] == 3


def test_a_drain_that_runs_out_of_time_answers_what_is_still_queued(procs):
    """A node that cannot finish its queue within drain_timeout answers the rest 'shutting_down' as it exits."""
    a = _addr()
    slow = Running(Node(NodeConfig("root", 2, bind=a, max_batch=1, drain_timeout=0.5), stages(delay=1.0)))
    procs.append(slow)
    with Client(a, timeout=15, retry_after=0) as c:
        for _ in range(4):
            c.submit(X)
        _until(lambda: slow.node.counters["requests"] == 4)
        slow.node.request_stop()  # at most one more one-second batch fits in the half-second drain
        got: list = []
        _collect(c, 4, got)
    codes = [r.error.code if r.error else "ok" for _, r in got]
    assert set(codes) == {"ok", "shutting_down"} and len({rid for rid, _ in got}) == 4
    assert slow.node.errors_by_code["shutting_down"] == codes.count("shutting_down")
