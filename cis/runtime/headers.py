"""The header schema of the wire protocol, compiled once into msgspec structs (docs/protocol.md, the contract).

:func:`decoder` gives a msgspec decoder for the kinds a receiver accepts; it decodes *and* checks every
header field in one C pass (a bool is not an int, ranges, string lengths and patterns, known dtypes,
the fields each kind requires). :mod:`cis.runtime.protocol` tries it first and falls back to the
field-by-field checks of :mod:`cis.runtime.wire` for a header it refuses; the structs never accept what
those checks refuse (tests/test_protocol.py holds both to that). Each struct's class says its ``kind``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from cis.runtime.wire import (
    BUNDLE_ID_CHARS,
    DROP,
    DTYPES,
    ERROR,
    FORWARD,
    INFER,
    LOAD,
    MAX_DIM,
    MAX_DIMS,
    MAX_NAME,
    MAX_ROUTE,
    MAX_STAGE,
    MAX_TEXT,
    MAX_TRACE_PARTS,
    MAX_TRACESTATE,
    PING,
    PONG,
    RELOAD,
    RESULT,
    STATUS,
    STATUS_REPLY,
    SWITCH,
    TRACE_PART_FULL,
    TRACEPARENT_FULL,
    TRACESTATE_FULL,
    VERSIONS,
)

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]
_Text = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
_TraceParent = Annotated[str, msgspec.Meta(pattern=TRACEPARENT_FULL)]
_TracePart = tuple[Annotated[int, msgspec.Meta(ge=1)], Annotated[str, msgspec.Meta(pattern=TRACE_PART_FULL)]]
_TraceState = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TRACESTATE, pattern=TRACESTATE_FULL)]
_TraceStateEntry = Annotated[str, msgspec.Meta(max_length=MAX_TRACESTATE, pattern=TRACESTATE_FULL)]  # "": none
_Shape = Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=MAX_DIM)]], msgspec.Meta(max_length=MAX_DIMS)]
_BundleId = Annotated[str, msgspec.Meta(min_length=BUNDLE_ID_CHARS, max_length=BUNDLE_ID_CHARS)]  # no regex: cheap
_Path = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]


class Header(msgspec.Struct, tag_field="kind"):
    """A checked header; its class says its ``kind``. Absent optional fields take their defaults."""

    kind: ClassVar[str]
    v: Literal[VERSIONS]  # type: ignore[valid-type]
    id: Annotated[int, msgspec.Meta(ge=0)]  # msgpack integers end at 2^64-1
    names: list[_Name] = []
    dtypes: list[Literal[DTYPES]] = []  # type: ignore[valid-type]
    shapes: list[_Shape] = []
    # absent optional fields take these defaults; nil is no value of any field (refused, like any wrong type)
    stage: Annotated[int, msgspec.Meta(ge=1, le=MAX_STAGE)] = 1
    deadline: Annotated[float, msgspec.Meta(ge=0, le=sys.float_info.max)] = 0.0  # finite: at most max; 0: none
    route: Annotated[list[_Name], msgspec.Meta(max_length=MAX_ROUTE)] = []
    sender: _Text = ""
    node: _Text = ""
    # the trace context (docs/protocol.md, *Trace context*); absent: "" and () (no allocation per message)
    traceparent: _TraceParent = ""
    trace_parts: Annotated[tuple[_TracePart, ...], msgspec.Meta(min_length=1, max_length=MAX_TRACE_PARTS)] = ()
    tracestate: _TraceState = ""  # beside traceparent: the W3C tracestate, passed on unchanged
    trace_states: Annotated[tuple[_TraceStateEntry, ...], msgspec.Meta(min_length=1, max_length=MAX_TRACE_PARTS)] = ()
    want_logits: bool = False  # infer/forward: the result also carries the answering exit's logits (N, C)
    # bundle identity (docs/protocol.md, *Bundle identity*): forward, result, switch, drop; an infer may name one
    bundle: _BundleId = ""
    path: _Path = ""  # load, reload: a bundle folder on the node's machine


class InferHeader(Header, tag=INFER):
    kind = INFER


class ForwardHeader(Header, tag=FORWARD):
    kind = FORWARD


class ResultHeader(Header, tag=RESULT, kw_only=True):
    kind = RESULT
    served_by: list[str]


class ErrorHeader(Header, tag=ERROR, kw_only=True):
    kind = ERROR
    code: _Text
    message: Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]


class StatusHeader(Header, tag=STATUS):
    kind = STATUS


class StatusReplyHeader(Header, tag=STATUS_REPLY, kw_only=True):
    kind = STATUS_REPLY
    status: dict


class PingHeader(Header, tag=PING):
    kind = PING


class PongHeader(Header, tag=PONG):
    kind = PONG


class LoadHeader(Header, tag=LOAD, kw_only=True):
    kind = LOAD
    path: _Path


class SwitchHeader(Header, tag=SWITCH, kw_only=True):
    kind = SWITCH
    bundle: _BundleId


class DropHeader(Header, tag=DROP, kw_only=True):
    kind = DROP
    bundle: _BundleId


class ReloadHeader(Header, tag=RELOAD):
    kind = RELOAD


SCHEMA: dict[str, type[Header]] = {
    h.kind: h
    for h in (
        InferHeader,
        ForwardHeader,
        ResultHeader,
        ErrorHeader,
        StatusHeader,
        StatusReplyHeader,
        PingHeader,
        PongHeader,
        LoadHeader,
        SwitchHeader,
        DropHeader,
        ReloadHeader,
    )
}
DECODERS: dict[tuple[str, ...], msgspec.msgpack.Decoder] = {}


def decoder(kinds: tuple[str, ...]) -> msgspec.msgpack.Decoder:
    dec = DECODERS.get(kinds)
    if dec is None:
        types = tuple(SCHEMA[k] for k in kinds)
        dec = DECODERS[kinds] = msgspec.msgpack.Decoder(types[0] if len(types) == 1 else _union(types))
    return dec


def _union(types: tuple) -> Any:
    from typing import Union

    return Union[types]  # noqa: UP007  (a runtime tuple of types)
