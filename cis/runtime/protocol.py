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
REQUEST_KINDS = (INFER, FORWARD, STATUS, PING)  # what a node accepts from clients and children
REPLY_KINDS = (RESULT, ERROR, STATUS_REPLY, PONG)  # what comes back

# error codes (header "code" of an ERROR reply); docs/protocol.md says when each is sent
ERROR_CODES = {
    "bad_message": "the frames are not a valid message (header not msgpack, not a map, a field missing, "
    "of the wrong type or out of range)",
    "bad_version": "the header's version is not one this node speaks",
    "unknown_kind": "the header's kind is not one of the request kinds",
    "bad_tensor": "a tensor's name, dtype, shape or byte size is invalid or does not match the entry stage",
    "bad_stage": "the entry stage is not one this node runs",
    "bad_input": "a tensor holds NaN or infinity",
    "too_large": "the message is larger than the node's max_message_bytes",
    "too_many_samples": "the request has more samples than the node's queue limit; it can never be admitted, split it",
    "overloaded": "the node's queue is full; retry later",
    "deadline_exceeded": "the request's deadline passed before its stages ran",
    "shutting_down": "the node is stopping and takes no new requests",
    "internal": "running a stage or the exit decision failed; the message says why",
}

# result flags (bit mask per sample)
FLAG_DEGRADED = 1  # parent unreachable, past deadline or refused: served at a lower exit than the policy wanted
FLAG_CAPPED = 2  # transfer cap (token bucket) empty: served locally at the node's own exit
FLAG_NONFINITE = 4  # input held NaN/inf (node option nonfinite="flag"): answered here, class -1, never forwarded

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
_ITEMSIZE = {d: np.dtype(d).itemsize for d in DTYPES}
_NAME = {np.dtype(d): d for d in DTYPES}  # dtype.name is a slow Python property
COPY_THRESHOLD = 65536  # frames at least this large are sent without copying

# limits of the header schema (docs/protocol.md, "Header fields")
MAX_HEADER_BYTES = 1 << 20
MAX_ID = (1 << 64) - 1
MAX_STAGE = 255
MAX_TENSORS = 64
MAX_DIMS = 8
MAX_DIM = (1 << 31) - 1
MAX_NAME = 128  # characters of a tensor name, node id or route entry
MAX_ROUTE = 16
MAX_TEXT = 4096  # characters of an error message
RESULT_TENSORS = {"class": "int64", "confidence": "float32", "exit": "int32", "flags": "uint8"}


class ProtocolError(Exception):
    """A message that cannot be accepted; ``code`` is one of ERROR_CODES, ``req_id`` the
    request id when it could be read (else 0), for the error reply to echo."""

    def __init__(self, code: str, message: str, req_id: int = 0):
        super().__init__(message)
        self.code = code
        self.message = message
        self.req_id = req_id


@dataclass
class Message:
    header: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.header["kind"]

    @property
    def id(self) -> int:
        return self.header["id"]


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, np.ndarray):
        return memoryview(np.ascontiguousarray(frame).reshape(-1).view(np.uint8))
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
        "dtypes": [_NAME.get(a.dtype) or a.dtype.name for a in arrays],
        "shapes": [list(a.shape) for a in arrays],
        **fields,
    }
    return [msgpack.packb(header, use_bin_type=True), *arrays]


def _fail(code: str, message: str) -> None:
    raise ProtocolError(code, message)


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi  # type(): True/False are not integers here


def _is_name(v: Any) -> bool:
    return type(v) is str and 0 < len(v) <= MAX_NAME


def _optional_text(h: dict, key: str, limit: int = MAX_NAME) -> None:
    v = h.get(key)
    if v is not None and not (type(v) is str and len(v) <= limit):
        _fail("bad_message", f"{key} is {_show(v)}; expected a string of at most {limit} characters")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_common(h: dict, kinds: Sequence[str]) -> None:
    """v, kind, id (in this order: the first failure is the one reported)."""
    v = h.get("v")
    if not _is_int(v, VERSION, VERSION):
        _fail("bad_version", f"header version v is {_show(v)}; expected the integer {VERSION}")
    kind = h.get("kind")
    if type(kind) is not str or kind not in kinds:
        _fail("unknown_kind", f"kind is {_show(kind)}; expected one of {', '.join(kinds)}")
    if not _is_int(h.get("id"), 0, MAX_ID):
        _fail("bad_message", f"id is {_show(h.get('id'))}; expected an unsigned 64-bit integer")


