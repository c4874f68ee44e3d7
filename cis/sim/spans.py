"""Where a request's time goes at each node, span by span: the twin's records and the runtime's, in one format.

A span is one stretch of one request's visit to one node, of one kind:

- ``queue``: admitted at the node -> its batch starts running stages;
- ``compute``: the batch ran (one span per request of the batch, all with the batch's start and end); the
  twin's holds the node's work per batch too (its decision and answers), which a runtime node records
  between its ``compute`` span's end and the answer or forward it sends;
- ``forward``: sent to the parent -> the parent's answer (or a refusal) came back; a forward lost in an
  outage or answered too late ends when the node gives up on it;
- ``request``: the request's whole time at the node (admitted -> its answer sent).

The runtime's nodes write them (``cis serve --spans-file``: one JSON object per line,
:class:`cis.runtime.tracing.SpanRecord`); the simulator records the same kinds when asked
(``SimConfig.spans``), and :func:`write_spans` writes them in that format, so :func:`read_spans` reads
either into the same columns. Recording is off by default and then costs nothing: the model checks one
attribute per visit. In the twin's, one request is one trace (its id), each visit's ``request`` span is
the parent of that visit's other spans, and a forward is the parent of the parent node's ``request``
span, as in the runtime's.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
import numpy as np

from cis.core.errors import CisError
from cis.core.records import latency_summary
from cis.runtime.spans import KINDS, SpanRecord
from cis.runtime.spans import read_spans as read_spans_file

QUEUE, COMPUTE, FORWARD, REQUEST = (KINDS.index(k) for k in ("queue", "compute", "forward", "request"))


class SpanLog:
    """The twin's spans as packed arrays (one row per span; a million requests' spans fit)."""

    COLUMNS = ("req", "node", "kind", "start", "end", "batch", "stage_from", "stage_to")

    def __init__(self) -> None:
        self.req = array("q")
        self.node, self.kind, self.batch = array("i"), array("b"), array("i")
        self.stage_from, self.stage_to = array("b"), array("b")
        self.start, self.end = array("d"), array("d")

    def add(self, rid: int, node: int, kind: int, start: float, end: float, batch: int = 0, stages=(0, 0)) -> None:
        self.req.append(rid)
        self.node.append(node)
        self.kind.append(kind)
        self.start.append(start)
        self.end.append(end)
        self.batch.append(batch)
        self.stage_from.append(stages[0])
        self.stage_to.append(stages[1])

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.frombuffer(getattr(self, k), dtype=getattr(self, k).typecode).copy() for k in self.COLUMNS}


def span_records(
    spans: dict[str, np.ndarray], node_ids: list[str], parents: dict[str, str | None] | None = None,
    offset: float = 0.0,
) -> Iterator[dict]:
    """The twin's spans as the runtime writes them (``offset`` seconds added to every time). ``parents``
    (node -> its parent) makes each forward the parent of the parent node's request span of it."""
    order = {FORWARD: 0, REQUEST: 1, QUEUE: 2, COMPUTE: 2}  # a visit's parents before its children
    rows = sorted(range(len(spans["req"])), key=lambda i: (order[int(spans["kind"][i])], i))
    ids = {i: f"{n + 1:016x}" for n, i in enumerate(rows)}
    index = {nid: k for k, nid in enumerate(node_ids)}
    request_span, forward_span = {}, {}
    for i in rows:
        key = (int(spans["req"][i]), int(spans["node"][i]))
        if spans["kind"][i] == FORWARD:
            forward_span[key] = ids[i]
        elif spans["kind"][i] == REQUEST:
            request_span[key] = ids[i]
    children: dict[int, list[int]] = {}
    for child, up in (parents or {}).items():
        if up is not None:
            children.setdefault(index[up], []).append(index[child])
    for i in sorted(rows):
        rid, node, kind = int(spans["req"][i]), int(spans["node"][i]), int(spans["kind"][i])
        if kind == REQUEST:  # the forward of the child that sent it here, if any
            sent = [forward_span[(rid, c)] for c in children.get(node, ()) if (rid, c) in forward_span]
            parent = sent[0] if sent else None
        else:
            parent = request_span.get((rid, node))
        yield {
            "trace_id": f"{rid + 1:032x}",
            "span_id": ids[i],
            "parent_id": parent,
            "node": node_ids[node],
            "kind": KINDS[kind],
            "start": float(spans["start"][i]) + offset,
            "end": float(spans["end"][i]) + offset,
            "req_id": rid,
            "samples": 1,
            "batch": int(spans["batch"][i]),
            "stage_from": int(spans["stage_from"][i]),
            "stage_to": int(spans["stage_to"][i]),
        }


def write_spans(path: str | Path, records: Iterable[dict]) -> int:
    """One JSON object per line, exactly as a runtime node writes its spans file; returns how many."""
    count = 0
    with open(path, "wb") as f:
        for rec in records:
            f.write(msgspec.json.encode(SpanRecord(**rec)) + b"\n")
            count += 1
    return count


def read_spans(paths: Iterable[str | Path]) -> dict[str, np.ndarray]:
    """Spans files (the runtime's per node, ``cis serve --spans-file``, or the twin's) as :func:`span_columns`,
    read by the runtime's own reader (a line a killed node cut short is skipped)."""
    records = []
    for path in paths:
        try:
            records += read_spans_file(path)
        except OSError as exc:
            raise CisError(f"spans {path}: cannot read ({exc.__class__.__name__}); expected a spans file") from None
    return span_columns(msgspec.structs.asdict(r) for r in records)


def span_columns(records: Iterable[dict]) -> dict[str, np.ndarray]:
    """Span records as columns: ``node``, ``kind``, ``trace_id``, ``span_id``, ``parent_id`` (str; "" for
    none), ``start``, ``end``, ``seconds`` (end - start), ``req_id``, ``samples``, ``batch``, ``stage_from``,
    ``stage_to`` (0 where absent)."""
    text = ("node", "kind", "trace_id", "span_id", "parent_id")
    ints = ("req_id", "samples", "batch", "stage_from", "stage_to")
    cols: dict[str, list] = {k: [] for k in (*text, "start", "end", *ints)}
    for rec in records:
        for k in text:
            cols[k].append(str(rec.get(k) or ""))
        cols["start"].append(float(rec["start"]))
        cols["end"].append(float(rec["end"]))
        for k in ints:
            value = rec.get(k)
            cols[k].append(int(value) if isinstance(value, (int, float)) else 0)
    out = {k: np.array(cols[k], dtype=object) for k in text}
    out.update({k: np.array(cols[k], dtype=float) for k in ("start", "end")})
    out.update({k: np.array(cols[k], dtype=np.int64) for k in ints})
    out["seconds"] = out["end"] - out["start"]
    return out


def span_summary(spans: dict[str, np.ndarray], window: tuple[float, float] | None = None) -> dict[str, dict]:
    """Per node and kind, the latency summary of the spans' durations (those that start within ``window``)."""
    keep = np.ones(len(spans["start"]), bool)
    if window is not None:
        keep = (spans["start"] >= window[0]) & (spans["start"] < window[1])
    out: dict[str, dict] = {}
    for node in sorted(set(spans["node"][keep].tolist())):
        at = keep & (spans["node"] == node)
        out[node] = {k: latency_summary(spans["seconds"][at & (spans["kind"] == k)]) for k in KINDS
                     if np.any(at & (spans["kind"] == k))}
    return out
