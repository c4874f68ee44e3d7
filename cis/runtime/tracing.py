"""One trace per request across the tiers: the W3C trace context on the wire and each node's spans.

A request may carry a W3C ``traceparent`` (docs/protocol.md, *Trace context*). A node
started with ``--spans-file`` or ``--otlp-endpoint`` (or the ``OTEL_EXPORTER_OTLP_*``
variables) records four kinds of span per request (docs/runtime.md, *Tracing*)::

    request   admitted -> its reply (or error) sent          parent: the asker's span (a child's forward span)
    queue     admitted -> its batch starts                   parent: the request span
    compute   its batch starts -> the batch's stages ran     parent: the request span
    forward   its samples sent to the parent -> answer back  parent: the request span

and sends ``00-<trace id>-<forward span id>-<flags>`` upward, so the parent's request span
is a child of this node's forward span: a forwarded request is one trace with spans from
every node it visited. A node without a tracer passes the context it got on unchanged. A
``tracestate`` that came with a traceparent goes upward unchanged beside it, from every node
(no node owns an entry in it: W3C's rule for such a participant), and is on each of its spans.

A forward carries the undecided samples of a whole batch, several requests' worth; each
request's samples keep their own trace: the forward's ``trace_parts`` lists, in carry order,
[samples, traceparent] per request (a *segment* here), ``trace_states`` their tracestates
in the same order, and the parent records each segment's spans in its own trace. Everything
here runs only for a request that carries a context or at a node that traces: elsewhere the
cost is a None check per request.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cis.core.errors import CisError
from cis.core.logs import event
from cis.runtime.spans import LINE_ENCODER, SpanRecord
from cis.runtime.wire import MAX_TRACE_PARTS, STATE_RULE, is_traceparent, is_tracestate

if TYPE_CHECKING:
    from cis.runtime.requests import Request

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5  # a spans file reaches the disk at least this often
OTLP_PATH = "/v1/traces"  # OTLP over HTTP: where spans go under a collector's base URL
ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


def check_traceparent(value: str, where: str = "traceparent") -> str:
    """``value`` if it is a W3C traceparent, else a one-line CisError (clients and commands)."""
    if not is_traceparent(value):
        raise CisError(
            f"{where} is {value!r}; expected a W3C traceparent 00-<32 hex>-<16 hex>-<2 hex> "
            "(lowercase, ids not all zero), e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        )
    return value


def check_tracestate(value: str, where: str = "tracestate") -> str:
    """``value`` if it is a W3C tracestate the wire carries (docs/protocol.md, *Trace context*), else a one-line
    CisError (clients and commands)."""
    if not is_tracestate(value):
        raise CisError(f"{where} is {value!r:.80}; expected a W3C tracestate: {STATE_RULE}, e.g. "
                       "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")  # fmt: skip
    return value


_NO_FIELDS: dict[str, str] = {}  # a request without a context: nothing to add (never changed)


def trace_fields(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """A client request's trace header fields, each checked (one line); a tracestate only beside a traceparent."""
    if traceparent is None:
        if tracestate is not None:
            raise CisError(f"tracestate is {tracestate!r:.80} without a traceparent; expected a traceparent beside it "
                           "(a tracestate belongs to its traceparent's trace)")  # fmt: skip
        return _NO_FIELDS
    if tracestate is None:
        return {"traceparent": check_traceparent(traceparent)}
    return {"traceparent": check_traceparent(traceparent), "tracestate": check_tracestate(tracestate)}


class Segment:
    """The samples of one trace within a request at this node: all of it, or one request's share of a forward."""

    __slots__ = ("n", "incoming", "state", "trace_id", "parent_id", "flags", "span_id", "forward_id", "forwarded")

    def __init__(self, n: int, incoming: str, state: str = "") -> None:
        self.n, self.incoming = n, incoming  # incoming: the context it came with ("" for none)
        self.state = state  # the tracestate that came with it ("" for none): passed on and recorded unchanged
        self.trace_id = self.parent_id = self.span_id = self.forward_id = ""
        self.flags = "01"
        self.forwarded = 0  # samples of it sent to the parent


