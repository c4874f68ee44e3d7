"""FLAME's patience rule as a measure of the one exit policy, and the runtime node applying it across tiers."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_runtime_node import Running

from cis.core.errors import CisError
from cis.core.policy import patience as pt
from cis.core.policy.exit_policy import ExitPolicy, evaluate_patience
from cis.core.topologies import make_spec
from cis.runtime import protocol as P
from cis.runtime.client import Client
from cis.runtime.feeds import check_feeds as _check_feeds
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig

T = namedtuple("T", "name shape dtype")


def test_patience_policy_json_and_validation():
    pol = ExitPolicy("patience", {}, 4)
    assert pol.uses_patience and pol.to_json() == {"measure": "patience", "thresholds": {}, "patience": 4}
    assert ExitPolicy.from_json(pol.to_json()) == pol
    assert "patience" not in ExitPolicy("max_softmax", {"a": 0.5}).to_json()
    with pytest.raises(CisError):
        ExitPolicy("patience", {})
    with pytest.raises(CisError):
        ExitPolicy("patience", {}, 0)
    with pytest.raises(CisError):
        ExitPolicy("max_softmax", {}, 3)
    with pytest.raises(CisError):
        pol.decide("a", np.zeros((1, 3)))


def test_policy_rule_equals_training_patience_forward():
    """One rule: the policy's decision exit by exit, cis.core.policy.patience.exit_points and FLAME's training
    forward agree."""
    from cis.training.methods.flame import patience_forward
    from cis.training.methods.vit import ViTEE

    torch.manual_seed(0)
    model = ViTEE(
        num_classes=3, exits=(1, 2, 3, 4), in_channels=1, input_size=8, patch=2, dim=16, depth=4, heads=2
    ).eval()
    x = torch.randn(64, 1, 8, 8)
    with torch.no_grad():
        logits = [z.numpy() for z in model(x)]
    for p in (1, 2, 3):
        pol = ExitPolicy("patience", {}, p)
        state, served_at = pt.initial_state(len(x)), np.zeros(len(x), np.int64)
        for e, z in enumerate(logits, start=1):
            done, state = pol.decide_patience(z, state, last=e == len(logits))
            served_at = np.where((served_at == 0) & done, e, served_at)
        with torch.no_grad():
            _, trained_at = patience_forward(model, x, p)
        assert (served_at == pt.exit_points(logits, p)).all()
        assert (served_at == trained_at).all()


def test_evaluate_patience_serves_each_sample_at_its_patience_exit():
    spec = make_spec("paper-7", "33-33-34")
    labels = np.array([[0, 0, 1], [0, 1, 1], [2, 2, 2], [1, 0, 2]])  # predicted class per exit
    logits = {e: np.eye(3)[labels[:, e - 1]] * 5 for e in (1, 2, 3)}
    y = np.array([0, 1, 2, 0])
    ev = evaluate_patience(spec, logits, y, 2)
    assert ev.exit_shares == {1: 0.0, 2: 0.5, 3: 0.5}
    assert ev.accuracy == pytest.approx(0.75)  # answers: 0 at exit 2, 1 at 3, 2 at 2 (right), 2 at 3 (wrong)
    assert (pt.exit_points_from_labels(labels, 2) == [2, 3, 2, 3]).all()


def test_check_feeds_accepts_the_patience_state_both_or_neither():
    inputs = (T("features", (None, 3), "float32"),)
    f = np.zeros((2, 3), np.float32)
    state = (pt.LABEL, pt.COUNT)
    lab, cnt = np.zeros(2, np.int64), np.ones(2, np.int64)
    assert _check_feeds(inputs, {"features": f}, state) == (None, 2)
    assert _check_feeds(inputs, {"features": f, pt.LABEL: lab, pt.COUNT: cnt}, state) == (None, 2)
    assert _check_feeds(inputs, {"features": f, pt.LABEL: lab}, state)[0]
    assert _check_feeds(inputs, {"features": f, pt.LABEL: lab, pt.COUNT: cnt.astype(np.int32)}, state)[0]
    assert _check_feeds(inputs, {"features": f, pt.LABEL: lab, pt.COUNT: cnt[:1]}, state)[0]
    assert _check_feeds(inputs, {"features": f, pt.LABEL: lab, pt.COUNT: cnt})[0]  # not a patience node: refused


@dataclass
class LabelStage:
    """Exit k predicts class x[:, k-1] (the input holds each exit's label); the carry is the input."""

    k: int

    @property
    def inputs(self):
        return (T("input" if self.k == 1 else f"features_{self.k - 1}", (None, 3), "float32"),)

    @property
    def outputs(self):
        return (T("logits", (None, 3), "float32"), T(f"features_{self.k}", (None, 3), "float32"))

    def run(self, feeds):
        x = next(iter(feeds.values()))
        return {"logits": (np.eye(3, dtype=np.float32)[x[:, self.k - 1].astype(int)] * 5), f"features_{self.k}": x}


def test_node_carries_the_patience_state_to_the_parent():
    """A leaf (exit 1) forwards the state; the root (exits 2, 3) continues the count from it."""
    stages = {k: LabelStage(k) for k in (1, 2, 3)}
    raddr, laddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    kw = dict(measure="patience", patience=2)
    root = Running(Node(NodeConfig("root", 3, bind=raddr, **kw), stages))
    leaf_node = Node(
        NodeConfig(
            "leaf", 1, bind=laddr, parent=raddr, heartbeat=0.05, heartbeat_timeout=0.5, forward_timeout=1.0, **kw
        ),
        {1: stages[1]},
    )
    assert leaf_node.executor.controller is None and leaf_node.executor.carry_names == ["features_1"]
    leaf = Running(leaf_node)
    try:
        import time

        end = time.monotonic() + 5
        while not leaf_node.parent_up and time.monotonic() < end:
            time.sleep(0.02)
        x = np.array([[0, 0, 1], [0, 1, 1], [2, 2, 2], [1, 0, 2]], np.float32)
        with Client(laddr, timeout=5) as c:
            r = c.infer(x)
        assert r.exit.tolist() == [2, 3, 2, 3]  # exit 2 only if the count from exit 1 came along
        assert r.cls.tolist() == [0, 1, 2, 2]
        assert r.served_by == ["root"] * 4 and not r.degraded.any()
        assert r.confidence.tolist() == [2, 2, 2, 1]  # the count at the serving exit
        with Client(
            raddr, timeout=5
        ) as c:  # entering at the root: it runs exits 1..3 and serves at the first patient one
            r = c.infer(x)
            assert r.exit.tolist() == [2, 3, 2, 3] and r.cls.tolist() == [0, 1, 2, 2]
        # a forward with a state of the wrong dtype is refused
        import zmq

        s = zmq.Context.instance().socket(zmq.DEALER)
        s.linger = 0
        s.connect(raddr)
        P.send(
            s,
            P.encode(
                P.FORWARD,
                9,
                {"features_1": x, pt.LABEL: np.zeros(4, np.int32), pt.COUNT: np.ones(4, np.int64)},
                stage=2,
            ),
        )
        assert s.poll(3000)
        msg = P.decode(s.recv_multipart())
        assert msg.kind == P.ERROR and msg.header["code"] == "bad_tensor"
        s.close()
    finally:
        leaf.close()
        root.close()
