"""The node's batch executor without sockets: admission checks, isolation of a poisoned request,
non-finite input, deadlines, the bounded queue. Requests are real decoded messages."""

from __future__ import annotations

import time
from collections import namedtuple

import numpy as np

from cis.runtime import protocol as P
from cis.runtime.executor import Executor
from cis.runtime.node_config import NodeConfig

T = namedtuple("T", "name shape dtype")
POISON = 666.0


class CountingStage:
    """logits from the first 3 inputs (x10); carry = the input. Raises on a batch holding the poison value."""

    inputs = (T("input", (None, 4), "float32"),)
    outputs = (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32"))

    def __init__(self):
        self.batches: list[int] = []

    def run(self, feeds):
        x = feeds["input"]
        self.batches.append(len(x))
        if (x == POISON).any():
            raise RuntimeError("poisoned sample")
        return {"logits": x[:, :3] * 10, "features": x.copy()}


class Outbox:
    def __init__(self, parent_up=True, accept=True):
        self.parent_up = parent_up
        self.accept = accept
        self.replies, self.errors, self.forwards = [], [], []

    def reply(self, req):
        self.replies.append(req)

    def error(self, req, code, message):
        self.errors.append((req.req_id, code, message))

    def forward(self, pending, carry):
        self.forwards.append((pending, {k: np.array(v) for k, v in carry.items()}))
        return self.accept


def make(parent=None, **kw):
    stage, out = CountingStage(), Outbox()
    cfg = NodeConfig("leaf", 1, parent=parent, threshold=0.9, **kw)
    return Executor(cfg, {1: stage}, out), stage, out


def msg(rid, x, **fields):
    tensors = x if isinstance(x, dict) else {"input": np.asarray(x, np.float32)}
    return P.decode(P.encode(P.INFER, rid, tensors, **fields))


CONFIDENT = [5, 0, 0, 0]  # class 0, served at the leaf
UNSURE = [0.1, 0, 0, 0]  # forwarded by a leaf with a parent


def test_a_request_that_fails_validation_never_enters_a_batch():
    ex, stage, out = make()
    assert ex.admit([b"a"], msg(1, {"input": np.zeros((1, 4), np.float64)}), 0.0)[0] == "bad_tensor"
    assert ex.admit([b"a"], msg(2, np.zeros((1, 5))), 0.0)[0] == "bad_tensor"
    assert ex.admit([b"a"], msg(3, [CONFIDENT], stage=2), 0.0)[0] == "bad_stage"
    assert ex.admit([b"a"], msg(4, np.zeros((0, 4))), 0.0)[0] == "bad_tensor"  # empty batch
    assert ex.admit([b"a"], msg(5, [CONFIDENT, CONFIDENT]), 0.0) is None
    assert ex.queued == 2 and len(ex.queue) == 1
    ex.run_batch()
    assert stage.batches == [2] and [r.req_id for r in out.replies] == [5] and not out.errors


def test_a_poisoned_request_does_not_spoil_its_batch():
    ex, stage, out = make()
    for rid, rows in enumerate([[CONFIDENT], [[POISON, 0, 0, 0]], [CONFIDENT, [0, 5, 0, 0]]], start=1):
        assert ex.admit([b"c%d" % rid], msg(rid, rows), 0.0) is None
    ex.run_batch()  # one batch of 4 samples fails; each request is run again alone
    assert stage.batches == [4, 1, 1, 2]
    assert sorted(r.req_id for r in out.replies) == [1, 3]
    assert [(rid, code) for rid, code, _ in out.errors] == [(2, "internal")]
    assert "poisoned sample" in out.errors[0][2]
    assert out.replies[1].cls.tolist() == [0, 1] and ex.counters["isolated"] == 3


def test_non_finite_input_is_refused_by_default():
    ex, stage, out = make(parent="tcp://parent")
    x = np.array([CONFIDENT, UNSURE], np.float32)
    x[1, 2] = np.nan
    code, message = ex.admit([b"a"], msg(1, x), 0.0)
    assert code == "bad_input" and "1 of 2 samples" in message and "sample 1" in message
    x[1, 2] = np.inf
    assert ex.admit([b"a"], msg(2, x), 0.0)[0] == "bad_input"
    assert not ex.queue and not stage.batches


def test_non_finite_samples_flagged_are_answered_here_and_never_forwarded():
    ex, stage, out = make(parent="tcp://parent", nonfinite="flag")
    x = np.array([UNSURE, UNSURE, CONFIDENT], np.float32)
    x[0, 3] = -np.inf
    assert ex.admit([b"a"], msg(1, x), 0.0) is None
    ex.run_batch()
    ((pending, carry),) = out.forwards
    assert pending.n == 1 and np.isfinite(carry["features"]).all()  # only the finite unsure sample goes up
    ex.scatter(
        pending, np.array([2]), np.array([0.9], np.float32), np.array([2], np.int32), np.zeros(1, np.uint8), ["root"]
    )
    (r,) = out.replies
    assert r.cls.tolist() == [-1, 2, 0] and r.flags.tolist() == [P.FLAG_NONFINITE, 0, 0]
    assert np.isnan(r.conf[0]) and r.served_by == ["leaf", "root", "leaf"] and r.exit.tolist() == [1, 2, 1]


def test_a_request_past_its_deadline_is_answered_without_running():
    ex, stage, out = make()
    assert ex.admit([b"a"], msg(1, [CONFIDENT], deadline=time.time() - 1), 0.0)[0] == "deadline_exceeded"
    assert ex.admit([b"a"], msg(2, [CONFIDENT], deadline=time.time() + 0.05), 0.0) is None
    assert ex.admit([b"a"], msg(3, [CONFIDENT], deadline=time.time() + 60), 0.0) is None
    time.sleep(0.06)  # request 2's deadline passes while it waits in the queue
    ex.run_batch()
    assert [(rid, code) for rid, code, _ in out.errors] == [(2, "deadline_exceeded")]
    assert stage.batches == [1] and [r.req_id for r in out.replies] == [3] and ex.counters["expired"] == 1


def test_the_queue_is_bounded_and_a_request_that_could_never_fit_says_so():
    ex, stage, out = make(queue_limit=4, max_batch=2)
    assert ex.admit([b"a"], msg(1, [CONFIDENT] * 5), 0.0)[0] == "too_many_samples"
    assert ex.admit([b"a"], msg(2, [CONFIDENT] * 3), 0.0) is None
    assert ex.admit([b"a"], msg(3, [CONFIDENT] * 2), 0.0)[0] == "overloaded"
    assert ex.admit([b"a"], msg(4, [CONFIDENT]), 0.0) is None
    assert ex.queued == 4 and ex.counters["overloaded"] == 1
    assert ex.due(0.0)  # a full batch waits
    ex.run_batch()  # a request bigger than max_batch runs alone
    ex.run_batch()
    assert stage.batches == [3, 1] and ex.queued == 0


def test_max_wait_holds_a_batch_for_company():
    ex, stage, out = make(max_wait=0.5, max_batch=4)
    ex.admit([b"a"], msg(1, [CONFIDENT]), 10.0)
    assert not ex.due(10.2) and ex.due(10.5) and ex.due(10.2, draining=True)


def test_a_forward_that_cannot_go_is_served_here_degraded():
    ex, stage, out = make(parent="tcp://parent")
    out.accept = False
    ex.admit([b"a"], msg(1, [UNSURE, CONFIDENT]), 0.0)
    ex.run_batch()
    (r,) = out.replies
    assert r.flags.tolist() == [P.FLAG_DEGRADED, 0] and r.served_by == ["leaf", "leaf"]
    out.parent_up, out.accept = False, True
    ex.admit([b"a"], msg(2, [UNSURE]), 0.0)
    ex.run_batch()
    assert out.replies[1].flags.tolist() == [P.FLAG_DEGRADED] and len(out.forwards) == 1


def test_a_late_parent_answer_after_an_internal_error_is_not_a_second_reply():
    ex, stage, out = make(parent="tcp://parent")
    ex.admit([b"a"], msg(1, [UNSURE, CONFIDENT]), 0.0)

    def sent_then_failed(pending, carry):  # the forward went out, then deciding failed
        out.forwards.append((pending, carry))
        raise RuntimeError("boom")

    ex.out.forward = sent_then_failed
    ex.run_batch()
    assert [(rid, code) for rid, code, _ in out.errors] == [(1, "internal")]
    ex.fallback(out.forwards[0][0])
    assert not out.replies  # exactly one answer per request


def test_only_float_tensors_are_checked_and_per_sample():
    from cis.runtime.feeds import nonfinite_rows

    assert nonfinite_rows({"a": np.array([[1, 2]], np.int64)}, 1) is None
    assert nonfinite_rows({"a": np.array([[1.0, np.nan], [0, 0]], np.float16)}, 2).tolist() == [True, False]


OVERFLOW = [3.4e38] * 4  # finite, but x10 in the stage overflows: infinite logits and carry, a NaN confidence


def test_a_finite_input_that_overflows_in_the_network_is_refused_by_default_and_never_forwarded():
    ex, stage, out = make(parent="tcp://parent")
    assert ex.admit([b"a"], msg(1, [UNSURE, OVERFLOW]), 0.0) is None  # finite: admitted
    assert ex.admit([b"b"], msg(2, [UNSURE, CONFIDENT]), 0.0) is None  # shares the batch
    ex.run_batch()
    ((rid, code, message),) = out.errors
    assert (rid, code) == (1, "bad_input") and "1 of 2 samples overflow" in message and "sample 1" in message
    ((pending, carry),) = out.forwards  # only request 2's unsure sample goes up, with a finite carry
    assert pending.n == 1 and np.isfinite(carry["features"]).all()
    ex.scatter(pending, np.array([2]), np.array([0.9], np.float32), np.array([2], np.int32), np.zeros(1, np.uint8),
               ["root"])  # fmt: skip
    (r,) = out.replies
    assert r.req_id == 2 and r.cls.tolist() == [2, 0] and np.isfinite(r.conf).all()


def test_an_overflow_at_the_root_alone_is_refused_too():
    ex, stage, out = make()
    assert ex.admit([b"a"], msg(1, [OVERFLOW]), 0.0) is None
    ex.run_batch()
    assert [(rid, code) for rid, code, _ in out.errors] == [(1, "bad_input")] and not out.replies


def test_an_overflow_flagged_is_answered_here_like_non_finite_input():
    ex, stage, out = make(parent="tcp://parent", nonfinite="flag")
    assert ex.admit([b"a"], msg(1, [OVERFLOW, UNSURE, CONFIDENT]), 0.0) is None
    ex.run_batch()
    ((pending, carry),) = out.forwards
    assert pending.n == 1 and np.isfinite(carry["features"]).all()  # the overflowed sample never goes up
    ex.scatter(pending, np.array([2]), np.array([0.9], np.float32), np.array([2], np.int32), np.zeros(1, np.uint8),
               ["root"])  # fmt: skip
    (r,) = out.replies
    assert r.cls.tolist() == [-1, 2, 0] and r.flags.tolist() == [P.FLAG_NONFINITE, 0, 0] and np.isnan(r.conf[0])
    assert r.exit.tolist() == [1, 2, 1] and ex.counters["nonfinite"] == 1 and not out.errors


# ---------------------------------------------------------------- the answering exit's logits (want_logits)


def _result(fid, cls, exit_, served_by, logits=None):
    """A parent's RESULT as the node receives it (decoded frames)."""
    n = len(cls)
    frames = P.result_frames(fid, n, np.asarray(cls, np.int64), np.full(n, 0.9, np.float32),
                             np.asarray(exit_, np.int32), np.zeros(n, np.uint8), served_by, "root", logits)  # fmt: skip
    return P.decode([bytes(P._buffer(f)) for f in frames])


def test_logits_go_only_to_the_requests_that_ask_and_merge_with_the_parents_rows():
    ex, stage, out = make(parent="tcp://parent")
    x = np.array([UNSURE, CONFIDENT, [0.2, 0.3, 0, 0]], np.float32)
    ex.admit([b"a"], msg(1, x, want_logits=True), 0.0)
    ex.admit([b"b"], msg(2, x[:2]), 0.0)  # same batch, no logits asked
    ex.admit([b"c"], msg(3, x[1::-1], want_logits=True), 0.0)
    ex.run_batch()
    ((pending, _),) = out.forwards
    assert pending.n == 4 and pending.logits.shape == (4, 3)  # the parent is asked: a part wants logits
    up = np.arange(12, dtype=np.float32).reshape(4, 3)
    ex.from_parent(pending, _result(1, [1, 2, 0, 1], [2, 2, 2, 2], ["root"] * 4, up))
    a, b, c = sorted(out.replies, key=lambda r: r.req_id)
    assert a.exit.tolist() == [2, 1, 2] and a.served_by == ["root", "leaf", "root"]
    np.testing.assert_array_equal(a.logits, [up[0], x[1, :3] * 10, up[1]])  # own row kept, parent's merged
    assert b.logits is None and b.exit.tolist() == [2, 1]
    np.testing.assert_array_equal(c.logits, [x[1, :3] * 10, up[3]])
    frames = P.result_frames(a.req_id, a.n, a.cls, a.conf, a.exit, a.flags, a.served_by, "leaf", a.logits)
    assert P.decode(frames).head.names[-1] == "logits"  # what the node sends the asker


def test_a_request_forwarded_whole_passes_the_parents_answer_and_logits_on():
    ex, stage, out = make(parent="tcp://parent")
    ex.admit([b"a"], msg(1, [UNSURE, UNSURE], want_logits=True), 0.0)
    ex.run_batch()
    ((pending, _),) = out.forwards
    up = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    ex.from_parent(pending, _result(1, [1, 2], [3, 2], ["cloud", "edge0"], up))
    (r,) = out.replies
    assert r.served_by == ["cloud", "edge0"] and np.frombuffer(r.exit, np.int32).tolist() == [3, 2]  # frames as sent
    np.testing.assert_array_equal(r.logits, up)


def test_no_logits_asked_means_none_kept_none_asked_of_the_parent():
    ex, stage, out = make(parent="tcp://parent")
    ex.admit([b"a"], msg(1, [UNSURE, CONFIDENT]), 0.0)
    ex.run_batch()
    ((pending, _),) = out.forwards
    assert pending.logits is None
    ex.from_parent(pending, _result(1, [2], [2], ["root"]))
    (r,) = out.replies
    assert r.logits is None and r.cls.tolist() == [2, 0]


def test_a_parent_that_sends_no_logits_leaves_nan_rows_and_a_fallback_gives_this_nodes_own():
    ex, stage, out = make(parent="tcp://parent")
    x = np.array([UNSURE, CONFIDENT], np.float32)
    ex.admit([b"a"], msg(1, x, want_logits=True), 0.0)
    ex.run_batch()
    ex.from_parent(out.forwards[0][0], _result(1, [2], [2], ["root"]))  # an older parent: no logits tensor
    r = out.replies[0]
    assert np.isnan(r.logits[0]).all() and r.logits[1].tolist() == (x[1, :3] * 10).tolist()
    x = np.array([CONFIDENT, UNSURE, [0.3, 0.2, 0, 0]], np.float32)
    ex.admit([b"a"], msg(2, x, want_logits=True), 0.0)
    ex.run_batch()
    ex.fallback(out.forwards[1][0])  # the parent did not answer: served here, degraded, with this exit's logits
    r = out.replies[1]
    assert r.flags.tolist() == [0, P.FLAG_DEGRADED, P.FLAG_DEGRADED]
    np.testing.assert_array_equal(r.logits, x[:, :3] * 10)


def test_a_flagged_non_finite_sample_has_nan_logits():
    ex, stage, out = make(nonfinite="flag")
    x = np.array([CONFIDENT, CONFIDENT], np.float32)
    x[0, 1] = np.nan
    ex.admit([b"a"], msg(1, x, want_logits=True), 0.0)
    ex.run_batch()
    (r,) = out.replies
    assert np.isnan(r.logits[0]).all() and r.logits[1].tolist() == [50, 0, 0] and r.flags.tolist() == [4, 0]


class _LabelStage:
    """Exit k predicts class x[:, k-1], with logits 5 x one-hot; the carry is the input."""

    def __init__(self, k):
        self.k = k
        self.inputs = (T("input" if k == 1 else f"features_{k - 1}", (None, 3), "float32"),)
        self.outputs = (T("logits", (None, 3), "float32"), T(f"features_{k}", (None, 3), "float32"))

    def run(self, feeds):
        x = next(iter(feeds.values()))
        return {"logits": np.eye(3, dtype=np.float32)[x[:, self.k - 1].astype(int)] * 5, f"features_{self.k}": x}


def test_under_patience_the_logits_are_the_exit_that_answered_even_before_the_nodes_own():
    from cis.core.policy import patience as pt

    stages = {k: _LabelStage(k) for k in (1, 2, 3)}
    out = Outbox()
    ex = Executor(NodeConfig("root", 3, measure="patience", patience=2), stages, out)
    x = np.array([[0, 0, 1], [0, 1, 1], [2, 2, 2]], np.float32)  # exit k predicts x[:, k-1]: served at 2, 3, 2
    ex.admit([b"a"], msg(1, x, want_logits=True), 0.0)
    # a child's forward of one sample entering at stage 2 with its count from exit 1 (label 1, count 1): the
    # batch's stage-1 logits cover request 1 only, its stage-2 logits both
    fwd = {"features_1": np.array([[1, 1, 0]], np.float32), pt.LABEL: np.array([1]), pt.COUNT: np.array([1])}
    ex.admit([b"b"], msg(2, fwd, stage=2, want_logits=True), 0.0)
    ex.run_batch()
    a, b = sorted(out.replies, key=lambda r: r.req_id)
    assert a.exit.tolist() == [2, 3, 2] and b.exit.tolist() == [2]
    eye = np.eye(3, dtype=np.float32) * 5
    np.testing.assert_array_equal(a.logits, eye[[0, 1, 2]])  # exit 2's row for samples 0 and 2, exit 3's for 1
    np.testing.assert_array_equal(b.logits, eye[[1]])