class Trace:
    """A request's trace state at this node (``Request.trace``): its segments and its times (monotonic)."""

    __slots__ = ("segments", "started", "batch", "computed", "sent", "back")

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.started: float | None = None  # its batch started (queue ends, compute starts)
        self.batch = 0
        self.computed: float | None = None  # the batch's stages ran
        self.sent: float | None = None  # its forward went to the parent
        self.back: float | None = None  # the parent's answer (or this node's fallback) came

    def counts(self, idx: np.ndarray | None) -> list[int]:
        """Samples of each segment among ``idx`` (the request's samples, ascending; None: all of them)."""
        if idx is None:
            return [s.n for s in self.segments]
        if len(self.segments) == 1:
            return [len(idx)]
        edges = np.cumsum([0] + [s.n for s in self.segments])
        return np.diff(np.searchsorted(idx, edges)).tolist()


class Sink(Protocol):
    def write(self, spans: list[tuple[SpanRecord, dict[str, Any]]]) -> None: ...

    def close(self) -> None: ...


class Tracer:
    """A node's spans: ids, the clock (monotonic times become Unix seconds) and the sinks they go to."""

    def __init__(self, node_id: str, sinks: Sequence[Sink], exit: int = 0) -> None:
        self.node_id, self.exit, self.sinks = node_id, exit, list(sinks)
        self._rng = random.Random(os.urandom(16))
        self._warned = -math.inf  # when spans_lost was last said (once a minute at most)
        self._sync(time.monotonic())

    def _sync(self, now: float) -> None:
        """Unix seconds = monotonic + offset; taken again each minute so that the wall clock's steps show. The
        tightest of a few readings: a process preempted between its two clock reads would skew every span."""
        readings = []
        for _ in range(5):
            m0, wall, m1 = time.monotonic(), time.time(), time.monotonic()
            readings.append((m1 - m0, wall - (m0 + m1) / 2))
        self.offset, self.synced = min(readings)[1], now

    def span_id(self) -> str:
        return f"{self._rng.getrandbits(64) or 1:016x}"

    def trace_id(self) -> str:
        return f"{self._rng.getrandbits(128) or 1:032x}"

    def open(self, seg: Segment) -> None:
        """Give a segment its trace (the incoming one, or a new trace whose root is this node) and its span id."""
        if seg.incoming:
            _, seg.trace_id, seg.parent_id, seg.flags = seg.incoming.split("-")
        else:
            seg.trace_id = self.trace_id()
        seg.span_id = self.span_id()

    def finish(self, req: Request, outcome: str, now: float) -> None:
        """The request is answered (``outcome``: "ok" or the error code): its spans go to the sinks."""
        tr = req.trace
        if now - self.synced > 60:
            self._sync(now)
        off, end = self.offset, now + self.offset
        t0 = req.t0 + off
        started = None if tr.started is None else tr.started + off
        computed = end if tr.computed is None else tr.computed + off
        back = end if tr.back is None else tr.back + off
        exits = _exits(req) if outcome == "ok" else None
        spans: list[tuple[SpanRecord, dict[str, Any]]] = []
        node, rid, stage, last, batch, new = self.node_id, req.req_id, req.stage, self.exit, tr.batch, self.span_id
        first = 0
        for seg in tr.segments:  # positional: the fields in SpanRecord's order
            tid, sid, n, st = seg.trace_id, seg.span_id, seg.n, seg.state
            flags = {"cis.flags": seg.flags}  # for OTLP: the context's sampled flag (the file does not keep it)
            attrs: dict[str, Any] = {"cis.outcome": outcome, **flags}
            if exits is not None and n:
                attrs["cis.exit"] = int(exits[first]) if n == 1 else int(exits[first : first + n].max())
            first += n
            spans.append((SpanRecord(tid, sid, seg.parent_id or None, node, "request", t0, end, rid, n, batch, stage,
                                     last, st), attrs))  # fmt: skip
            queued = end if started is None else started
            spans.append((SpanRecord(tid, new(), sid, node, "queue", t0, queued, rid, n, batch, stage, last, st),
                          flags))  # fmt: skip
            if started is not None:
                spans.append((SpanRecord(tid, new(), sid, node, "compute", started, computed, rid, n, batch, stage,
                                         last, st), flags))  # fmt: skip
            if tr.sent is not None and seg.forward_id:
                spans.append((SpanRecord(tid, seg.forward_id, sid, node, "forward", tr.sent + off, back, rid,
                                         seg.forwarded, batch, stage, last, st), flags))  # fmt: skip
        for sink in self.sinks:
            try:
                sink.write(spans)
            except Exception as exc:  # a full disk or a broken exporter must not stop the node
                if now - self._warned >= 60:
                    self._warned = now
                    event(log, logging.WARNING, "spans_lost", f"node {self.node_id}: spans not written: {exc} "
                          "(said once a minute at most)", node=self.node_id)  # fmt: skip

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _exits(req: Request) -> np.ndarray:
    """The exit of each of the request's samples (its answer may be the parent's frame as it came)."""
    ex = req.exit
    return ex if type(ex) is np.ndarray else np.frombuffer(ex, np.int32)


