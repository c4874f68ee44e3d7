"""A node's spans as records: one line of a spans file (the format agreed with the twin of issue 36), the
span kinds, and the reader. :mod:`cis.runtime.tracing` writes them, :mod:`cis.runtime.otel` exports them and
:mod:`cis.sim.spans` sets the twin's beside them."""

from __future__ import annotations

from pathlib import Path

import msgspec

KINDS = ("request", "queue", "compute", "forward")


class SpanRecord(msgspec.Struct, omit_defaults=True):
    """One line of a spans file (the format agreed with the twin of issue 36), in this key order; ``tracestate``
    only when the span's trace came with one (absent, as in older files and the twin's: "")."""

    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    parent_id: str | None  # 16 hex; None: the root of its trace
    node: str
    kind: str  # one of KINDS
    start: float  # Unix seconds
    end: float
    req_id: int  # the request's id at this node (a client's id, or the child's forward id)
    samples: int  # the request's samples in this trace (forward: those sent up)
    batch: int  # samples in the micro-batch the request ran in; 0: it never ran
    stage_from: int  # the stages this node runs for the request
    stage_to: int
    tracestate: str = ""  # the W3C tracestate that came with the request's traceparent, as it came


LINE_ENCODER = msgspec.json.Encoder()
_READER = msgspec.json.Decoder(SpanRecord)


def read_spans(path: str | Path) -> list[SpanRecord]:
    """The spans of a spans file (a line cut short by a node that was killed is skipped)."""
    out = []
    for line in Path(path).read_bytes().splitlines():
        try:
            out.append(_READER.decode(line))
        except msgspec.DecodeError:
            continue
    return out
