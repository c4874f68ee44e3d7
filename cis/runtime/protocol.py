"""The wire format of the CIS runtime (see docs/protocol.md, the contract).

A message is a ZeroMQ multipart message::

    frame 0     header: a msgpack map (version, kind, request id, entry stage,
                tensor names/dtypes/shapes, deadline, route, kind-specific fields)
    frame 1..n  one raw C-order buffer per tensor, in header order

:func:`decode` is the one place a message is checked: every header field's type
and range (a bool is not an int; ids are uint64), equal counts of names, dtypes,
shapes and tensor frames, known dtypes, non-negative dimensions whose declared
size fits the limit, and each frame's byte length. The checks cost the same for
one sample or ten thousand (no per-sample Python loops). What a node adds on top
(the entry stage is one it runs, the tensors match that stage, finite values) is
in :mod:`cis.runtime.feeds`. Tensors are decoded zero-copy (``np.frombuffer``
over the received frame) and large ones are sent without copying. Only plain
msgpack types and raw buffers cross the wire; nothing on the wire can run code.

Two passes, one contract: the header schema is compiled once into msgspec
structs (:mod:`cis.runtime.headers`), which decode *and* check every field in one C pass;
a header they accept, whose counts and frames also agree, is a valid message
(the fast path of every message that a correct peer sends). Anything else goes
to the Python checks in :mod:`cis.runtime.wire`, which find the *first* failure in the documented
order and raise its code, or accept the few valid headers the structs are
stricter about (a bytes key, a repeated key). The structs never accept what the
checks refuse; tests/test_protocol.py holds both to that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import msgspec
import numpy as np
import zmq

from cis.runtime.headers import (  # noqa: F401  (re-exported: callers write P.ResultHeader)
    SCHEMA,
    DropHeader,
    ErrorHeader,
    ForwardHeader,
    Header,
    InferHeader,
    LoadHeader,
    PingHeader,
    PongHeader,
    ReloadHeader,
    ResultHeader,
    StatusHeader,
    StatusReplyHeader,
    SwitchHeader,
    decoder,
)
from cis.runtime.wire import (  # noqa: F401  (the vocabulary is re-exported: callers write P.INFER)
    BUNDLE_ID_CHARS,
    COPY_THRESHOLD,
    DROP,
    DTYPE_NAME,
    DTYPES,
    ERROR,
    ERROR_CODES,
    FLAG_CAPPED,
    FLAG_DEGRADED,
    FLAG_NONFINITE,
    FORWARD,
    INFER,
    ITEMSIZE,
    KINDS,
    LOAD,
    MAX_DIM,
    MAX_DIMS,
    MAX_HEADER_BYTES,
    MAX_ID,
    MAX_NAME,
    MAX_ROUTE,
    MAX_STAGE,
    MAX_TENSORS,
    MAX_TEXT,
    MAX_TRACE_PARTS,
    NUMPY_DTYPE,
    PING,
    PONG,
    RELOAD,
    REPLY_KINDS,
    REQUEST_KINDS,
    RESULT,
    RESULT_LOGITS,
    RESULT_TENSORS,
    STATUS,
    STATUS_REPLY,
    SWITCH,
    TENSOR_KINDS,
    TRACE_PART_FULL,
    TRACEPARENT_FULL,
    UPDATE_KINDS,
    VERSION,
    VERSIONS,
    ProtocolError,
    check_common,
    check_fields,
    check_result,
    check_tensors,
    fail,
    is_bundle_id,
    is_int,
)


def _numpy_scalar(obj: Any) -> Any:
    if isinstance(obj, np.generic):  # e.g. a float64 in a status field
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a header")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_numpy_scalar)


class Message:
    """A checked message: ``kind``, ``id``, its ``head`` (a :class:`Header`), its tensor ``frames``
    (checked: one per name, each of its shape's byte length), ``tensors`` (numpy views of those frames,
    made on first use: a node that passes a reply on never needs them) and the header as a plain dict
    (``header``, decoded on first use)."""

    __slots__ = ("kind", "id", "head", "frames", "_tensors", "_raw", "_header")

    def __init__(
        self,
        head: Header,
        frames: Sequence[Any] = (),
        raw: Any = None,
        header: dict | None = None,
        tensors: dict[str, np.ndarray] | None = None,
    ):
        self.kind, self.id, self.head, self.frames = head.kind, head.id, head, frames
        self._raw, self._header, self._tensors = raw, header, tensors

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        if self._tensors is None:
            h = self.head
            self._tensors = {
                name: _view(f, dt, shape) for name, dt, shape, f in zip(h.names, h.dtypes, h.shapes, self.frames)
            }
        return self._tensors

    @property
    def header(self) -> dict[str, Any]:
        if self._header is None:
            self._header = msgpack.unpackb(self._raw, raw=False, strict_map_key=False)
        return self._header


def _view(buf: Any, dtype: str, shape: list[int]) -> np.ndarray:
    a = np.frombuffer(buf, NUMPY_DTYPE[dtype])
    return a if len(shape) == 1 else a.reshape(shape)


def _buffer(frame: Any) -> Any:
    """The bytes of a frame: a zmq.Frame or bytes as they are (both have the buffer protocol and their
    length in bytes), anything else (an array, a memoryview) as a flat byte view."""
    t = type(frame)
    if t is _FRAME or t is bytes:
        return frame
    if t is np.ndarray:
        return np.ascontiguousarray(frame).reshape(-1).view(np.uint8).data
    return memoryview(frame).cast("B")


def encode(
    kind: str, req_id: int = 0, tensors: Mapping[str, np.ndarray] | None = None, *, v: int = VERSION, **fields: Any
) -> list:
    """Frames of one message (of protocol version ``v``): the header, then one C-contiguous buffer per tensor."""
    if not tensors:
        return [_ENCODER.encode({"v": v, "kind": kind, "id": int(req_id), **fields})]
    arrays = [np.ascontiguousarray(a) for a in tensors.values()]
    header = {
        "v": v,
        "kind": kind,
        "id": int(req_id),
        "names": list(tensors),
        "dtypes": [DTYPE_NAME.get(a.dtype) or a.dtype.name for a in arrays],
        "shapes": [list(a.shape) for a in arrays],
        **fields,
    }
    return [_ENCODER.encode(header), *arrays]


RESULT_NAMES, _RESULT_DTYPES = list(RESULT_TENSORS), list(RESULT_TENSORS.values())
_LOGITS_NAMES, _LOGITS_DTYPES = [*RESULT_NAMES, RESULT_LOGITS], [*_RESULT_DTYPES, "float32"]


def result_frames(
    req_id: int,
    n: int,
    cls,
    conf,
    ex,
    flags,
    served_by: list[str],
    node: str,
    logits: np.ndarray | None = None,
    bundle: str = "",
    v: int = VERSION,
) -> list:
    """The frames of a RESULT of n samples: what :func:`encode` makes of the four (n,) tensors, without its
    generic work (so they must be contiguous int64, float32, int32 and uint8 arrays already, or the frames
    of a checked result in that order); ``logits`` (n, C) float32, the fifth tensor, only when asked for;
    ``bundle``: the id of the bundle that answered ("": a node without one), ``v``: the asker's version."""
    header = {
        "v": v,
        "kind": RESULT,
        "id": req_id,
        "names": RESULT_NAMES,
        "dtypes": _RESULT_DTYPES,
        "shapes": [[n], [n], [n], [n]],
        "served_by": served_by,
        "node": node,
    }
    if bundle:
        header["bundle"] = bundle
    if logits is None:
        return [_ENCODER.encode(header), cls, conf, ex, flags]
    logits = np.ascontiguousarray(logits, np.float32)
    header.update(names=_LOGITS_NAMES, dtypes=_LOGITS_DTYPES, shapes=[[n], [n], [n], [n], list(logits.shape)])
    return [_ENCODER.encode(header), cls, conf, ex, flags, logits]


