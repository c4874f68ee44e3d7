"""A node's spans exported with OpenTelemetry (the 'otel' extra): OTLP over HTTP, batched.

:class:`OtlpSink` turns each finished span record of :mod:`cis.runtime.tracing` into a finished
OpenTelemetry span (the SDK's ``ReadableSpan``, what exporters read) with the same trace id, span
id and parent: the ids were chosen when the request was admitted, and the forward span's went
upward in its ``traceparent``, so the node's spans are recorded already and need no live SDK
span (a tracer's ``start_span`` costs several times as much, in the node's loop). A
``BatchSpanProcessor`` takes them and its thread exports them to the OTLP/HTTP endpoint; a span
whose context is not sampled (flags 00) is dropped there, as the SDK's default sampler would.
A span whose trace came with a ``tracestate`` has it as its context's trace state (as the SDK
parses it: one with a duplicate key exports none).
The exporter and the processor read the standard ``OTEL_*`` variables (headers, timeout,
compression, ``OTEL_BSP_*`` batching, ``OTEL_RESOURCE_ATTRIBUTES``); ``service.name`` is
``OTEL_SERVICE_NAME``, else ``cis-<node id>``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from cis.core.logs import event
from cis.core.version import __version__

if TYPE_CHECKING:
    from cis.runtime.spans import SpanRecord

log = logging.getLogger(__name__)
CLOSE_SECONDS = 5.0  # a stopping node waits this long for its last spans to go out, no longer
SPAN_KINDS = {"request": SpanKind.SERVER, "forward": SpanKind.CLIENT}  # queue, compute: INTERNAL
_OK = Status(StatusCode.UNSET)


class OtlpSink:
    def __init__(self, node_id: str, endpoint: str | None) -> None:
        """``endpoint``: the full URL of the traces endpoint, or None for the exporter's own (the variables)."""
        name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or f"cis-{node_id}"
        self.node_id = node_id
        self.resource = Resource.create({"service.name": name, "service.version": __version__, "cis.node": node_id})
        self.scope = InstrumentationScope("cis.runtime", __version__)
        self.processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))

    def write(self, spans: list[tuple[SpanRecord, dict[str, Any]]]) -> None:
        """Each record as a finished span with the node's ids, to the batch processor (which exports the sampled
        ones: the flags of the request's context)."""
        for r, extra in spans:
            trace_id, flags = int(r.trace_id, 16), TraceFlags(int(extra.get("cis.flags", "01"), 16))
            state = _trace_state(r.tracestate) if r.tracestate else None
            context = SpanContext(trace_id, int(r.span_id, 16), is_remote=False, trace_flags=flags, trace_state=state)
            parent = None
            if r.parent_id is not None:  # the request span's parent is the asker's span; the others' the request's
                parent = SpanContext(trace_id, int(r.parent_id, 16), is_remote=r.kind == "request", trace_flags=flags)
            attributes = {
                "cis.node": r.node,
                "cis.kind": r.kind,
                "cis.req_id": r.req_id,
                "cis.samples": r.samples,
                "cis.batch": r.batch,
                "cis.stage_from": r.stage_from,
                "cis.stage_to": r.stage_to,
                **{k: v for k, v in extra.items() if k != "cis.flags"},
            }
            outcome = extra.get("cis.outcome", "ok")
            self.processor.on_end(
                ReadableSpan(
                    r.kind,
                    context,
                    parent,
                    self.resource,
                    attributes,
                    kind=SPAN_KINDS.get(r.kind, SpanKind.INTERNAL),
                    status=_OK if outcome == "ok" else Status(StatusCode.ERROR, outcome),
                    start_time=_ns(r.start),
                    end_time=_ns(r.end),
                    instrumentation_scope=self.scope,
                )
            )

    def close(self) -> None:
        """Export what is still batched, for at most CLOSE_SECONDS (an unreachable collector does not hold up
        the node's stop: the exporter retries for OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default)."""
        closing = threading.Thread(target=self.processor.shutdown, name="cis-otel-close", daemon=True)
        closing.start()
        closing.join(CLOSE_SECONDS)
        if closing.is_alive():
            event(log, logging.WARNING, "spans_lost", f"node {self.node_id}: the OTLP endpoint did not take the "
                  f"last spans within {CLOSE_SECONDS:.0f} s", node=self.node_id)  # fmt: skip


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


@functools.lru_cache(maxsize=256)  # a request's four spans, and the requests of one caller, share one
def _trace_state(header: str) -> TraceState:
    return TraceState.from_header([header])