# ---------------------------------------------------------------- the hooks of the executor and the node


def admitted(tracer: Tracer | None, head: Any, n: int) -> Trace | str:
    """The trace state of a request being admitted (its header's ``traceparent`` and ``tracestate``, or
    ``trace_parts`` and ``trace_states``), or the reason it is a ``bad_message``. A context that is not a valid
    traceparent (a front door's header passed on as it came) starts a new trace, as W3C asks."""
    parts = head.trace_parts
    if head.tracestate and not head.traceparent:
        return "the header has tracestate without traceparent; expected it only beside a traceparent"
    if head.trace_states and not parts:
        return "the header has trace_states without trace_parts; expected them only beside trace_parts"
    if parts:
        if head.traceparent:
            return "the header has both traceparent and trace_parts; expected one of them"
        total = sum(c for c, _ in parts)
        if total != n:
            return f"trace_parts count {total} samples; the request has {n}"
        states = _states(head, parts)
        if type(states) is str:
            return states
        segments = [Segment(c, tp, st) for (c, tp), st in zip(parts, states)]
    else:
        tp = head.traceparent
        segments = [Segment(n, tp, head.tracestate) if is_traceparent(tp) else Segment(n, "")]
    if tracer is not None:
        for seg in segments:
            tracer.open(seg)
    return Trace(segments)


def _states(head: Any, parts: Sequence[tuple[int, str]]) -> Sequence[str] | str:
    """The tracestate of each ``trace_parts`` pair (its ``trace_states``; none: ""), or why they do not fit."""
    states = head.trace_states
    if not states:
        return [""] * len(parts)
    if len(states) != len(parts):
        return f"trace_states has {len(states)} entries, trace_parts {len(parts)} pairs; expected one entry per pair"
    for i, ((_, tp), st) in enumerate(zip(parts, states)):
        if st and not tp:
            return f'trace_states entry {i} is a tracestate for a pair without a traceparent; expected ""'
    return states


def started(batch: Sequence[Request], now: float, samples: int) -> None:
    for req in batch:
        tr = req.trace
        if tr is not None:
            tr.started, tr.batch = now, samples


def computed(order: Sequence[Request], now: float) -> None:
    for req in order:
        if req.trace is not None:
            req.trace.computed = now


def unsent(parts: Sequence[tuple[Request, Any]]) -> None:
    for req, _ in parts:
        if req.trace is not None:
            req.trace.sent = None


def returned(parts: Sequence[tuple[Request, Any]], now: float) -> None:
    for req, _ in parts:
        if req.trace is not None and req.trace.back is None:
            req.trace.back = now


def forward_fields(
    parts: Sequence[tuple[Request, np.ndarray | None]], tracer: Tracer | None, now: float
) -> dict[str, Any]:
    """The trace fields of a forward of ``parts`` (request, its samples; None: all) about to be sent at
    ``now``: ``traceparent`` (and ``tracestate``) when its samples are one trace, ``trace_parts`` (and
    ``trace_states`` when one of them has a tracestate) when they are several, none when no sample has a
    context. A tracing node names its own forward span as the parent (and starts it); another passes the
    context on as it came. Every node passes the tracestate on as it came."""
    out: list[list] = []
    states: list[str] = []  # parallel to out
    for req, idx in parts:
        tr = req.trace
        if tr is None:
            _add(out, states, req.n if idx is None else len(idx), "", "")
            continue
        tr.sent = now
        for seg, count in zip(tr.segments, tr.counts(idx)):
            if not count:
                continue
            seg.forwarded = count
            if tracer is not None:
                seg.forward_id = tracer.span_id()
                _add(out, states, count, traceparent(seg.trace_id, seg.forward_id, seg.flags), seg.state)
            else:
                _add(out, states, count, seg.incoming, seg.state)
    if len(out) == 1:
        tp, st = out[0][1], states[0]
        return ({"traceparent": tp, "tracestate": st} if st else {"traceparent": tp}) if tp else {}
    if len(out) > MAX_TRACE_PARTS:  # a batch of thousands of requests: its context stays here
        return {}
    return {"trace_parts": out, "trace_states": states} if any(states) else {"trace_parts": out}


