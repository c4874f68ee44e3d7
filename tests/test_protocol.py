"""The wire codec: round trips, zero-copy views, and an error code for every kind of bad message."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cis.runtime import protocol as P
from cis.runtime.adapt import ThresholdController
from cis.runtime.wire import is_traceparent, is_tracestate


def test_round_trip_keeps_names_dtypes_shapes_and_fields():
    tensors = {
        "input": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "mask": np.array([1, -2], np.int8),
        "h": np.ones((2, 5), np.float16),
    }
    frames = P.encode(P.INFER, 7, tensors, stage=2, deadline=12.5, route=["device0"])
    msg = P.decode([bytes(memoryview(f)) for f in frames])
    assert msg.kind == P.INFER and msg.id == 7
    assert msg.header["stage"] == 2 and msg.header["deadline"] == 12.5 and msg.header["route"] == ["device0"]
    for k, v in tensors.items():
        assert msg.tensors[k].dtype == v.dtype and msg.tensors[k].shape == v.shape
        np.testing.assert_array_equal(msg.tensors[k], v)


def test_a_trace_context_travels_in_the_header_on_either_path():
    x = {"x": np.zeros((3, 2), np.float32)}
    parts = [[1, TP], [2, ""]]
    one = P.encode(P.FORWARD, 3, x, traceparent=TP, tracestate="a=1")
    for frames in (one, P.encode(P.FORWARD, 3, x, trace_parts=parts, trace_states=["b=2", ""])):
        fast = P.decode(frames).head
        slow = P._checked(P._buffer(frames[0]), frames, None, None, None, P.KINDS).head
        for h in (fast, slow):
            got = (h.traceparent, h.trace_parts, h.tracestate, h.trace_states)
            assert got in ((TP, (), "a=1", ()), ("", ((1, TP), (2, "")), "", ("b=2", "")))
    absent = P.decode(P.encode(P.INFER, 4, x)).head
    assert (absent.traceparent, absent.trace_parts, absent.tracestate, absent.trace_states) == ("", (), "", ())
    # unknown keys stay ignored: a node of this version reads a header from a later one
    assert P.decode(P.encode(P.INFER, 5, x, traceparent=TP, baggage="a=1")).head.traceparent == TP


def test_want_logits_asks_for_a_fifth_result_tensor_that_both_paths_check():
    x = {"x": np.zeros((3, 2), np.float32)}
    assert P.decode(P.encode(P.INFER, 4, x, want_logits=True)).head.want_logits is True
    assert P.decode(P.encode(P.FORWARD, 4, x, stage=2, want_logits=False)).head.want_logits is False
    assert P.decode(P.encode(P.INFER, 4, x)).head.want_logits is False  # absent: no logits (old peers send none)
    four = (np.array([1, 2], np.int64), np.ones(2, np.float32), np.ones(2, np.int32), np.zeros(2, np.uint8))
    plain = P.result_frames(9, 2, *four, ["a", "b"], "b")
    assert len(plain) == 5 and msgpack.unpackb(plain[0])["names"] == list(P.RESULT_TENSORS)  # unchanged
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = [bytes(P._buffer(f)) for f in P.result_frames(9, 2, *four, ["a", "b"], "b", logits)]
    fast = P._fast(P.decoder(P.REPLY_KINDS).decode(frames[0]), frames[0], frames, None, None, None)
    slow = P._checked(P._buffer(frames[0]), frames, None, None, None, P.REPLY_KINDS)
    for msg in (fast, slow):
        assert msg is not None and msg.head.names[4] == P.RESULT_LOGITS
        np.testing.assert_array_equal(msg.tensors["logits"], logits)
    ok = dict(zip(P.RESULT_TENSORS, four))
    shuffled = {"logits": logits, **ok}  # another order: valid, the checked way
    assert P.decode(P.encode(P.RESULT, 4, shuffled, served_by=["a", "b"])).tensors["logits"].shape == (2, 3)
    for bad in (logits.astype(np.float64), logits[:1], logits.ravel(), np.zeros((2, 0), np.float32)):
        assert _code(P.encode(P.RESULT, 4, {**ok, "logits": bad}, served_by=["a", "b"])) == "bad_tensor"
    assert _code(P.encode(P.RESULT, 4, {**ok, "probabilities": logits}, served_by=["a", "b"])) == "bad_tensor"


def test_decode_is_zero_copy_over_the_frame():
    buf = bytearray(np.arange(6, dtype=np.float32).tobytes())
    header = P.encode(P.INFER, 1, {"x": np.zeros((2, 3), np.float32)})[0]
    msg = P.decode([header, buf])
    buf[0:4] = np.float32(42).tobytes()  # the view sees the change: no copy was made
    assert msg.tensors["x"][0, 0] == 42


def _code(frames, **kw):
    with pytest.raises(P.ProtocolError) as err:
        P.decode(frames, **kw)
    return err.value.code


def test_every_bad_message_gets_its_code():
    ok = P.encode(P.INFER, 1, {"x": np.zeros((2, 3), np.float32)})
    assert _code([]) == "bad_message"
    assert _code([b"\xc1\xff garbage"]) == "bad_message"
    assert _code([msgpack.packb([1, 2])]) == "bad_message"
    assert _code([msgpack.packb({"v": 99, "kind": "infer"})]) == "bad_version"
    assert _code([msgpack.packb({"v": 1, "kind": "dance"})]) == "unknown_kind"
    assert _code([msgpack.packb({"v": 1, "kind": "infer", "id": "x"})]) == "bad_message"
    assert _code([ok[0]]) == "bad_message"  # tensor frame missing
    assert _code([ok[0], b"123"]) == "bad_tensor"  # wrong byte count
    bad_dtype = msgpack.packb({"v": 1, "kind": "infer", "id": 1, "names": ["x"], "dtypes": ["object"], "shapes": [[1]]})
    assert _code([bad_dtype, b"12345678"]) == "bad_tensor"
    bad_shape = msgpack.packb({"v": 1, "kind": "infer", "id": 1, "names": ["x"], "dtypes": ["uint8"], "shapes": [[-1]]})
    assert _code([bad_shape, b""]) == "bad_tensor"
    assert _code([ok[0], bytes(24)], max_bytes=10) == "too_large"


def test_random_bytes_never_escape_as_other_exceptions():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        frames = [rng.bytes(int(rng.integers(0, 40))) for _ in range(int(rng.integers(1, 4)))]
        try:
            P.decode(frames)
        except P.ProtocolError:
            pass


def test_error_codes_are_documented():
    doc = open("docs/protocol.md").read()
    for code in P.ERROR_CODES:
        assert f"`{code}`" in doc
    for kind in P.KINDS:
        assert f"`{kind}`" in doc


def test_controller_holds_the_target_share():
    rng = np.random.default_rng(1)
    ctl = ThresholdController(target=0.3, threshold=0.9, gain=0.05, smoothing=0.01)
    forwarded = []
    for step in range(3000):
        shift = 0.0 if step < 1500 else 0.15  # traffic gets more confident halfway
        conf = np.clip(rng.uniform(0.3, 1.0, 16) + shift, 0, 1)
        fwd = int((conf < ctl.threshold).sum())
        forwarded.append(fwd / 16)
        ctl.update(fwd, len(conf))
        if step in (1499, 2999):  # the last 500 batches of each phase forward about the target share
            assert abs(np.mean(forwarded[-500:]) - 0.3) < 0.03
    assert 0.0 <= ctl.threshold <= 1.0 and ctl.to_json()["updates"] == 3000


# ---------------------------------------------------------------- strict header schema


def _infer(**fields):
    """A valid one-tensor infer message whose header fields are replaced by ``fields`` (None removes one)."""
    header = {
        "v": 1,
        "kind": "infer",
        "id": 77,
        "names": ["x"],
        "dtypes": ["float32"],
        "shapes": [[2, 3]],
        "stage": 1,
        "deadline": 0,
        "route": [],
        "sender": "a",
        "node": "b",
    }
    for k, v in fields.items():
        if v is None:
            header.pop(k)
        else:
            header[k] = v
    return [msgpack.packb(header, use_bin_type=True), bytes(24)]


TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the W3C specification's example
CONFUSED = [True, False, 1.5, -1, "1", b"1", [1], {"a": 1}, [], {}]
BAD_STATES = [  # W3C tracestates the wire does not carry (an entry of trace_states may be "", tracestate not)
    "A=1", "a", "a=", "=1", "a=1\t", "\ta=1", "a=b=c", "a=1 ,b,c=2", "1a=x", "a@1b=x", "é=1", "a=é",
    "k=" + "v" * 257, "a" * 257 + "=1", ",".join(["a=1"] * 33), "a=" + "1" * 255 + "," + "b=" + "2" * 255,
]  # fmt: skip
BAD_VALUES = {  # header field -> (code, values of the wrong type or out of range)
    "v": ("bad_version", [*CONFUSED, 3, 0, 1.0, 2.0]),  # 1 and 2 are read (docs/protocol.md, *Versions*)
    "kind": ("unknown_kind", [*CONFUSED, "dance", "INFER"]),
    "id": ("bad_message", [True, False, 1.5, -1, "1", b"1", [1], {"a": 1}, [], {}]),
    "names": ("bad_tensor", [True, 1.5, -1, "x", b"x", {"a": 1}, [1], [b"x"], [""], ["x" * 200], [["x"]]]),
    "dtypes": ("bad_tensor", [True, 1.5, "float32", {"a": 1}, [1], [b"float32"], ["object"], ["float"], [True]]),
    "shapes": (
        "bad_tensor",
        [True, 1.5, "2,3", {"a": 1}, [2], [[2.0, 3]], [[True, 3]], [[-2, 3]], [["2", 3]], [[2] * 9], [[2, 1 << 40]]],
    ),
    "stage": ("bad_stage", [True, False, 1.5, -1, 0, 256, "1", b"1", [1], {"a": 1}, []]),
    "deadline": ("bad_message", [True, -1, -0.5, float("nan"), float("inf"), "1", b"1", [1], {"a": 1}]),
    "route": ("bad_message", [True, 1, 1.5, "a", {"a": 1}, [1], [b"a"], [""], ["a"] * 17, [["a"]]]),
    "sender": ("bad_message", [True, 1, 1.5, b"a", [1], {"a": 1}, "a" * 200]),
    "node": ("bad_message", [True, 1, 1.5, b"a", ["a"], {"a": 1}, "a" * 200]),
    "traceparent": (
        "bad_message",
        [*CONFUSED, "", TP.upper(), TP + "\n", " " + TP, "01" + TP[2:], TP[:-1], TP.replace("0af7", "0000" * 8),
         "00-" + "0" * 32 + TP[35:], TP[:36] + "0" * 16 + TP[52:], TP.replace("-", "_")],
    ),  # fmt: skip
    "trace_parts": (
        "bad_message",
        [*CONFUSED, [[1]], [[1, TP, 1]], [[0, TP]], [[-1, ""]], [[True, ""]], [[1.0, ""]], [["1", ""]], [[1, None]],
         [[1, "x"]], [[1, TP.upper()]], [1, TP], [(1, b"")], [[1, ""]] * 4097],
    ),  # fmt: skip
    "tracestate": ("bad_message", [*CONFUSED, *BAD_STATES, ""]),
    "trace_states": (
        "bad_message", [*CONFUSED, [1], [None], [b"a=1"], ["a=1", 2], [""] * 4097, *([s] for s in BAD_STATES)],
    ),  # fmt: skip
    "want_logits": ("bad_message", [1, 0, 1.5, -1, "true", b"1", [True], {"a": 1}, [], {}]),
    "bundle": ("bad_message", [*CONFUSED, "", "0123456789abcde", "0123456789abcdef0", "0123456789abcdef\n",
                               b"0123456789abcdef"]),  # 16 characters that are no id: bundle_mismatch at a node
    "path": ("bad_message", [True, 1, 1.5, b"/b", ["/b"], {"a": 1}, "", "/" * 4097]),
}


@pytest.mark.parametrize("field", sorted(BAD_VALUES))
def test_a_type_confused_value_of_each_header_field_gets_its_code_and_echoes_the_id(field):
    code, values = BAD_VALUES[field]
    for value in values:
        with pytest.raises(P.ProtocolError) as err:
            P.decode(_infer(**{field: value}), max_bytes=1 << 20)
        assert err.value.code == code, (field, value, err.value.message)
        assert err.value.req_id == (0 if field == "id" else 77), (field, value)
        assert field.rstrip("s") in err.value.message or field == "v" and "version" in err.value.message


def test_required_fields_and_the_order_of_checks():
    assert _code(_infer(v=None)) == "bad_version"
    assert _code(_infer(kind=None)) == "unknown_kind"
    assert _code(_infer(id=None)) == "bad_message"
    assert P.decode(_infer(stage=None, deadline=None, route=None, sender=None, node=None)).header["id"] == 77
    assert _code(_infer(v=3, kind="dance")) == "bad_version"  # the first failure is the one reported
    assert P.decode(_infer(v=2)).head.v == 2 and P.decode(_infer(v=1)).head.v == 1  # both versions are read
    assert _code(_infer(names=["x", "y"])) == "bad_message"  # names and frames disagree
    assert _code(_infer(shapes=[[2, 4]])) == "bad_tensor"  # the frame holds 24 bytes, not 32
    assert _code(_infer(), max_bytes=20) == "too_large"
    assert _code(_infer(shapes=[[1 << 20, 1 << 10]]), max_bytes=1 << 20) == "bad_tensor"  # declared size over the limit
    assert P.decode(_infer(id=(1 << 64) - 1)).id == (1 << 64) - 1
    assert P.decode(_infer(deadline=1.5e9)).header["deadline"] == 1.5e9


def test_kinds_a_receiver_does_not_accept_are_unknown_and_replies_are_checked():
    status = msgpack.packb({"v": 1, "kind": "status", "id": 3})
    assert P.decode([status], kinds=P.REQUEST_KINDS).kind == "status"
    with pytest.raises(P.ProtocolError) as err:
        P.decode([msgpack.packb({"v": 1, "kind": "result", "id": 3})], kinds=P.REQUEST_KINDS)
    assert err.value.code == "unknown_kind" and err.value.req_id == 3
    assert _code(P.encode(P.STATUS, 3, {"x": np.zeros(2, np.float32)})) == "bad_message"  # status carries no tensors
    ok = {
        "class": np.zeros(2, np.int64),
        "confidence": np.zeros(2, np.float32),
        "exit": np.ones(2, np.int32),
        "flags": np.zeros(2, np.uint8),
    }
    assert P.decode(P.encode(P.RESULT, 4, ok, served_by=["a", "b"])).id == 4
    assert _code(P.encode(P.RESULT, 4, ok, served_by=["a"])) == "bad_message"
    assert _code(P.encode(P.RESULT, 4, ok, served_by=["a", 1])) == "bad_message"
    assert _code(P.encode(P.RESULT, 4, {**ok, "class": np.zeros(2, np.int32)}, served_by=["a", "b"])) == "bad_tensor"
    assert _code(P.encode(P.ERROR, 4, code=1, message="m")) == "bad_message"
    assert _code(P.encode(P.STATUS_REPLY, 4, status=[1])) == "bad_message"


# ---------------------------------------------------------------- property-based: the schema holds for all input

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "v",
        "kind",
        "id",
        "names",
        "dtypes",
        "shapes",
        "stage",
        "deadline",
        "route",
        "sender",
        "node",
        "traceparent",
        "trace_parts",
        "tracestate",
        "trace_states",
        "want_logits",
        "bundle",
        "path",
        "served_by",
        "code",
        "message",
        "status",
        "other",
    ]
)


def _accepted_header_is_in_schema(h: dict, tensors: dict) -> None:
    assert type(h["v"]) is int and h["v"] in (1, 2)
    assert h["kind"] in P.KINDS
    assert type(h["id"]) is int and 0 <= h["id"] < 1 << 64
    if "stage" in h:
        assert type(h["stage"]) is int and 1 <= h["stage"] <= P.MAX_STAGE
    if "deadline" in h:
        assert type(h["deadline"]) in (int, float) and h["deadline"] >= 0 and np.isfinite(h["deadline"])
    if "route" in h:
        assert type(h["route"]) is list and all(type(r) is str for r in h["route"])
    for key in ("sender", "node"):
        assert key not in h or type(h[key]) is str
    assert "traceparent" not in h or is_traceparent(h["traceparent"])
    assert "trace_parts" not in h or (0 < len(h["trace_parts"]) <= P.MAX_TRACE_PARTS and all(
        type(c) is int and c >= 1 and (tp == "" or is_traceparent(tp)) for c, tp in h["trace_parts"]))  # fmt: skip
    assert "tracestate" not in h or is_tracestate(h["tracestate"])
    assert "trace_states" not in h or (0 < len(h["trace_states"]) <= P.MAX_TRACE_PARTS and all(
        is_tracestate(s, empty=True) for s in h["trace_states"]))  # fmt: skip
    assert "want_logits" not in h or type(h["want_logits"]) is bool
    assert "bundle" not in h or P.is_bundle_id(h["bundle"])
    assert "path" not in h or (type(h["path"]) is str and 0 < len(h["path"]) <= P.MAX_TEXT)
    assert h["kind"] not in (P.SWITCH, P.DROP) or "bundle" in h
    assert h["kind"] != P.LOAD or "path" in h
    for a in tensors.values():
        assert a.dtype.name in P.DTYPES


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=12))
def test_any_header_is_either_accepted_within_the_schema_or_refused_with_a_code(header):
    frames = [msgpack.packb(header, use_bin_type=True)]
    try:
        msg = P.decode(frames, max_bytes=1 << 16)
    except P.ProtocolError as exc:
        assert exc.code in P.ERROR_CODES
        rid = header.get("id")
        assert exc.req_id == (rid if type(rid) is int and 0 <= rid < 1 << 64 else 0)
        return
    _accepted_header_is_in_schema(msg.header, msg.tensors)


@settings(max_examples=400, deadline=None)
@given(_keys.filter(lambda k: k not in ("served_by", "code", "message", "status", "other")), _values)
def test_one_field_of_a_valid_request_replaced_by_anything(key, value):
    try:
        msg = P.decode(_infer(**{key: value}) if value is not None else _infer(), max_bytes=1 << 16)
    except P.ProtocolError as exc:
        readable = type(value) is int and 0 <= value < 1 << 64
        assert exc.code in P.ERROR_CODES and exc.req_id == (77 if key != "id" else value if readable else 0)
        return
    _accepted_header_is_in_schema(msg.header, msg.tensors)


# ---------------------------------------------------------------- the C schema and the Python checks agree


def _checked_or_none(frames, kinds):
    try:
        return P._checked(P._buffer(frames[0]), frames, 1 << 16, None, None, kinds)
    except P.ProtocolError:
        return None


_BASES = {
    "infer": {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "stage": 1, "deadline": 0, "route": []},
    "forward": {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "stage": 2, "route": ["a"], "sender": "a"},
    "result": {
        "names": ["class", "confidence", "exit", "flags"],
        "dtypes": ["int64", "float32", "int32", "uint8"],
        "shapes": [[1], [1], [1], [1]],
        "served_by": ["a"],
        "node": "a",
    },
    "result+logits": {
        "names": ["class", "confidence", "exit", "flags", "logits"],
        "dtypes": ["int64", "float32", "int32", "uint8", "float32"],
        "shapes": [[1], [1], [1], [1], [1, 2]],
        "served_by": ["a"],
        "node": "a",
    },
    "error": {"code": "overloaded", "message": "full", "node": "a"},
    "status": {},
    "status_reply": {"status": {"node": "a"}},
    "ping": {"node": "a"},
    "pong": {"node": "a"},
    "load": {"path": "/srv/bundle"},
    "switch": {"bundle": "0123456789abcdef"},
    "drop": {"bundle": "0123456789abcdef"},
    "reload": {},
}
_FRAMES = {"infer": [4], "forward": [4], "result": [8, 4, 4, 1], "result+logits": [8, 4, 4, 1, 8]}


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(sorted(_BASES)),
    st.lists(st.tuples(_keys, _values), max_size=3),
    st.sampled_from([P.KINDS, P.REQUEST_KINDS, P.REPLY_KINDS]),
    st.integers(-1, 1),
)
def test_the_schema_never_accepts_what_the_checks_refuse(kind, changes, kinds, extra_frames):
    """decode's one-pass path (msgspec schema + counts and sizes) may only accept a message that the
    documented checks accept too, as the same kind and id: valid messages with up to three fields
    replaced by anything, and a frame too many or too few."""
    header = {"v": 1, "kind": kind.split("+")[0], "id": 77, **_BASES[kind]}
    for key, value in changes:
        header[key] = value
    sizes = _FRAMES.get(kind, [])
    sizes = sizes[: len(sizes) + extra_frames] if extra_frames < 0 else sizes + [4] * extra_frames
    frames = [msgpack.packb(header, use_bin_type=True)] + [bytes(k) for k in sizes]
    try:
        fast = P.decoder(kinds).decode(frames[0])
    except Exception:
        return
    msg = P._fast(fast, frames[0], frames, 1 << 16, None, None)
    if msg is not None:
        slow = _checked_or_none(frames, kinds)
        assert slow is not None and (slow.kind, slow.id) == (msg.kind, msg.id), header


@pytest.mark.parametrize("kinds", [P.REQUEST_KINDS, P.REPLY_KINDS])
def test_valid_messages_take_the_one_pass_path(kinds):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    msgs = {
        P.INFER: P.encode(P.INFER, 5, {"x": x}, stage=1, deadline=0.0, route=[]),
        P.FORWARD: P.encode(P.FORWARD, 6, {"x": x}, stage=2, deadline=1.5e9, route=["a"], sender="a"),
        P.STATUS: P.encode(P.STATUS, 7),
        P.PING: P.encode(P.PING, 8, node="a"),
        P.RESULT: P.result_frames(
            9,
            2,
            np.zeros(2, np.int64),
            np.ones(2, np.float32),
            np.ones(2, np.int32),
            np.zeros(2, np.uint8),
            ["a", "b"],
            "b",
        ),
        P.ERROR: P.error_frames(10, "overloaded", "full", node="a"),
        P.STATUS_REPLY: P.encode(P.STATUS_REPLY, 11, status={"node": "a"}),
        P.PONG: P.encode(P.PONG, 12, node="a"),
        P.LOAD: P.encode(P.LOAD, 13, path="/srv/bundle"),
        P.SWITCH: P.encode(P.SWITCH, 14, bundle="0123456789abcdef"),
        P.DROP: P.encode(P.DROP, 15, bundle="0123456789abcdef"),
        P.RELOAD: P.encode(P.RELOAD, 16),
    }
    for kind in kinds:
        frames = [bytes(P._buffer(f)) for f in msgs[kind]]
        head = P.decoder(kinds).decode(frames[0])
        msg = P._fast(head, frames[0], frames, 1 << 20, None, None)
        assert msg is not None and msg.kind == kind, kind
        assert msg.header == msgpack.unpackb(frames[0])  # the plain header, decoded on demand
        for name, a in msg.tensors.items():
            assert a.shape == tuple(msg.header["shapes"][msg.header["names"].index(name)])


@pytest.mark.parametrize(
    "field, code",
    [("stage", "bad_stage"), ("deadline", "bad_message"), ("route", "bad_message"), ("sender", "bad_message"),
     ("node", "bad_message"), ("traceparent", "bad_message"), ("trace_parts", "bad_message"),
     ("tracestate", "bad_message"), ("trace_states", "bad_message"), ("want_logits", "bad_message"),
     ("bundle", "bad_message"), ("path", "bad_message")],
)  # fmt: skip
def test_nil_is_no_value_of_any_field_an_absent_one_takes_its_default(field, code):
    """A field present with nil (msgpack None) is refused like any wrong type, never read as absent:
    ``stage`` nil is not stage 1."""
    header = msgpack.unpackb(_infer()[0])
    header[field] = None
    frames = [msgpack.packb(header), bytes(24)]
    with pytest.raises(P.ProtocolError) as err:
        P.decode(frames)
    assert err.value.code == code and err.value.req_id == 77 and field in err.value.message
    assert _checked_or_none(frames, P.KINDS) is None  # the documented checks refuse it too
    header.pop(field)
    absent = P.decode([msgpack.packb(header), bytes(24)]).head
    defaults = {"stage": 1, "deadline": 0.0, "route": [], "sender": "", "node": ""}
    defaults.update(traceparent="", trace_parts=(), tracestate="", trace_states=(), want_logits=False, bundle="")
    defaults.update(path="")
    assert getattr(absent, field) == defaults[field]
