"""A node's spans exported with OpenTelemetry (the 'otel' extra): OTLP over HTTP, batched.

:class:`OtlpSink` turns each finished span record of :mod:`cis.runtime.tracing` into an
OpenTelemetry span with the same trace id, span id and parent (the ids were chosen when the
request was admitted and sent upward in its ``traceparent``, so the SDK is handed them through
its id generator) and gives it to a ``BatchSpanProcessor``, whose thread exports to the OTLP/HTTP
endpoint. The SDK and the exporter read the standard ``OTEL_*`` variables (headers, timeout,
compression, ``OTEL_BSP_*`` batching, ``OTEL_TRACES_SAMPLER``, ``OTEL_RESOURCE_ATTRIBUTES``);
``service.name`` is ``OTEL_SERVICE_NAME``, else ``cis-<node id>``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from cis import __version__
from cis.logs import event

if TYPE_CHECKING:
    from cis.runtime.tracing import SpanRecord

log = logging.getLogger(__name__)
CLOSE_SECONDS = 5.0  # a stopping node waits this long for its last spans to go out, no longer
SPAN_KINDS = {"request": SpanKind.SERVER, "forward": SpanKind.CLIENT}  # queue, compute: INTERNAL


class _Given(IdGenerator):
    """Hands the SDK the ids the node already chose (the next span's)."""

    span = trace_id = 1

    def generate_span_id(self) -> int:
        return self.span

    def generate_trace_id(self) -> int:
        return self.trace_id


class OtlpSink:
    def __init__(self, node_id: str, endpoint: str | None) -> None:
        """``endpoint``: the full URL of the traces endpoint, or None for the exporter's own (the variables)."""
        name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or f"cis-{node_id}"
        resource = Resource.create({"service.name": name, "service.version": __version__, "cis.node": node_id})
        self.node_id = node_id
        self.ids = _Given()
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("cis.runtime", __version__)

    def write(self, spans: list[tuple[SpanRecord, dict[str, Any]]]) -> None:
        for r, extra in spans:
            parent = None if r.parent_id is None else int(r.parent_id, 16)
            flags = TraceFlags(int(extra.get("cis.flags", "01"), 16))
            trace_id = int(r.trace_id, 16)
            if parent is None:  # a new trace, rooted here
                context = Context()
            else:  # the request span's parent is the asker's span; the others' is the request span
                ctx = SpanContext(trace_id, parent, is_remote=r.kind == "request", trace_flags=flags)
                context = trace.set_span_in_context(NonRecordingSpan(ctx))
            self.ids.span, self.ids.trace_id = int(r.span_id, 16), trace_id
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
            span = self.tracer.start_span(
                r.kind, context, SPAN_KINDS.get(r.kind, SpanKind.INTERNAL), attributes, start_time=_ns(r.start)
            )
            outcome = extra.get("cis.outcome", "ok")
            if outcome != "ok":
                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end(end_time=_ns(r.end))

    def close(self) -> None:
        """Export what is still batched, for at most CLOSE_SECONDS (an unreachable collector does not hold up
        the node's stop: the exporter retries for OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default)."""
        closing = threading.Thread(target=self.provider.shutdown, name="cis-otel-close", daemon=True)
        closing.start()
        closing.join(CLOSE_SECONDS)
        if closing.is_alive():
            event(log, logging.WARNING, "spans_lost", f"node {self.node_id}: the OTLP endpoint did not take the "
                  f"last spans within {CLOSE_SECONDS:.0f} s", node=self.node_id)  # fmt: skip


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
