"""A tiny OTLP/HTTP receiver for tests: collects the spans that exporters POST to /v1/traces (protobuf)."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpReceiver:
    """``url`` is the base URL to give --otlp-endpoint; ``spans`` the decoded spans, each a dict with
    service, name, trace_id, span_id, parent_id (hex; None for a root), kind, start, end (ns), attributes, status,
    trace_state (the W3C tracestate; "" for none)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and receiver.take(body)
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def take(self, body: bytes) -> bool:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception:
            return False
        got = []
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), None)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    got.append({
                        "service": service, "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex() or None, "kind": s.kind, "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano, "attributes": attrs, "status": s.status.code,
                        "trace_state": s.trace_state,
                    })  # fmt: skip
        with self.lock:
            self.spans += got
        return True

    def wait(self, until, timeout: float = 20.0) -> list[dict]:
        """The spans once ``until(spans)`` holds (or the timeout passed)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                spans = list(self.spans)
            if until(spans):
                return spans
            time.sleep(0.05)
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _value(v):
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