def _check_fields(h: dict) -> None:
    """The optional request and reply fields other than the tensor description."""
    stage = h.get("stage")
    if stage is not None and not _is_int(stage, 1, MAX_STAGE):
        _fail("bad_stage", f"stage is {_show(stage)}; expected an integer 1..{MAX_STAGE}")
    deadline = h.get("deadline")
    if deadline is not None and not (type(deadline) in (int, float) and math.isfinite(deadline) and deadline >= 0):
        _fail(
            "bad_message",
            f"deadline is {_show(deadline)}; expected seconds since the epoch (a finite number >= 0) or 0 for none",
        )
    route = h.get("route")
    if route is not None:
        if type(route) is not list or len(route) > MAX_ROUTE or not all(map(_is_name, route)):
            _fail(
                "bad_message",
                f"route is {_show(route)}; expected at most {MAX_ROUTE} node ids (strings of 1..{MAX_NAME} characters)",
            )
    _optional_text(h, "sender")
    _optional_text(h, "node")
    kind = h["kind"]
    if kind == ERROR:
        for key, limit in (("code", MAX_NAME), ("message", MAX_TEXT)):
            if type(h.get(key)) is not str or len(h[key]) > limit:
                _fail("bad_message", f"error {key} is {_show(h.get(key))}; expected a string")
    elif kind == STATUS_REPLY and type(h.get("status")) is not dict:
        _fail("bad_message", f"status is {_show(h.get('status'))}; expected a map")


def _check_tensors(h: dict, n_frames: int, max_bytes: int | None) -> list[tuple[str, str, list]]:
    """names, dtypes and shapes: equal counts, equal to the tensor frames; known dtypes; shapes of
    non-negative dimensions whose declared total fits ``max_bytes``. Returns (name, dtype, shape)."""
    names, dtypes, shapes = h.get("names", []), h.get("dtypes", []), h.get("shapes", [])
    if type(names) is not list or type(dtypes) is not list or type(shapes) is not list:
        _fail("bad_tensor", "names, dtypes and shapes must be arrays")
    if not (len(names) == len(dtypes) == len(shapes) == n_frames):
        _fail(
            "bad_message",
            f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes and {n_frames} tensor frames; "
            "expected equal counts",
        )
    if n_frames > MAX_TENSORS:
        _fail("bad_message", f"{n_frames} tensors; at most {MAX_TENSORS}")
    if n_frames and h["kind"] in (STATUS, PING, ERROR, STATUS_REPLY, PONG):
        _fail("bad_message", f"a {h['kind']} message carries no tensors; got {n_frames}")
    if len(set(n for n in names if type(n) is str)) != n_frames or not all(map(_is_name, names)):
        _fail("bad_tensor", f"tensor names {_show(names)}; expected unique strings of 1..{MAX_NAME} characters")
    declared = 0
    out = []
    for name, dt, shape in zip(names, dtypes, shapes):
        if type(dt) is not str or dt not in _ITEMSIZE:
            _fail("bad_tensor", f"tensor {name!r}: dtype {_show(dt)}; expected one of {', '.join(DTYPES)}")
        if type(shape) is not list or len(shape) > MAX_DIMS or not all(_is_int(d, 0, MAX_DIM) for d in shape):
            _fail(
                "bad_tensor",
                f"tensor {name!r}: shape {_show(shape)}; expected at most {MAX_DIMS} integers 0..{MAX_DIM}",
            )
        declared += math.prod(shape) * _ITEMSIZE[dt]
        out.append((name, dt, shape))
    if max_bytes is not None and declared > max_bytes:
        _fail("bad_tensor", f"the shapes declare {declared} bytes of tensors; this node accepts at most {max_bytes}")
    return out


