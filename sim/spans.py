"""Where a request's time goes at each node, span by span: the twin's records and the runtime's, in one format.

A span is one stretch of one request's visit to one node, of one kind:

- ``queue``: admitted at the node -> its batch starts running stages;
- ``compute``: the batch's stages ran (one span per request of the batch, all with the batch's start and end);
- ``forward``: sent to the parent -> the parent's answer (or a refusal) came back; a forward lost in an
  outage or answered too late ends when the node gives up on it;
- ``request``: the request's whole time at the node (admitted -> its answer sent).

The runtime's nodes write them (one JSON object per line, the tracing format of issue 33); the simulator
records the same kinds when asked (``SimConfig.spans``), and :func:`write_spans` writes them in that
format, so :func:`read_spans` reads either into the same columns. Recording is off by default and then
costs nothing: the model checks one attribute per visit.

A line::

    {"trace_id": "32 hex", "span_id": "16 hex", "parent_id": "16 hex or null", "node": "edge0",
     "kind": "queue", "start": 1700000000.25, "end": 1700000000.26, "req_id": 7, "samples": 1,
     "batch": 4, "stage_from": 2, "stage_to": 2}

``start``/``end`` are seconds (unix time from the runtime; simulated seconds from the twin);
``batch`` is how many samples ran in the batch (queue and compute spans; 0 otherwise).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from cis.errors import CisError
from cis.metrics import latency_summary

KINDS = ("queue", "compute", "forward", "request")
QUEUE, COMPUTE, FORWARD, REQUEST = range(len(KINDS))
FIELDS = ("trace_id", "span_id", "parent_id", "node", "kind", "start", "end", "req_id", "samples", "batch",
          "stage_from", "stage_to")


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


def span_records(spans: dict[str, np.ndarray], node_ids: list[str], offset: float = 0.0) -> Iterator[dict]:
    """The twin's spans as the runtime writes them: one trace per request (its id), the request span of a
    visit as the parent of that visit's other spans; ``offset`` seconds added to every time."""
    request_span: dict[tuple[int, int], str] = {}
    rows = sorted(range(len(spans["req"])), key=lambda i: (spans["kind"][i] != REQUEST, i))  # parents first
    for n, i in enumerate(rows):
        rid, node, kind = int(spans["req"][i]), int(spans["node"][i]), int(spans["kind"][i])
        span_id = f"{n + 1:016x}"
        if kind == REQUEST:
            request_span[(rid, node)] = span_id
        yield {
            "trace_id": f"{rid + 1:032x}",
            "span_id": span_id,
            "parent_id": None if kind == REQUEST else request_span.get((rid, node)),
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
    """One JSON object per line; returns how many."""
    count = 0
    with open(path, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            count += 1
    return count


def read_spans(paths: Iterable[str | Path]) -> dict[str, np.ndarray]:
    """Spans files (the runtime's per node, or the twin's) as :func:`span_columns`. A line that is not a
    span stops with one line naming the file and line."""
    return span_columns(rec for path in paths for rec in _lines(Path(path)))


def _lines(path: Path) -> Iterator[dict]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CisError(f"spans {path}: cannot read ({exc.__class__.__name__}); expected JSON lines") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            float(rec["start"]), float(rec["end"]), str(rec["node"]), rec["kind"]
        except (ValueError, KeyError, TypeError):
            raise CisError(
                f"spans {path} line {number}: not a span; expected a JSON object with node, kind, start, end"
            ) from None
        yield rec


def span_columns(records: Iterable[dict]) -> dict[str, np.ndarray]:
    """Span records as columns: ``node``, ``kind``, ``trace_id`` (str), ``start``, ``end``, ``seconds``
    (end - start), ``req_id``, ``samples``, ``batch``, ``stage_from``, ``stage_to`` (0 where absent)."""
    text, ints = ("node", "kind", "trace_id"), ("req_id", "samples", "batch", "stage_from", "stage_to")
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
