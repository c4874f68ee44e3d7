"""The wire vocabulary and the header's documented checks (see docs/protocol.md, the contract).

Kinds, error codes, flags, dtypes and limits; :class:`ProtocolError`; and the Python
checks that find the *first* failure of a header in the documented order.
:mod:`cis.runtime.protocol` decodes with a compiled schema first and falls back to
these checks only for a header the schema refuses (or is stricter about).
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np

VERSION = 2  # what a node sends (docs/protocol.md): version 1 and bundle identity, the update kinds
VERSIONS = (1, 2)  # what every receiver reads: a version 1 message is a version 2 message without its additions

# kinds
INFER = "infer"  # client -> node: tensors enter at header "stage" (1 = the raw input)
FORWARD = "forward"  # child node -> parent: the carry of the samples the child did not serve
RESULT = "result"  # node -> asker: per-sample class, confidence, exit, flags (+ served_by; + logits when asked)
ERROR = "error"  # node -> asker: header "code" and "message"
STATUS = "status"  # asker -> node: counters request
STATUS_REPLY = "status_reply"  # node -> asker: header "status"
PING = "ping"  # child -> parent heartbeat
PONG = "pong"  # parent -> child
# updating a model (operator -> node; docs/runtime.md, *Updating a model*): each answered with a status_reply
LOAD = "load"  # header "path": load that bundle beside those the node holds (verified first); no switch
SWITCH = "switch"  # header "bundle": new client requests go to that held bundle, between batches
DROP = "drop"  # header "bundle": drop a held bundle once no queued or forwarded request of it is left
RELOAD = "reload"  # header "path" (default the node's own folder): load, switch, retire the others when unused
UPDATE_KINDS = (LOAD, SWITCH, DROP, RELOAD)
KINDS = (INFER, FORWARD, RESULT, ERROR, STATUS, STATUS_REPLY, PING, PONG, *UPDATE_KINDS)
REQUEST_KINDS = (INFER, FORWARD, STATUS, PING, *UPDATE_KINDS)  # what a node accepts from clients and children
REPLY_KINDS = (RESULT, ERROR, STATUS_REPLY, PONG)  # what comes back

# error codes (header "code" of an ERROR reply); docs/protocol.md says when each is sent
ERROR_CODES = {
    "bad_message": "the frames are not a valid message (header not msgpack, not a map, a field missing, "
    "of the wrong type or out of range)",
    "bad_version": "the header's version is not one this node speaks",
    "unknown_kind": "the header's kind is not one of the request kinds",
    "bad_tensor": "a tensor's name, dtype, shape or byte size is invalid or does not match the entry stage",
    "bad_stage": "the entry stage is not one this node runs",
    "bad_input": "a tensor holds NaN or infinity, or a value the model cannot take (e.g. a token id outside its "
    "embedding: the message has the runtime's reason)",
    "too_large": "the message is larger than the node's max_message_bytes",
    "too_many_samples": "the request has more samples than the node's queue limit; it can never be admitted, split it",
    "overloaded": "the node's queue is full; retry later",
    "deadline_exceeded": "the request's deadline passed before its stages ran",
    "shutting_down": "the node is stopping and takes no new requests",
    "internal": "running a stage or the exit decision failed; the message says why",
    "bundle_mismatch": "the message names a bundle this node does not hold (a carry is continued only by the "
    "bundle that made it), or a result came from another bundle than the forward named",
    "bad_bundle": "a bundle could not be loaded (missing, changed, unsigned, not fitting the node) or dropped "
    "(the one it serves); the node serves as before",
    "busy": "the node is loading another bundle; ask again once that load has been answered",
}

# result flags (bit mask per sample)
FLAG_DEGRADED = 1  # parent unreachable, past deadline or refused: served at a lower exit than the policy wanted
FLAG_CAPPED = 2  # transfer cap (token bucket) empty: served locally at the node's own exit
FLAG_NONFINITE = 4  # input held NaN/inf (node option nonfinite="flag"): answered here, class -1, never forwarded

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
ITEMSIZE = {d: np.dtype(d).itemsize for d in DTYPES}
NUMPY_DTYPE = {d: np.dtype(d) for d in DTYPES}
DTYPE_NAME = {np.dtype(d): d for d in DTYPES}  # dtype.name is a slow Python property
COPY_THRESHOLD = 1 << 20  # arrays at least this large are sent without a copy (see send)

# limits of the header schema (docs/protocol.md, "Header fields")
MAX_HEADER_BYTES = 1 << 20
MAX_ID = (1 << 64) - 1
MAX_STAGE = 255
MAX_TENSORS = 64
MAX_DIMS = 8
MAX_DIM = (1 << 31) - 1
MAX_NAME = 128  # characters of a tensor name, node id or route entry
MAX_ROUTE = 16
MAX_TEXT = 4096  # characters of an error message, or of a bundle's path
BUNDLE_ID_CHARS = 16  # a bundle id: the first 16 hex digits of the sha256 of its manifest.json (Bundle.id)
# a W3C trace context (https://www.w3.org/TR/trace-context/): version 00, lowercase hex, ids not all zero
TRACEPARENT_PATTERN = r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
TRACEPARENT_FULL = r"\A" + TRACEPARENT_PATTERN + r"\Z"  # one whole string: no trailing newline
TRACE_PART_FULL = r"\A(?:" + TRACEPARENT_PATTERN + r")?\Z"  # a trace_parts entry's context: one, or "" for none
MAX_TRACE_PARTS = 4096  # entries of trace_parts: the traced requests whose samples one forward carries
# a W3C tracestate, passed on unchanged beside its traceparent: W3C's list grammar, spaces (not tabs) around members,
# blank members allowed, at most 32 members; duplicate keys are not looked for. Its length is checked apart:
# 1..MAX_TRACESTATE characters for ``tracestate``, 0..MAX_TRACESTATE for an entry of ``trace_states`` ("": none)
MAX_TRACESTATE = 512  # W3C: what every participant must be able to pass on
_STATE_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_STATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"  # no "," or "=", no end space
_STATE_MEMBER = r" *(?:" + _STATE_KEY + "=" + _STATE_VALUE + r" *)?"  # one parse only: no backtracking blow-up
TRACESTATE_FULL = r"\A" + _STATE_MEMBER + r"(?:," + _STATE_MEMBER + r"){0,31}\Z"
RESULT_TENSORS = {"class": "int64", "confidence": "float32", "exit": "int32", "flags": "uint8"}
RESULT_LOGITS = "logits"  # the fifth result tensor, float32 (N, C), only for a request whose header has want_logits
TENSOR_KINDS = (INFER, FORWARD, RESULT)  # the other kinds carry no tensors
NEEDS = {LOAD: "path", SWITCH: "bundle", DROP: "bundle"}  # the update kinds' required header field


class ProtocolError(Exception):
    """A message that cannot be accepted; ``code`` is one of ERROR_CODES, ``req_id`` the
    request id when it could be read (else 0), for the error reply to echo; ``kind`` the header's
    kind when it is one of KINDS."""

    def __init__(self, code: str, message: str, req_id: int = 0):
        super().__init__(message)
        self.code = code
        self.message = message
        self.req_id = req_id
        self.kind: str | None = None  # the header's kind when it was a known one (metrics count by kind)
        self.version = VERSION  # the header's version when it was one of VERSIONS: the reply speaks it


def fail(code: str, message: str) -> None:
    raise ProtocolError(code, message)


def is_int(v: Any, lo: int, hi: int) -> TypeGuard[int]:
    return type(v) is int and lo <= v <= hi  # type(): True/False are not integers here


def is_name(v: Any) -> bool:
    return type(v) is str and 0 < len(v) <= MAX_NAME


def optional_text(h: dict, key: str, limit: int = MAX_NAME) -> None:
    v = h.get(key)
    if key in h and not (type(v) is str and len(v) <= limit):
        fail("bad_message", f"{key} is {show(v)}; expected a string of at most {limit} characters")


_TRACEPARENT = re.compile(TRACEPARENT_FULL)


def is_traceparent(v: Any) -> bool:
    """A W3C traceparent string: ``00-<32 hex>-<16 hex>-<2 hex>``, lowercase, trace and span id not all zero."""
    return type(v) is str and _TRACEPARENT.match(v) is not None


_TRACESTATE = re.compile(TRACESTATE_FULL)
STATE_RULE = f"1..{MAX_TRACESTATE} printable ASCII characters, at most 32 comma-separated members key=value"


def is_tracestate(v: Any, empty: bool = False) -> bool:
    """A W3C tracestate string of 1..512 characters (``empty``: 0..512, an entry of ``trace_states``)."""
    return type(v) is str and (empty or v != "") and len(v) <= MAX_TRACESTATE and _TRACESTATE.match(v) is not None


def is_trace_part(v: Any) -> bool:
    """One entry of ``trace_parts``: [samples >= 1, a traceparent or "" (those samples carry no context)]."""
    return type(v) is list and len(v) == 2 and is_int(v[0], 1, MAX_ID) and (v[1] == "" or is_traceparent(v[1]))


def _bounded_repr() -> reprlib.Repr:
    """A repr that stops at a few levels and items: a value nested 1,000 deep (1 KB of msgpack) would make
    the plain repr recurse past Python's limit and kill the node instead of answering the error."""
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 4, 12, 12, 12, 12
    r.maxstring = r.maxlong = r.maxother = 200  # past the 60 characters shown, so a shallow value reads as repr's
    return r


