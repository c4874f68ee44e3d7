"""The wire format of the CIS runtime (see docs/protocol.md).

A message is a ZeroMQ multipart message::

    frame 0     header: a msgpack map (version, kind, request id, entry stage,
                tensor names/dtypes/shapes, deadline, route, kind-specific fields)
    frame 1..n  one raw C-order buffer per tensor, in header order

Tensors are decoded zero-copy (``np.frombuffer`` over the received frame) and
large ones are sent without copying. Only plain msgpack types and raw buffers
cross the wire; nothing on the wire can run code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

VERSION = 1

# kinds
INFER = "infer"  # client -> node: tensors enter at header "stage" (1 = the raw input)
FORWARD = "forward"  # child node -> parent: the carry of the samples the child did not serve
RESULT = "result"  # node -> asker: per-sample class, confidence, exit, flags (+ served_by)
ERROR = "error"  # node -> asker: header "code" and "message"
STATUS = "status"  # asker -> node: counters request
STATUS_REPLY = "status_reply"  # node -> asker: header "status"
PING = "ping"  # child -> parent heartbeat
PONG = "pong"  # parent -> child
KINDS = (INFER, FORWARD, RESULT, ERROR, STATUS, STATUS_REPLY, PING, PONG)

# error codes (header "code" of an ERROR reply)
ERROR_CODES = {
    "bad_message": "the frames are not a valid message (header not msgpack, not a map, a field missing or of the wrong type)",
    "bad_version": "the header's version is not one this node speaks",
    "unknown_kind": "the header's kind is not one of the request kinds",
    "bad_tensor": "a tensor's name, dtype, shape or byte size does not match what the entry stage expects",
    "bad_stage": "the entry stage is not one this node runs",
    "too_large": "the message is larger than the node's max_message_bytes",
    "overloaded": "the node's queue is full; retry later",
    "shutting_down": "the node is stopping and takes no new requests",
    "internal": "running a stage or the exit decision failed; the message says why",
}

# result flags (bit mask per sample)
FLAG_DEGRADED = 1  # parent unreachable, past deadline or refused: served at a lower exit than the policy wanted
FLAG_CAPPED = 2  # transfer cap (token bucket) full: served locally at the node's own exit

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
COPY_THRESHOLD = 65536
MAX_HEADER_BYTES = 1 << 20  # frames at least this large are sent without copying


class ProtocolError(Exception):
    """A message that cannot be decoded; ``code`` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Message:
    header: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.header["kind"]

    @property
    def id(self) -> int:
        return self.header.get("id", 0)


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return memoryview(frame)
    return frame.buffer  # zmq.Frame


def encode(kind: str, req_id: int = 0, tensors: Mapping[str, np.ndarray] | None = None, **fields: Any) -> list:
    """Frames of one message: the header, then one C-contiguous buffer per tensor."""
    tensors = tensors or {}
    arrays = [np.ascontiguousarray(a) for a in tensors.values()]
    header = {
        "v": VERSION,
        "kind": kind,
        "id": int(req_id),
        "names": list(tensors.keys()),
        "dtypes": [a.dtype.name for a in arrays],
        "shapes": [list(a.shape) for a in arrays],
        **fields,
    }
    return [msgpack.packb(header, use_bin_type=True), *arrays]


def decode(frames: Sequence[Any], max_bytes: int | None = None) -> Message:
    """Decode frames (bytes or zmq.Frame) into a Message; tensors are views of the frames.

    Raises :class:`ProtocolError` saying what was wrong.
    """
    if not frames:
        raise ProtocolError("bad_message", "empty message; expected a msgpack header frame")
    if max_bytes is not None:
        total = sum(len(_buffer(f)) for f in frames)
        if total > max_bytes:
            raise ProtocolError("too_large", f"message is {total} bytes; this node accepts at most {max_bytes}")
    head = _buffer(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError("too_large", f"header frame is {len(head)} bytes; at most {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(head, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError("bad_message", f"header frame is not msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_message", f"header is a {type(header).__name__}; expected a msgpack map")
    version = header.get("v")
    if version != VERSION:
        raise ProtocolError("bad_version", f"header version is {version!r}; expected {VERSION}")
    kind = header.get("kind")
    if kind not in KINDS:
        raise ProtocolError("unknown_kind", f"kind is {kind!r}; expected one of {', '.join(KINDS)}")
    rid = header.get("id", 0)
    if isinstance(rid, bool) or not isinstance(rid, int):
        raise ProtocolError("bad_message", f"id is {rid!r}; expected an unsigned integer")
    names, dtypes, shapes = header.get("names", []), header.get("dtypes", []), header.get("shapes", [])
    if not all(isinstance(v, list) for v in (names, dtypes, shapes)):
        raise ProtocolError("bad_message", "names, dtypes and shapes must be arrays")
    if not (len(names) == len(dtypes) == len(shapes) == len(frames) - 1):
        raise ProtocolError(
            "bad_message",
            f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes and {len(frames) - 1} tensor frames; expected equal counts",
        )
    tensors: dict[str, np.ndarray] = {}
    for name, dt, shape, frame in zip(names, dtypes, shapes, frames[1:]):
        if not isinstance(name, str) or name in tensors:
            raise ProtocolError("bad_message", f"tensor name {name!r}: expected a unique string")
        if dt not in DTYPES:
            raise ProtocolError("bad_tensor", f"tensor {name!r}: dtype {dt!r}; expected one of {', '.join(DTYPES)}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in shape):
            raise ProtocolError("bad_tensor", f"tensor {name!r}: shape {shape!r}; expected a list of non-negative integers")
        buf = _buffer(frame)
        expected = math.prod(shape) * np.dtype(dt).itemsize
        if len(buf) != expected:
            raise ProtocolError("bad_tensor", f"tensor {name!r}: frame has {len(buf)} bytes; shape {shape} of {dt} needs {expected}")
        tensors[name] = np.frombuffer(buf, dtype=dt).reshape(shape)
    return Message(header, tensors)


def error_frames(req_id: int, code: str, message: str, **fields: Any) -> list:
    return encode(ERROR, req_id, code=code, message=message, **fields)


def send(socket: Any, frames: Sequence[Any], prefix: Sequence[bytes] = (), flags: int = 0) -> None:
    """Send frames; buffers of COPY_THRESHOLD bytes or more go without a copy."""
    import zmq

    parts = [*prefix, *frames]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        more = zmq.SNDMORE if i < last else 0
        big = isinstance(part, np.ndarray) and part.nbytes >= COPY_THRESHOLD
        socket.send(part, flags | more, copy=not big)
