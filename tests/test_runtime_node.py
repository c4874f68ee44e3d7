"""The node's behaviour in-process, with tiny numpy stages (no bundle): policy split, micro-batching,
error replies, overload, transfer cap, degraded service without a parent, CurveZMQ allow-lists."""

from __future__ import annotations

import threading
import time
from collections import namedtuple
from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
import zmq

from cis.runtime import protocol as P
from cis.runtime.client import Client, ServerError
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig
from cis.runtime.security import CurveConfig, make_keys

T = namedtuple("T", "name shape dtype")


@dataclass
class FakeStage:
    inputs: tuple
    outputs: tuple
    fn: object
    delay: float = 0.0

    def run(self, feeds):
        if self.delay:
            time.sleep(self.delay)
        return self.fn(feeds)


def _stages():
    # stage 1: logits from the first 3 inputs (large first value -> confident), carry = the input doubled
    s1 = FakeStage(
        (T("input", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32")),
        lambda f: {"logits": f["input"][:, :3] * 10, "features": f["input"] * 2},
    )
    # stage 2: always confident in class 2
    s2 = FakeStage(
        (T("features", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"),),
        lambda f: {"logits": np.tile(np.array([0, 0, 50], np.float32), (len(f["features"]), 1))},
    )
    return {1: s1, 2: s2}


class Running:
    def __init__(self, node: Node):
        self.node = node
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=node.run,
            kwargs=dict(install_signals=False, ready=self.ready.set, stop=self.stop.is_set),
            daemon=True,
        )
        self.thread.start()
        assert self.ready.wait(5)

    def close(self):
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def tree():
    """A root (exit 2) and a leaf (exit 1, threshold 0.9) on free loopback ports."""
    started = []

    def make(leaf_kw=None, root=True, root_kw=None, root_stages=None):
        raddr, laddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        if root:
            root_cfg = NodeConfig("root", 2, bind=raddr, **(root_kw or {}))
            started.append(Running(Node(root_cfg, root_stages or _stages())))
        cfg = dict(bind=laddr, parent=raddr, threshold=0.9, heartbeat=0.05, heartbeat_timeout=0.5, forward_timeout=0.5)
        cfg.update(leaf_kw or {})
        stages = _stages()
        leaf = Node(NodeConfig("leaf", 1, **cfg), {1: stages[1]})
        started.append(Running(leaf))
        if root:  # wait for the first heartbeat answer
            end = time.monotonic() + 5
            while not leaf.parent_up and time.monotonic() < end:
                time.sleep(0.02)
        return laddr, raddr, leaf

    yield make
    for r in reversed(started):
        r.close()


def _batch():
    # rows 0,1 confident at exit 1 (class 0); rows 2,3 uncertain -> forwarded -> class 2 at exit 2
    return np.array([[5, 0, 0, 0], [0, 5, 0, 0], [0.1, 0, 0, 0], [0, 0.1, 0.1, 0]], np.float32)


def test_confident_served_here_others_at_the_parent(tree):
    laddr, raddr, leaf = tree()
    with Client(laddr, timeout=5) as c:
        r = c.infer(_batch())
        assert r.cls.tolist() == [0, 1, 2, 2]
        assert r.exit.tolist() == [1, 1, 2, 2]
        assert r.served_by == ["leaf", "leaf", "root", "root"]
        assert not r.degraded.any()
        assert r.confidence[0] > 0.99
        many = c.infer_many(np.tile(_batch(), (25, 1)), batch_size=1, window=50)
        assert [int(x.exit[0]) for x in many] == [1, 1, 2, 2] * 25
        st = c.status()
    assert st["served"] == 52 and st["forwarded"] == 52 and st["requests"] == 101
    assert st["batches"] < st["requests"]  # requests that waited were batched together
    with Client(raddr) as c:
        assert c.status()["served"] == 52


def test_bad_messages_get_error_replies_and_the_node_keeps_serving(tree):
    laddr, _, _ = tree(root=False)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(laddr)
    good_header = P.encode(P.INFER, 5, {"input": np.zeros((1, 4), np.float32)})[0]
    cases = {
        "bad_message": [b"not msgpack \xc1"],
        "bad_version": [msgpack.packb({"v": 3, "kind": "infer", "id": 1})],
        "unknown_kind": [msgpack.packb({"v": 1, "kind": "result", "id": 1})],
        "bad_tensor": P.encode(P.INFER, 3, {"input": np.zeros((1, 4), np.float64)}),
        "bad_stage": P.encode(P.INFER, 4, {"input": np.zeros((1, 4), np.float32)}, stage=3),
    }
    for code, frames in cases.items():
        P.send(s, frames)
        assert s.poll(3000)
        msg = P.decode(s.recv_multipart())
        assert msg.kind == P.ERROR and msg.header["code"] == code, msg.header
    P.send(s, [good_header, np.zeros((1, 5), np.float32)])
    assert s.poll(3000)
    err = P.decode(s.recv_multipart())
    assert err.header["code"] == "bad_tensor" and err.id == 5 and "bytes" in err.header["message"]
    s.close()
    with Client(laddr, timeout=5) as c:
        assert c.infer(_batch()[:1]).cls.tolist() == [0]


def _dealer(addr):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.connect(addr)
    return s


def _ask(s, frames):
    P.send(s, frames)
    assert s.poll(3000), "no reply"
    return P.decode(s.recv_multipart())


def test_too_large_per_message_and_per_frame(tree):
    laddr, _, leaf = tree(root=False, leaf_kw=dict(max_message_bytes=4096))
    s = _dealer(laddr)
    # two frames of 2,400 bytes: each within the limit, the message over it: too_large, echoing the id
    two = P.encode(P.INFER, 11, {"input": np.zeros((150, 4), np.float32), "more": np.zeros((150, 4), np.float32)})
    err = _ask(s, two)
    assert err.header["code"] == "too_large" and err.id == 11 and "4096" in err.header["message"]
    # one frame over the limit: ZeroMQ drops the connection (documented silence); the node keeps serving
    P.send(s, P.encode(P.INFER, 12, {"input": np.zeros((300, 4), np.float32)}))
    assert not s.poll(500)
    s.close()
    with Client(laddr, timeout=5) as c:
        assert c.infer(_batch()[:1]).cls.tolist() == [0]


def test_overloaded_and_too_many_samples(tree):
    laddr, _, leaf = tree(root=False, leaf_kw=dict(queue_limit=2))
    with Client(laddr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.infer(np.zeros((3, 4), np.float32) + [5, 0, 0, 0])
        assert err.value.code == "too_many_samples" and "split" in err.value.message
    leaf.stages[1].delay = 0.2  # slow stage: requests pile up
    with Client(laddr, timeout=10) as c:
        results = c.infer_many(np.zeros((8, 4), np.float32) + [5, 0, 0, 0], batch_size=1, window=8)
        st = c.status()
    codes = [r.error.code if r.error else "ok" for r in results]
    assert "overloaded" in codes and "ok" in codes  # every request got exactly one reply
    assert st["overloaded"] == codes.count("overloaded") == st["errors_by_code"]["overloaded"]
    assert st["queue_limit"] == 2 and st["queue_depth"] == 0


def test_status_reports_the_queue_and_the_wait_clients_see(tree):
    laddr, _, leaf = tree(root=False, leaf_kw=dict(max_batch=1))
    leaf.stages[1].delay = 0.3
    with Client(laddr, timeout=10) as c, Client(laddr, timeout=10) as watcher:
        for _ in range(6):
            c.submit(_batch()[:1])
        end = time.monotonic() + 10
        while leaf.counters["batches"] == 0 and time.monotonic() < end:
            time.sleep(0.01)
        st = watcher.status()  # the first batch runs (0.3 s a batch), the rest wait
        assert 3 <= st["queue_depth"] == st["queue_requests"] <= 5
        got = []
        while len(got) < 6:
            got += c.poll(5)
        lat = sorted(r.latency for _, r in got)
        st = watcher.status()
    assert all(r.error is None for _, r in got)
    # the node's latency starts at arrival and includes the queue: its max is the client's last wait, not a stage's time
    p99 = st["latency"]["p99_s"]
    assert p99 > 0.45 and lat[-1] >= p99 * 0.9 and st["latency"]["count"] > 0


def test_no_parent_means_degraded_not_lost(tree):
    laddr, _, leaf = tree(root=False)
    with Client(laddr, timeout=5) as c:
        r = c.infer(_batch())
    assert r.exit.tolist() == [1, 1, 1, 1]
    assert r.degraded.tolist() == [False, False, True, True]


def test_transfer_cap_serves_the_overflow_here(tree):
    laddr, _, _ = tree(leaf_kw=dict(max_transfer_rate=1e-6, transfer_burst=1.0))
    with Client(laddr, timeout=5) as c:
        r = c.infer(np.tile(_batch()[2:3], (5, 1)))
    assert r.exit.tolist().count(2) == 1  # the bucket's one token
    assert r.capped.sum() == 4 and not r.degraded.any()


def test_adapt_moves_the_threshold_to_hold_the_target_share(tree):
    # target: forward nothing; the uncertain row (confidence 0.58) starts above the threshold 0.9's reach
    laddr, _, leaf = tree(leaf_kw=dict(adapt=True, adapt_target=0.0, adapt_gain=0.5))
    row = _batch()[2:3]
    with Client(laddr, timeout=5) as c:
        exits = [int(c.infer(row).exit[0]) for _ in range(60)]
        st = c.status()
    assert exits[0] == 2 and exits[-20:] == [1] * 20  # forwarded at first, then served here
    assert st["adapt"]["updates"] == 60 and st["adapt"]["target_forwarded_share"] == 0.0
    assert st["threshold"] == st["adapt"]["threshold"] < 0.57
    assert st["capped"] == 0 and st["degraded"] == 0


def test_deadlines_end_work(tree):
    laddr, _, leaf = tree(leaf_kw=dict(max_batch=1))
    with Client(laddr, timeout=5) as c:
        assert c.infer(_batch()[2:3]).exit.tolist() == [2]
        with pytest.raises(ServerError) as err:  # already past on arrival: no stage runs
            c.infer(_batch()[:1], deadline=time.time() - 0.5)
        assert err.value.code == "deadline_exceeded"
        leaf.stages[1].delay = 0.3
        c.submit(_batch()[:1])  # keeps the leaf busy
        rid = c.submit(_batch()[:1], deadline=time.time() + 0.1)  # expires while it waits
        got = dict(c.poll(3) + c.poll(3))
        assert got[rid].error.code == "deadline_exceeded"
        leaf.stages[1].delay = 0.0
        st = c.status()
    assert st["errors_by_code"]["deadline_exceeded"] == 2  # on arrival or in the queue (tests/test_runtime_executor.py)


def test_a_deadline_passing_at_the_parent_answers_degraded_from_here(tree):
    # the root takes 0.4 s a batch: a deadline 0.2 s out reaches the leaf in time (also on a loaded machine)
    # and passes while the parent works, before the leaf's heartbeat timeout (0.5 s) could call it down
    slow = _stages()
    slow[2].delay = 0.4
    laddr, raddr, leaf = tree(root_stages=slow)
    with Client(laddr, timeout=5) as c:
        assert c.infer(_batch()[2:3]).exit.tolist() == [2]
        # the deadline passes before the parent could answer: served here, marked degraded
        r = c.infer(_batch()[2:4], deadline=time.time() + 0.2)
    assert r.degraded.all() and r.exit.tolist() == [1, 1]


def test_a_stopping_node_waits_for_its_forwards_past_the_drain_timeout(tree):
    """A forward is answered by the parent or, past its forward timeout, from the node's own exit: a stop never
    cuts it off, even when the parent takes longer than the drain timeout."""
    slow = _stages()
    slow[2].delay = 1.5
    laddr, _, leaf = tree(root_stages=slow, leaf_kw=dict(drain_timeout=0.3, forward_timeout=5.0, heartbeat_timeout=5))
    with Client(laddr, timeout=10) as c:
        rid = c.submit(_batch()[2:3])  # uncertain at exit 1: forwarded
        end = time.monotonic() + 10
        while not leaf.pending and time.monotonic() < end:
            time.sleep(0.01)
        leaf.request_stop()
        got = []
        while not got and time.monotonic() < end:
            got = [r for i, r in c.poll(0.5) if i == rid]
    assert got and got[0].error is None and got[0].exit.tolist() == [2]


def test_non_finite_input_is_refused_with_bad_input(tree):
    laddr, raddr, leaf = tree()
    x = _batch()
    x[3, 1] = np.nan
    with Client(laddr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.infer(x)
        assert err.value.code == "bad_input" and "NaN" in err.value.message
    with Client(raddr) as c:
        assert c.status()["requests"] == 0  # never forwarded


def test_each_type_confused_header_field_is_answered_and_the_node_keeps_serving(tree):
    from test_protocol import BAD_VALUES, _infer

    laddr, _, leaf = tree(root=False)
    s = _dealer(laddr)
    sent = 0
    for field, (code, values) in BAD_VALUES.items():
        for value in values:
            err = _ask(s, _infer(**{field: value}))
            sent += 1
            assert err.kind == P.ERROR and err.header["code"] in (code, "bad_tensor"), (field, value, err.header)
            assert err.id == (0 if field == "id" else 77)
    s.close()
    with Client(laddr, timeout=5) as c:
        assert c.infer(_batch()[:1]).cls.tolist() == [0]
        assert c.status()["errors"] == sent


def test_curve_allow_list_refuses_unknown_keys(tmp_path):
    make_keys(tmp_path / "server", "node")
    make_keys(tmp_path / "allowed", "friend")
    make_keys(tmp_path / "other", "stranger")
    addr = f"tcp://127.0.0.1:{free_port()}"
    curve = CurveConfig(str(tmp_path / "server" / "node.key_secret"), str(tmp_path / "allowed"), None)
    run = Running(Node(NodeConfig("root", 2, bind=addr, curve=curve), _stages()))
    try:
        server_pub = str(tmp_path / "server" / "node.key")
        with Client(
            addr, timeout=3, curve=CurveConfig(str(tmp_path / "allowed" / "friend.key_secret"), None, server_pub)
        ) as c:
            assert c.infer(_batch()).exit.tolist() == [2, 2, 2, 2]
        with Client(
            addr, timeout=1, curve=CurveConfig(str(tmp_path / "other" / "stranger.key_secret"), None, server_pub)
        ) as c:
            with pytest.raises(TimeoutError):
                c.infer(_batch())
        with Client(addr, timeout=1) as c:  # plain text: no service either
            with pytest.raises(TimeoutError):
                c.infer(_batch())
        assert run.node.counters["requests"] == 1
    finally:
        run.close()


def test_a_failing_decision_answers_internal_and_the_node_keeps_serving(tree):
    laddr, _, leaf = tree(root=False)
    real = leaf.policy.decide
    leaf.policy.decide = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
    with Client(laddr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.infer(_batch())
        assert err.value.code == "internal" and "boom" in err.value.message
        leaf.policy.decide = real
        assert c.infer(_batch()[:1]).cls.tolist() == [0]


def test_a_parent_that_answers_garbage_cannot_break_its_child(tree):
    """Reply-side fields (served_by, code, message, tensors) type-confused by a bad parent: the child serves
    those samples itself, degraded, and keeps going."""
    ok = {
        "class": np.zeros(1, np.int64),
        "confidence": np.ones(1, np.float32),
        "exit": np.full(1, 2, np.int32),
        "flags": np.zeros(1, np.uint8),
    }
    garbage = [
        lambda rid: P.encode(P.RESULT, rid, ok, served_by=[7]),
        lambda rid: P.encode(P.RESULT, rid, ok, served_by="root"),
        lambda rid: P.encode(P.RESULT, rid, {**ok, "flags": np.zeros(1, np.int64)}, served_by=["root"]),
        lambda rid: P.encode(P.RESULT, rid, {k: v.repeat(2) for k, v in ok.items()}, served_by=["root"] * 2),
        lambda rid: P.encode(P.ERROR, rid, code=["x"], message=1),
        lambda rid: [msgpack.packb({"v": 1, "kind": "result", "id": rid})],
        lambda rid: [b"\xc1 not msgpack"],  # the id cannot be read: the forward times out
    ]
    paddr = f"tcp://127.0.0.1:{free_port()}"
    answers = list(garbage)
    stop = threading.Event()

    def bad_parent():
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.linger = 0
        sock.bind(paddr)
        while not stop.is_set():
            if not sock.poll(50):
                continue
            ident, *frames = sock.recv_multipart()
            msg = P.decode(frames)
            reply = P.encode(P.PONG, msg.id) if msg.kind == P.PING else answers.pop(0)(msg.id)
            sock.send_multipart([ident, *[bytes(memoryview(f)) for f in reply]])
        sock.close()

    thread = threading.Thread(target=bad_parent, daemon=True)
    thread.start()
    try:
        laddr, _, leaf = tree(root=False, leaf_kw=dict(parent=paddr, forward_timeout=0.3))
        end = time.monotonic() + 5
        while not leaf.parent_up and time.monotonic() < end:
            time.sleep(0.02)
        with Client(laddr, timeout=10) as c:
            results = [c.infer(_batch()[2:3]) for _ in garbage]  # unsure: each is forwarded, answered with garbage
            st = c.status()
    finally:
        stop.set()
        thread.join(5)
    assert not answers  # every forward reached the bad parent
    assert all(r.degraded.all() and r.exit.tolist() == [1] and r.served_by == ["leaf"] for r in results)
    assert st["degraded"] == len(garbage) and st["errors"] == 0


def test_a_spinning_node_serves_and_forwards_like_a_sleeping_one(tree):
    """--spin busy-polls instead of sleeping in poll; the answers and the heartbeat are the same."""
    laddr, raddr, leaf = tree(leaf_kw={"spin": True}, root_kw={"spin": True})
    assert leaf.parent_up  # heartbeats are sent and answered while both nodes spin
    with Client(laddr, timeout=5) as c:
        r = c.infer(_batch())
        assert r.cls.tolist() == [0, 1, 2, 2] and r.served_by == ["leaf", "leaf", "root", "root"]
        many = c.infer_many(np.tile(_batch(), (5, 1)), batch_size=1, window=8)
        assert [int(x.exit[0]) for x in many] == [1, 1, 2, 2] * 5


def test_serve_all_passes_spin_to_every_node():
    from cis.cli.commands.serve import _node_options
    from cis.cli.main import build_parser

    args = build_parser().parse_args(["serve", "bundle", "--all", "--spin"])
    assert args.spin and "--spin" in _node_options(args)
    assert "--spin" not in _node_options(build_parser().parse_args(["serve", "bundle", "--all"]))
