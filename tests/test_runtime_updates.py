"""Bundle identity and updates inside a node, with tiny numpy stages on real sockets (no bundle files): a forward
names its bundle and only a node holding it continues it; load, switch, drop and reload keep every request with
the bundle it entered with; the refusals of the update kinds. docs/protocol.md, *Bundle identity* and *Updating a
model*; the real bundles and `cis rollout` are in tests/test_rollout.py."""

from __future__ import annotations

import logging
import threading
import time
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.policy.exit_policy import ExitPolicy
from cis.runtime import protocol as P
from cis.runtime.client import Client, ServerError
from cis.runtime.executor import Executor
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig
from cis.runtime.versions import Version

T = namedtuple("T", "name shape dtype")
A, B = "a" * 64, "b" * 64  # two bundles' manifest sha256; their ids are the first 16 digits
UNSURE = np.array([[0.1, 0, 0, 0]], np.float32)  # forwarded by a leaf (threshold 0.9)


@dataclass
class FakeStage:
    inputs: tuple
    outputs: tuple
    fn: object
    calls: int = 0

    def run(self, feeds):
        self.calls += 1
        return self.fn(feeds)


def stages(cls: int) -> dict:
    """Stage 1: logits from the first 3 inputs, carry = the input doubled; stage 2 always answers ``cls``: two
    bundles that differ only in stage 2 give different answers to the same carry."""
    s1 = FakeStage(
        (T("input", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32")),
        lambda f: {"logits": f["input"][:, :3] * 10, "features": f["input"] * 2},
    )
    row = np.zeros(3, np.float32)
    row[cls] = 50
    s2 = FakeStage(
        (T("features", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"),),
        lambda f: {"logits": np.tile(row, (len(f["features"]), 1))},
    )
    return {1: s1, 2: s2}


def version(sha: str, cls: int, exit: int = 2, node: str = "root") -> Version:
    """The bundle ``sha`` as the root (exit 2) holds it: what a loader (cis.runtime.factory.load_version) gives."""
    policy = ExitPolicy("max_softmax", {node: -np.inf})
    v = Version(sha[:16], {k: s for k, s in stages(cls).items() if k <= exit}, policy, exit)
    v.path, v.sha256 = f"/bundles/{sha[:16]}", sha
    return v


class Running:
    def __init__(self, node: Node):
        self.node, self.stop, ready = node, threading.Event(), threading.Event()
        kw = dict(install_signals=False, ready=ready.set, stop=self.stop.is_set)
        self.thread = threading.Thread(target=node.run, kwargs=kw, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def close(self):
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def tree():
    """make(root_sha, leaf_sha): a root (exit 2; stage 2 answers class 2) and a leaf (exit 1) serving bundles
    of those manifest digests; returns (leaf address, root address, leaf node, root node)."""
    started = []

    def make(root_sha=A, leaf_sha=A, root_kw=None):
        raddr, laddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        root = Node(NodeConfig("root", 2, bind=raddr, bundle_sha256=root_sha, **(root_kw or {})), stages(2))
        started.append(Running(root))
        cfg = dict(bind=laddr, parent=raddr, parent_id="root", threshold=0.9, heartbeat=0.05, heartbeat_timeout=0.5)
        leaf = Node(NodeConfig("leaf", 1, bundle_sha256=leaf_sha, forward_timeout=2.0, **cfg), {1: stages(2)[1]})
        started.append(Running(leaf))
        end = time.monotonic() + 5
        while not leaf.parent_up and time.monotonic() < end:
            time.sleep(0.02)
        return laddr, raddr, leaf, root

    yield make
    for r in reversed(started):
        r.close()


def test_a_forward_of_a_bundle_the_parent_does_not_hold_is_refused_and_served_degraded_at_the_child(tree, caplog):
    """The issue's silent mix: a leaf of another training run forwards carries its parent would continue with
    other weights. Now the parent refuses them (bundle_mismatch), the leaf answers from its own exit, flagged
    degraded, both count it, and each logs it once however many follow."""
    laddr, raddr, leaf, root = tree(A, B)
    with caplog.at_level(logging.WARNING, logger="cis.runtime.node"), Client(laddr, timeout=5) as c:
        results = [c.infer(UNSURE) for _ in range(5)]
        leaf_status = c.status()
    for r in results:
        assert r.served_by == ["leaf"] and r.degraded.all() and r.exit.tolist() == [1]
        assert r.bundle == B[:16]  # the leaf's own bundle answered: the one the request entered with
    with Client(raddr) as c:
        root_status = c.status()
    assert root_status["bundle_mismatch"]["refused"] == 5 and root_status["errors_by_code"]["bundle_mismatch"] == 5
    assert root_status["served"] == 0  # the parent ran nothing of them
    assert leaf_status["bundle_mismatch"]["parent"] == 5 and leaf_status["degraded"] == 5
    events = [r.event for r in caplog.records if hasattr(r, "event")]
    assert events.count("bundle_mismatch") == 1 and events.count("parent_bundle_mismatch") == 1
    refused = next(r for r in caplog.records if getattr(r, "event", "") == "bundle_mismatch").fields
    assert refused == {"node": "root", "peer": "leaf", "bundle": B[:16], "held": [A[:16]]}


def test_a_forward_of_the_same_bundle_is_continued_and_the_result_names_it(tree):
    laddr, _, _, _ = tree(A, A)
    with Client(laddr, timeout=5) as c:
        r = c.infer(UNSURE)
    assert r.served_by == ["root"] and not r.degraded.any() and r.cls.tolist() == [2] and r.bundle == A[:16]


def test_a_forward_that_names_no_bundle_is_refused_by_a_node_that_has_one(tree):
    """A child of protocol version 1 names no bundle: its carry cannot be matched, so it is not continued."""
    _, raddr, _, _ = tree(A, A)
    carry = {"features": np.zeros((1, 4), np.float32)}
    with Client(raddr, timeout=5) as c:
        for rid, (v, fields) in enumerate(((1, {}), (2, {}), (2, {"bundle": B[:16]})), start=9):  # new ids: a
            # repeated one is a retry, answered once (cis.runtime.seen)
            c.sock.send_multipart(P.encode(P.FORWARD, rid, carry, v=v, stage=2, sender="old", **fields))
            msg = P.decode(c.sock.recv_multipart())
            assert msg.kind == P.ERROR and msg.head.code == "bundle_mismatch" and msg.head.v == v, (v, fields)
            assert A[:16] in msg.head.message
        assert c.status()["bundle_mismatch"]["refused"] == 3
        ok = P.encode(P.FORWARD, 12, carry, stage=2, sender="leaf", bundle=A[:16])
        c.sock.send_multipart(ok)
        assert P.decode(c.sock.recv_multipart()).kind == P.RESULT


def test_a_result_of_another_bundle_is_not_taken_by_the_child():
    """Even from a parent that ignored the forward's bundle (an older version), an answer naming another bundle
    (or none) never fills the samples: they are served here, degraded."""
    from tests.test_runtime_executor import Outbox

    out = Outbox()
    ex = Executor(NodeConfig("leaf", 1, parent="tcp://x", threshold=0.9, bundle_sha256=A), stages(2), out)
    for rid, answer in ((1, B[:16]), (2, "")):
        assert ex.admit([b"c"], P.decode(P.encode(P.INFER, rid, {"input": UNSURE})), time.monotonic()) is None
        ex.run_batch()
        pending, carry = out.forwards[-1]
        assert pending.version.id == A[:16]
        four = {"class": np.array([2]), "confidence": np.array([1.0], np.float32), "exit": np.array([2], np.int32),
                "flags": np.zeros(1, np.uint8)}  # fmt: skip
        fields = {"bundle": answer} if answer else {}
        ex.from_parent(pending, P.decode(P.encode(P.RESULT, 7, four, served_by=["root"], **fields)))
        reply = out.replies[-1]
        assert reply.req_id == rid and reply.served_by == ["leaf"] and reply.flags.tolist() == [P.FLAG_DEGRADED]
    assert ex.counters["bundle_mismatch_parent"] == 2 and ex.counters["degraded"] == 2


def test_a_batch_holds_one_bundle_and_each_request_is_answered_by_the_bundle_it_entered_with():
    """A root holding two bundles, requests of both queued alternately: every batch runs one bundle's stages, and
    each request gets its own bundle's answer (class 2 from A, class 1 from B)."""
    from tests.test_runtime_executor import Outbox

    out = Outbox()
    ex = Executor(NodeConfig("root", 2, bundle_sha256=A, max_batch=32), stages(2), out)
    b = ex.versions.add(version(B, 1))
    carry = {"features": np.zeros((1, 4), np.float32)}
    for rid in range(1, 9):
        msg = P.decode(P.encode(P.FORWARD, rid, carry, stage=2, bundle=B[:16] if rid % 2 else A[:16]))
        assert ex.admit([b"c"], msg, time.monotonic()) is None
    while ex.queue:
        ex.run_batch()
    answers = {r.req_id: (int(r.cls[0]), r.version.id) for r in out.replies}
    assert answers == {rid: (1, B[:16]) if rid % 2 else (2, A[:16]) for rid in range(1, 9)}
    assert ex.counters["batches"] == 8  # alternating bundles: no batch mixes them
    assert b.stages[2].calls == 4 and ex.versions.held[A[:16]].stages[2].calls == 4
    assert all(v.active == 0 for v in ex.versions.held.values())


def test_load_switch_drop_keep_every_request_with_its_bundle(tree):
    """A parent holding both bundles continues each child's carry with the child's bundle; switch moves only new
    client requests; drop removes the old one once nothing uses it."""
    laddr, raddr, leaf, root = tree(A, A)
    root.updates.loader = lambda path: version(B, 1)
    with Client(raddr, timeout=5) as c:
        st = c.control(P.LOAD, path="/bundles/b")
        assert [h["id"] for h in st["bundles"]] == [A[:16], B[:16]] and st["bundle"] == A[:16]
        assert root.versions == [A[:16], B[:16]]  # newest last
        st = c.control(P.SWITCH, bundle=B[:16])
        assert st["bundle"] == B[:16] and {h["id"]: h["state"] for h in st["bundles"]} == {
            A[:16]: "held", B[:16]: "current"}  # fmt: skip
    with Client(laddr, timeout=5) as c:  # the leaf still serves A: the root continues its carry with A
        r = c.infer(UNSURE)
    assert r.served_by == ["root"] and r.cls.tolist() == [2] and r.bundle == A[:16] and not r.degraded.any()
    with Client(raddr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.control(P.DROP, bundle=B[:16])
        assert err.value.code == "bad_bundle" and "switch first" in err.value.message
        st = c.control(P.DROP, bundle=A[:16])
        end = time.monotonic() + 5
        while len(st["bundles"]) > 1 and time.monotonic() < end:
            time.sleep(0.05)
            st = c.status()
        assert [h["id"] for h in st["bundles"]] == [B[:16]]
        with pytest.raises(ServerError) as err:
            c.control(P.SWITCH, bundle=A[:16])
        assert err.value.code == "bundle_mismatch"
    with Client(laddr, timeout=5) as c:  # now the leaf's bundle A is gone at the root: refused, degraded
        r = c.infer(UNSURE)
    assert r.served_by == ["leaf"] and r.degraded.all()


def test_a_failed_load_leaves_the_node_serving_as_before_and_one_load_runs_at_a_time(tree):
    _, raddr, _, root = tree(A, A)

    def broken(path):
        raise CisError(f"{path}/stages/stage2.onnx: sha256 is 0123..., manifest says 4567...; the file was changed")

    root.updates.loader = broken
    with Client(raddr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.control(P.LOAD, path="/bundles/x")
        assert err.value.code == "bad_bundle" and "sha256" in err.value.message
        st = c.status()
        assert st["bundle"] == A[:16] and len(st["bundles"]) == 1 and st["loading"] is None
        gate = threading.Event()
        root.updates.loader = lambda path: (gate.wait(5), version(B, 1))[1]
        first = c.send_control(P.LOAD, path="/bundles/b")
        time.sleep(0.1)
        with pytest.raises(ServerError) as err:
            c.control(P.LOAD, path="/bundles/c")
        assert err.value.code == "busy"
        assert c.infer({"input": UNSURE}).exit.tolist() == [2]  # it serves while it loads
        gate.set()
        assert [h["id"] for h in c.await_status(first, 5)["bundles"]] == [A[:16], B[:16]]


def test_reload_switches_and_retires_the_old_bundle_once_unused(tree):
    _, raddr, _, root = tree(A, A, root_kw={"retire_after": 0.3})
    root.updates.loader = lambda path: version(B, 1)
    with Client(raddr, timeout=5) as c:
        st = c.control(P.RELOAD, path="/bundles/b")
        assert st["bundle"] == B[:16] and {h["id"]: h["state"] for h in st["bundles"]}[A[:16]] == "retiring"
        assert c.infer({"input": UNSURE}).cls.tolist() == [1]  # the new bundle's stage 2
        end = time.monotonic() + 5
        while len(c.status()["bundles"]) > 1 and time.monotonic() < end:
            time.sleep(0.05)
        assert root.versions == [B[:16]] and root.cfg.bundle_sha256 == B


def test_a_node_without_a_bundle_folder_cannot_load(tree):
    _, raddr, _, _ = tree(A, A)
    with Client(raddr, timeout=5) as c, pytest.raises(ServerError) as err:
        c.control(P.LOAD, path="/bundles/b")
    assert err.value.code == "bad_bundle" and "without a bundle folder" in err.value.message