_REPR = _bounded_repr()


def show(v: Any) -> str:
    text = _REPR.repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_common(h: dict, kinds: Sequence[str]) -> None:
    """v, kind, id (in this order: the first failure is the one reported)."""
    v = h.get("v")
    if not is_int(v, VERSIONS[0], VERSIONS[-1]):
        fail("bad_version", f"header version v is {show(v)}; expected the integer 1 or {VERSION}")
    kind = h.get("kind")
    if type(kind) is not str or kind not in kinds:
        fail("unknown_kind", f"kind is {show(kind)}; expected one of {', '.join(kinds)}")
    if not is_int(h.get("id"), 0, MAX_ID):
        fail("bad_message", f"id is {show(h.get('id'))}; expected an unsigned 64-bit integer")


def check_fields(h: dict) -> None:
    """The optional request and reply fields other than the tensor description. A field that is present must
    hold a value of its type: nil (None) is refused like any other wrong type, never read as "absent"."""
    stage = h.get("stage")
    if "stage" in h and not is_int(stage, 1, MAX_STAGE):
        fail("bad_stage", f"stage is {show(stage)}; expected an integer 1..{MAX_STAGE}")
    deadline: Any = h.get("deadline")
    if "deadline" in h and not (type(deadline) in (int, float) and math.isfinite(deadline) and deadline >= 0):
        fail(
            "bad_message",
            f"deadline is {show(deadline)}; expected seconds since the epoch (a finite number >= 0) or 0 for none",
        )
    route = h.get("route")
    if "route" in h:
        if type(route) is not list or len(route) > MAX_ROUTE or not all(map(is_name, route)):
            fail(
                "bad_message",
                f"route is {show(route)}; expected at most {MAX_ROUTE} node ids (strings of 1..{MAX_NAME} characters)",
            )
    optional_text(h, "sender")
    optional_text(h, "node")
    check_update(h)
    check_trace(h)
    want = h.get("want_logits")
    if "want_logits" in h and type(want) is not bool:
        fail("bad_message", f"want_logits is {show(want)}; expected true or false")
    kind = h["kind"]
    if kind == ERROR:
        for key, limit in (("code", MAX_NAME), ("message", MAX_TEXT)):
            if type(h.get(key)) is not str or len(h[key]) > limit:
                fail("bad_message", f"error {key} is {show(h.get(key))}; expected a string")
    elif kind == STATUS_REPLY and type(h.get("status")) is not dict:
        fail("bad_message", f"status is {show(h.get('status'))}; expected a map")