def _check_result(h: dict, tensors: dict[str, np.ndarray]) -> None:
    """A result carries class, confidence, exit, flags (N,) in the documented dtypes and N served_by strings."""
    got = {k: a.dtype.name for k, a in tensors.items()}
    if got != RESULT_TENSORS or len({a.shape for a in tensors.values()}) != 1 or tensors["class"].ndim != 1:
        _fail("bad_tensor", f"result tensors {got}; expected {RESULT_TENSORS}, all of shape (N,)")
    served = h.get("served_by")
    if type(served) is not list or len(served) != len(tensors["class"]) or not set(map(type, served)) <= {str}:
        _fail("bad_message", f"served_by is {_show(served)}; expected one node id (string) per sample")


def decode(
    frames: Sequence[Any],
    max_bytes: int | None = None,
    total: int | None = None,
    count: int | None = None,
    kinds: Sequence[str] = KINDS,
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
        header = msgpack.unpackb(head, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError("bad_message", f"header frame is not msgpack ({type(exc).__name__})") from None
    if type(header) is not dict:
        raise ProtocolError("bad_message", f"header is a {type(header).__name__}; expected a msgpack map")
    rid = header.get("id")
    echo = rid if _is_int(rid, 0, MAX_ID) else 0
    try:
        size = total if total is not None else sum(len(_buffer(f)) for f in frames)
        if max_bytes is not None and size > max_bytes:
            _fail("too_large", f"message is {size} bytes; this node accepts at most {max_bytes}")
        _check_common(header, kinds)
        _check_fields(header)
        described = _check_tensors(header, (len(frames) if count is None else count) - 1, max_bytes)
        tensors: dict[str, np.ndarray] = {}
        for (name, dt, shape), frame in zip(described, frames[1:]):
            buf = _buffer(frame)
            expected = math.prod(shape) * _ITEMSIZE[dt]
            if len(buf) != expected:
                _fail(
                    "bad_tensor", f"tensor {name!r}: frame has {len(buf)} bytes; shape {shape} of {dt} needs {expected}"
                )
            tensors[name] = np.frombuffer(buf, dtype=dt).reshape(shape)
        if header["kind"] == RESULT:
            _check_result(header, tensors)
    except ProtocolError as exc:
        exc.req_id = echo
        raise
    return Message(header, tensors)


def recv(sock: Any, max_bytes: int, keep: int = MAX_TENSORS + 3) -> tuple[list, int, int]:
    """Read one multipart message frame by frame (non-blocking; raises zmq.Again when none waits).

    Returns (frames, total bytes, number of frames). Frames are kept while the running total stays within
    ``max_bytes`` and at most ``keep`` frames; beyond, each further frame is read and
    dropped at once, so the node never holds more than the limit (the first three
    frames, where the identity and header are, are always kept for the error reply).
    ZeroMQ itself holds a whole multipart message before its first frame can be read;
    ZMQ_MAXMSGSIZE (set by the node) bounds each frame there.
    """
    import zmq

    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames, total, count = [frame], len(frame), 1
    while frame.more:
        frame = sock.recv(copy=False)  # the rest of a multipart message is already there
        total += len(frame)
        count += 1
        if count <= 3 or (total <= max_bytes and count <= keep):
            frames.append(frame)
    return frames, total, count


def error_frames(req_id: int, code: str, message: str, **fields: Any) -> list:
    return encode(ERROR, req_id, code=code, message=message[:MAX_TEXT], **fields)


def send(socket: Any, frames: Sequence[Any], prefix: Sequence[bytes] = (), flags: int = 0) -> None:
    """Send frames; buffers of COPY_THRESHOLD bytes or more go without a copy."""
    import zmq

    more, flags = int(zmq.SNDMORE) | int(flags), int(flags)  # plain ints: IntFlag arithmetic is slow Python
    parts = [*prefix, *frames]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        big = isinstance(part, np.ndarray) and part.nbytes >= COPY_THRESHOLD
        socket.send(part, more if i < last else flags, copy=not big)