def _add(out: list[list], states: list[str], count: int, tp: str, st: str) -> None:
    if out and not tp and not out[-1][1]:  # neighbours without a context are one entry (and have no tracestate)
        out[-1][0] += count
    else:
        out.append([count, tp])
        states.append(st)


def finish(tracer: Tracer | None, req: Request, outcome: str, now: float | None = None) -> None:
    if tracer is not None:
        tracer.finish(req, outcome, time.monotonic() if now is None else now)


# ---------------------------------------------------------------- sinks and the tracer of a node


class SpansFile:
    """Appends each span as one JSON line (:class:`SpanRecord`); a thread flushes it every FLUSH_SECONDS."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.file = open_spans_file(self.path)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._flush, name="cis-spans", daemon=True)
        self.thread.start()

    def write(self, spans: list[tuple[SpanRecord, dict[str, Any]]]) -> None:
        self.file.write(LINE_ENCODER.encode_lines([record for record, _ in spans]))

    def _flush(self) -> None:
        while not self.done.wait(FLUSH_SECONDS):
            try:
                self.file.flush()
            except (OSError, ValueError):  # a full disk (said at the next write), or closed meanwhile
                pass

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.file.close()


def open_spans_file(path: Path) -> Any:
    """``path`` opened to append (binary: a buffered writer is safe to flush from another thread), its folder
    made if missing; a one-line CisError if that cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "ab")
    except OSError as exc:
        raise CisError(f"--spans-file {path}: cannot open it ({exc.strerror or exc})") from None


def otlp_endpoint(flag: str | None, environ: Any = os.environ) -> str | None:
    """Where OTLP spans go: the flag's URL (a collector's base URL gets /v1/traces), else "" when an
    ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variable names one (the exporter reads it), else None (no
    export). ``OTEL_TRACES_EXPORTER=none`` turns the variables off; ``OTEL_SDK_DISABLED=true`` the SDK
    itself, so the flag too."""
    if flag and not flag.startswith(("http://", "https://")):
        raise CisError(f"--otlp-endpoint is {flag!r}; expected an http:// or https:// URL (OTLP over HTTP)")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if flag:
        return flag if flag.rstrip("/").endswith(OTLP_PATH) else flag.rstrip("/") + OTLP_PATH
    off = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
    return "" if not off and any(environ.get(k, "").strip() for k in ENV_ENDPOINTS) else None


def open_tracer(
    node_id: str, exit: int, spans_file: str | None, otlp: str | None, name: str | None = None
) -> Tracer | None:
    """The node's tracer, or None when it traces nothing (``spans_file``: ``{node}`` becomes ``name``, the
    replica's id (cloud#1) for a node with replicas, so that each writes its own file; else the node id;
    ``otlp``: the --otlp-endpoint flag). With the flag and no 'otel' extra: one line; with only the
    variables and no extra: a warning, and no export."""
    from cis.core.extras import EXTRAS, installed, require

    sinks: list[Sink] = []
    endpoint = otlp_endpoint(otlp)
    if endpoint is not None:
        if otlp:
            require("otel", "--otlp-endpoint")
        if all(map(installed, EXTRAS["otel"])):
            from cis.runtime.otel import OtlpSink

            sinks.append(OtlpSink(node_id, endpoint or None))
        else:
            event(log, logging.WARNING, "otel_missing", f"node {node_id}: an OTEL_EXPORTER_OTLP_*ENDPOINT is set "
                  "but the 'otel' extra is not installed (pip install 'cis-inference[otel]'): no spans exported",
                  node=node_id)  # fmt: skip
    if spans_file:
        sinks.append(SpansFile(spans_file.replace("{node}", name or node_id)))
    return Tracer(node_id, sinks, exit) if sinks else None