def is_bundle_id(v: Any) -> bool:
    """A ``bundle`` field's value: a string of 16 characters. The ids nodes hold are 16 lowercase hex digits
    (the start of the sha256 of a bundle's manifest.json), so any other 16 characters name no bundle a node
    holds: ``bundle_mismatch``. Only the length is a header check: it costs nothing per message."""
    return type(v) is str and len(v) == BUNDLE_ID_CHARS


def check_update(h: dict) -> None:
    """``bundle`` (a bundle id) and ``path`` (a bundle folder), and the field each update kind needs."""
    b = h.get("bundle")
    if "bundle" in h and not is_bundle_id(b):
        fail("bad_message", f"bundle is {show(b)}; expected a bundle id ({BUNDLE_ID_CHARS} lowercase hex digits)")
    path = h.get("path")
    if "path" in h and not (type(path) is str and 0 < len(path) <= MAX_TEXT):
        fail("bad_message", f"path is {show(path)}; expected a bundle folder (a string of 1..{MAX_TEXT} characters)")
    need = NEEDS.get(h["kind"])
    if need is not None and need not in h:
        fail("bad_message", f"a {h['kind']} message needs {need!r}")


def check_trace(h: dict) -> None:
    """``traceparent``, ``trace_parts``, ``tracestate`` and ``trace_states`` (docs/protocol.md, *Trace context*):
    present means valid (which of them may come together is the node's check: :func:`cis.runtime.tracing.admitted`)."""
    tp = h.get("traceparent")
    if "traceparent" in h and not is_traceparent(tp):
        fail(
            "bad_message",
            f"traceparent is {show(tp)}; expected a W3C traceparent 00-<32 hex>-<16 hex>-<2 hex> "
            "(lowercase, ids not all zero)",
        )
    parts = h.get("trace_parts")
    if "trace_parts" in h and not (
        type(parts) is list and 0 < len(parts) <= MAX_TRACE_PARTS and all(map(is_trace_part, parts))
    ):
        fail(
            "bad_message",
            f"trace_parts is {show(parts)}; expected 1..{MAX_TRACE_PARTS} pairs [samples >= 1, traceparent or \"\"]",
        )
    ts = h.get("tracestate")
    if "tracestate" in h and not is_tracestate(ts):
        fail("bad_message", f"tracestate is {show(ts)}; expected a W3C tracestate: {STATE_RULE}")
    states = h.get("trace_states")
    if "trace_states" in h and not (
        type(states) is list and 0 < len(states) <= MAX_TRACE_PARTS and all(is_tracestate(s, True) for s in states)
    ):
        fail("bad_message", f"trace_states is {show(states)}; expected 1..{MAX_TRACE_PARTS} entries, each \"\" or a "
             f"W3C tracestate ({STATE_RULE})")  # fmt: skip