def decode(
    frames: Sequence[Any],
    max_bytes: int | None = None,
    total: int | None = None,
    count: int | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> Message:
    """Decode frames (bytes or zmq.Frame) into a checked Message; tensors are views of the frames.

    ``kinds``: the kinds the receiver accepts (a node: REQUEST_KINDS); others are ``unknown_kind``.
    ``total`` and ``count`` are the message's bytes and frames when ``frames`` holds
    only its first frames (see :func:`recv`). Raises :class:`ProtocolError` saying what was wrong, with the
    request id whenever the header's ``id`` could be read.
    """
    if not frames:
        raise ProtocolError("bad_message", "empty message; expected a msgpack header frame")
    head = _buffer(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError("too_large", f"header frame is {len(head)} bytes; at most {MAX_HEADER_BYTES}")
    try:
        h = decoder(kinds).decode(head)
    except Exception:  # any failure: the checks below name it
        h = None
    if h is not None:
        msg = _fast(h, head, frames, max_bytes, total, count)
        if msg is not None:
            return msg
    return _checked(head, frames, max_bytes, total, count, kinds)


def _fast(h: Header, head: memoryview, frames: Sequence[Any], max_bytes, total, count) -> Message | None:
    """The rest of the checks on a header the schema accepted; None at the first doubt (the slow path decides)."""
    n = len(frames) - 1
    if count is not None and count - 1 != n:
        return None
    if max_bytes is not None and (total if total is not None else sum(len(_buffer(f)) for f in frames)) > max_bytes:
        return None
    names = h.names
    if not (n or names or h.dtypes or h.shapes):
        return None if h.kind == RESULT else Message(h, (), head)  # a result carries its four tensors
    dtypes, shapes = h.dtypes, h.shapes
    if len(names) != n or len(dtypes) != n or len(shapes) != n or n > MAX_TENSORS or h.kind not in TENSOR_KINDS:
        return None
    if n > 1 and len(set(names)) != n:
        return None
    declared, bufs = 0, []
    for i in range(n):
        size = math.prod(shapes[i]) * ITEMSIZE[dtypes[i]]
        buf = _buffer(frames[i + 1])
        if len(buf) != size:
            return None
        declared += size
        bufs.append(buf)
    if max_bytes is not None and declared > max_bytes:
        return None
    if isinstance(h, ResultHeader) and not _result_in_order(h, n):
        return None
    return Message(h, bufs, head)


def _result_in_order(h: ResultHeader, n: int) -> bool:
    """A result's four (N,) tensors in the documented order and dtypes, N served_by, and a fifth only as the
    logits float32 (N, C), C >= 1 (any other layout goes the checked way)."""
    names, dtypes, shapes = h.names, h.dtypes, h.shapes
    s0 = shapes[0]
    if (
        n not in (4, 5)
        or len(s0) != 1
        or shapes.count(s0) != 4
        or len(h.served_by) != s0[0]
        or dict(zip(names[:4], dtypes[:4])) != RESULT_TENSORS
    ):
        return False
    if n == 4:
        return True
    s4 = shapes[4]
    return names[4] == RESULT_LOGITS and dtypes[4] == "float32" and len(s4) == 2 and s4[0] == s0[0] and s4[1] >= 1


def _checked(head: memoryview, frames: Sequence[Any], max_bytes, total, count, kinds: Sequence[str]) -> Message:
    """Every check in the documented order: raises the first failure's ProtocolError, or returns the message."""
    try:
        header = msgpack.unpackb(head, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError("bad_message", f"header frame is not msgpack ({type(exc).__name__})") from None
    if type(header) is not dict:
        raise ProtocolError("bad_message", f"header is a {type(header).__name__}; expected a msgpack map")
    if not all(type(k) is str or type(k) is bytes for k in header):  # maps inside values are not looked into
        raise ProtocolError("bad_message", "header keys must be strings")
    rid, version = header.get("id"), header.get("v")
    echo = rid if is_int(rid, 0, MAX_ID) else 0
    try:
        size = total if total is not None else sum(len(_buffer(f)) for f in frames)
        if max_bytes is not None and size > max_bytes:
            fail("too_large", f"message is {size} bytes; this node accepts at most {max_bytes}")
        check_common(header, kinds)
        check_fields(header)
        described = check_tensors(header, (len(frames) if count is None else count) - 1, max_bytes)
        if len(frames) - 1 < len(described):  # recv kept only the frames within the limit: never serve fewer
            fail("too_large", f"message is over {max_bytes} bytes; this node accepts at most {max_bytes}")
        tensors: dict[str, np.ndarray] = {}
        for (name, dt, shape), frame in zip(described, frames[1:]):
            buf = _buffer(frame)
            expected = math.prod(shape) * ITEMSIZE[dt]
            if len(buf) != expected:
                fail(
                    "bad_tensor", f"tensor {name!r}: frame has {len(buf)} bytes; shape {shape} of {dt} needs {expected}"
                )
            tensors[name] = np.frombuffer(buf, dtype=dt).reshape(shape)
        if header["kind"] == RESULT:
            check_result(header, tensors)
        try:  # what passed the checks in the schema's form (keys that are not strings are unknown keys)
            h = msgspec.convert({k: v for k, v in header.items() if type(k) is str}, SCHEMA[header["kind"]])
        except msgspec.ValidationError as exc:
            fail("bad_message", f"header: {exc}")
    except ProtocolError as exc:
        exc.req_id = echo
        exc.kind = header.get("kind") if header.get("kind") in KINDS else None
        exc.version = version if is_int(version, VERSIONS[0], VERSIONS[-1]) else VERSION
        raise
    return Message(h, [_buffer(f) for f in frames[1 : len(tensors) + 1]], head, header, tensors)


def recv(sock: Any, max_bytes: int, keep: int = MAX_TENSORS + 3, routed: bool = False) -> tuple[list, int, int]:
    """Read one multipart message frame by frame (non-blocking; raises zmq.Again when none waits).

    Returns (frames, total bytes, number of frames). Frames are kept while the running total stays within
    ``max_bytes`` (not counting the first frame when ``routed``: a ROUTER's peer identity, which the
    message's size leaves out) and at most ``keep`` frames; beyond, each further frame is read and
    dropped at once, so the node never holds more than the limit (the first three
    frames, where the identity and header are, are always kept for the error reply).
    ZeroMQ itself holds a whole multipart message before its first frame can be read;
    ZMQ_MAXMSGSIZE (set by the node) bounds each frame there.
    """
    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames, total, count = [frame], len(frame), 1
    limit = max_bytes + len(frame) if routed else max_bytes
    while frame.more:
        frame = sock.recv(copy=False)  # the rest of a multipart message is already there
        total += len(frame)
        count += 1
        if count <= 3 or (total <= limit and count <= keep):
            frames.append(frame)
    return frames, total, count


def error_frames(req_id: int, code: str, message: str, v: int = VERSION, **fields: Any) -> list:
    return encode(ERROR, req_id, v=v, code=code, message=message[:MAX_TEXT], **fields)


def send(socket: Any, frames: Sequence[Any], prefix: Sequence[bytes] = (), flags: int = 0) -> None:
    """Send one message: the ``prefix`` frames (a ROUTER's peer identity), then ``frames``. Arrays of
    COPY_THRESHOLD bytes or more go without a copy (ZeroMQ reads them in place); smaller ones are copied,
    which is cheaper: pyzmq frees a zero-copy frame through a garbage-collector thread, one more thread
    to wake and one more taker of the GIL per message."""
    send = _zmq_send  # the C call itself: pyzmq's Python layer adds nothing a node needs
    parts = [*prefix, *frames] if prefix else frames
    flags = int(flags)
    more, last = _SNDMORE | flags, len(parts) - 1
    for i, part in enumerate(parts):
        big = type(part) is np.ndarray and part.nbytes >= COPY_THRESHOLD
        send(socket, part, more if i < last else flags, not big)


_FRAME = zmq.Frame
_SNDMORE = int(zmq.SNDMORE)  # a plain int: IntFlag arithmetic is slow Python
_zmq_send = zmq.backend.Socket.send
