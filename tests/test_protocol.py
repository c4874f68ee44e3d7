"""The wire codec: round trips, zero-copy views, and an error code for every kind of bad message."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from cis.runtime import protocol as P
from cis.runtime.adapt import ThresholdController


def test_round_trip_keeps_names_dtypes_shapes_and_fields():
    tensors = {"input": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "mask": np.array([1, -2], np.int8), "h": np.ones((2, 5), np.float16)}
    frames = P.encode(P.INFER, 7, tensors, stage=2, deadline=12.5, route=["device0"])
    msg = P.decode([bytes(memoryview(f)) for f in frames])
    assert msg.kind == P.INFER and msg.id == 7
    assert msg.header["stage"] == 2 and msg.header["deadline"] == 12.5 and msg.header["route"] == ["device0"]
    for k, v in tensors.items():
        assert msg.tensors[k].dtype == v.dtype and msg.tensors[k].shape == v.shape
        np.testing.assert_array_equal(msg.tensors[k], v)


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