def check_tensors(h: dict, n_frames: int, max_bytes: int | None) -> list[tuple[str, str, list]]:
    """names, dtypes and shapes: equal counts, equal to the tensor frames; known dtypes; shapes of
    non-negative dimensions whose declared total fits ``max_bytes``. Returns (name, dtype, shape)."""
    names, dtypes, shapes = h.get("names", []), h.get("dtypes", []), h.get("shapes", [])
    if type(names) is not list or type(dtypes) is not list or type(shapes) is not list:
        fail("bad_tensor", "names, dtypes and shapes must be arrays")
    if not (len(names) == len(dtypes) == len(shapes) == n_frames):
        fail(
            "bad_message",
            f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes and {n_frames} tensor frames; "
            "expected equal counts",
        )
    if n_frames > MAX_TENSORS:
        fail("bad_message", f"{n_frames} tensors; at most {MAX_TENSORS}")
    if n_frames and h["kind"] not in TENSOR_KINDS:
        fail("bad_message", f"a {h['kind']} message carries no tensors; got {n_frames}")
    if len(set(n for n in names if type(n) is str)) != n_frames or not all(map(is_name, names)):
        fail("bad_tensor", f"tensor names {show(names)}; expected unique strings of 1..{MAX_NAME} characters")
    declared = 0
    out = []
    for name, dt, shape in zip(names, dtypes, shapes):
        if type(dt) is not str or dt not in ITEMSIZE:
            fail("bad_tensor", f"tensor {name!r}: dtype {show(dt)}; expected one of {', '.join(DTYPES)}")
        if type(shape) is not list or len(shape) > MAX_DIMS or not all(is_int(d, 0, MAX_DIM) for d in shape):
            fail(
                "bad_tensor",
                f"tensor {name!r}: shape {show(shape)}; expected at most {MAX_DIMS} integers 0..{MAX_DIM}",
            )
        declared += math.prod(shape) * ITEMSIZE[dt]
        out.append((name, dt, shape))
    if max_bytes is not None and declared > max_bytes:
        fail("bad_tensor", f"the shapes declare {declared} bytes of tensors; this node accepts at most {max_bytes}")
    return out


def check_result(h: dict, tensors: dict[str, np.ndarray]) -> None:
    """A result carries class, confidence, exit, flags (N,) in the documented dtypes, optionally ``logits``
    float32 (N, C) with C >= 1, and N served_by strings."""
    logits = tensors.get(RESULT_LOGITS)
    four = {k: a for k, a in tensors.items() if k != RESULT_LOGITS}
    got = {k: a.dtype.name for k, a in four.items()}
    if got != RESULT_TENSORS or len({a.shape for a in four.values()}) != 1 or tensors["class"].ndim != 1:
        fail("bad_tensor", f"result tensors {got}; expected {RESULT_TENSORS}, all of shape (N,)")
    if logits is not None and not (
        logits.dtype.name == "float32" and logits.ndim == 2 and logits.shape[0] == len(tensors["class"])
        and logits.shape[1] >= 1
    ):  # fmt: skip
        fail(
            "bad_tensor",
            f"result tensor logits: {logits.dtype.name} {list(logits.shape)}; expected float32 [N, C], C >= 1",
        )
    served = h.get("served_by")
    if type(served) is not list or len(served) != len(tensors["class"]) or not set(map(type, served)) <= {str}:
        fail("bad_message", f"served_by is {show(served)}; expected one node id (string) per sample")

# ---------------------------------------------------------------- client retries (cis.runtime.entries)

RETRY_AFTER = 3.0  # seconds a client waits for a reply before it sends a request again (cis infer --retry-after)
RETRY_CODES = frozenset({"shutting_down"})  # error replies that say the entry node is going away: sent again
