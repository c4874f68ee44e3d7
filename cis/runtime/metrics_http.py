"""Prometheus metrics and a health probe for one node: ``cis serve --metrics-port PORT``.

An HTTP server thread beside the node's poll loop (prometheus-client, part of
the core install) answers

- ``GET /metrics``: Prometheus text. Every value but the latency histogram is
  read from the node's own counters when Prometheus scrapes (a custom
  collector), so serving pays nothing for them; the latency histogram costs one
  :meth:`LatencyBuckets.observe` per result (a bisect and two additions, through
  the node's ``observe_latency`` hook);
- ``GET /healthz``: ``200 {"node": ID, "state": "serving"}`` while the node
  serves, ``503`` with the state otherwise: ``loading`` (the server is up, the
  node does not serve yet: stages loading, sockets not bound), ``stage_failed`` (the last stage run raised, so
  a request was answered ``internal``; until a stage run succeeds again),
  ``shutting_down`` (SIGTERM: draining) or ``stopped``.

The server starts before the node loads its stages, so an orchestrator sees
``loading`` rather than a refused connection. See docs/runtime.md, *Metrics and health*.
"""

from __future__ import annotations

import json
import socket
import threading
from bisect import bisect_left
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Any
from urllib.parse import urlsplit

from cis.errors import CisError

# seconds; from well under a millisecond (a hot CPU stage) to the forward timeouts of deep trees
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STATES = ("loading", "serving", "stage_failed", "shutting_down", "stopped")


def http_host(address: str) -> str:
    """The host a node's metrics server binds by default: the host of its ZeroMQ address.

    ``tcp://127.0.0.1:5555`` gives 127.0.0.1, ``tcp://*:5555`` 0.0.0.0 (every interface);
    ipc:// and inproc:// addresses give loopback."""
    if not address.startswith("tcp://"):
        return "127.0.0.1"
    host = address[len("tcp://") :].rpartition(":")[0].strip("[]")
    return "0.0.0.0" if host in ("*", "") else host


def metrics_url(host: str, port: int) -> str:
    """Where Prometheus scrapes a node whose metrics server binds ``host``."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}/metrics"


class LatencyBuckets:
    """Cumulative latency histogram counts, cheap to fill from the node's loop (no lock: one writer, and a
    scrape copies the list); prometheus-client's Histogram takes a lock and ~2.7 us per observation here."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is (max bound, +Inf)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """([(le, count <= le)], sum) as Prometheus writes a histogram."""
        from prometheus_client.utils import floatToGoString

        counts, total = list(self.counts), self.sum
        les = [*(floatToGoString(b) for b in self.bounds), "+Inf"]
        return list(zip(les, accumulate(counts))), total


class MetricsServer:
    """The HTTP server of one node; :meth:`attach` the node once it serves (Node.run's ``ready``)."""

    def __init__(self, node_id: str, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry

        self.node_id = node_id
        self.node: Any = None  # cis.runtime.node.Node once attached
        self.finished = False
        self.latency = LatencyBuckets(LATENCY_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(self))
        server_class = _V6Server if ":" in host else ThreadingHTTPServer
        try:
            self.httpd = server_class((host, port), _Handler)
        except OSError as exc:
            raise CisError(
                f"node {node_id!r}: cannot serve metrics on {host}:{port} ({exc.strerror or exc}); "
                "pick another --metrics-port (0: a free one) or --metrics-host"
            ) from None
        self.httpd.daemon_threads = True
        self.httpd.metrics = self  # type: ignore[attr-defined]
        self.host, self.port = host, int(self.httpd.server_address[1])
        self.url = metrics_url(host, self.port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="cis-metrics", daemon=True)
        self.thread.start()

    def attach(self, node: Any) -> None:
        """Start reporting ``node`` (a cis.runtime.node.Node): its counters, and a latency per result."""
        node.observe_latency = self.latency.observe
        self.node = node

    @property
    def state(self) -> str:
        node = self.node
        if self.finished:
            return "stopped"
        if node is None:
            return "loading"
        if node.stopping:
            return "shutting_down"
        if not node.executor.stage_ok:
            return "stage_failed"
        return "serving"

    def close(self) -> None:
        self.finished = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server_version = "cis-metrics"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics: MetricsServer = self.server.metrics  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._answer(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
        elif path == "/healthz":
            state = metrics.state
            body = json.dumps({"node": metrics.node_id, "state": state}).encode() + b"\n"
            self._answer(200 if state == "serving" else 503, "application/json", body)
        else:
            self._answer(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # a scrape every few seconds is not news


class _NodeCollector:
    """The node's counters as Prometheus families, read at scrape time (values are plain ints under the GIL)."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        server = self.server
        buckets, total = server.latency.cumulative()
        latency = HistogramMetricFamily(
            "cis_request_latency_seconds",
            "seconds from a request's arrival at the node to its result (queueing and the tiers above included)",
            buckets=buckets,
            sum_value=total,
        )
        healthy = gauge("cis_healthy", "1 when /healthz answers 200 (the node serves), else 0")
        healthy.add_metric([], 1.0 if server.state == "serving" else 0.0)
        requests = counter(
            "cis_requests", "requests (client INFERs and child FORWARDs) by outcome: ok (a result) or the error code",
            ("outcome",),
        )
        samples = counter("cis_samples", "samples answered at this node, by the exit that answered them", ("exit",))
        forwarded = counter("cis_forwarded", "samples sent to the parent (including those it did not answer in time)")
        failed = counter("cis_forward_failed", "forwarded samples the parent did not answer in time: served here")
        capped = counter("cis_capped", "samples the transfer cap kept here (flag capped)")
        degraded = counter("cis_degraded", "samples served here because the parent was down or late (flag degraded)")
        queue = gauge("cis_queue_depth", "samples admitted and waiting in the node's queue")
        limit = gauge("cis_queue_limit", "samples the queue admits; beyond, requests get 'overloaded'")
        parent_up = gauge("cis_parent_up", "1 while the parent answers heartbeats, else 0 (1 at the root)")
        threshold = gauge("cis_threshold", "the exit policy's threshold at this node (moves with --adapt)")
        restarts = gauge("cis_restarts", "how often the launcher restarted this node")
        info = gauge("cis_node_info", "the node's identity: 1", ("node", "exit", "parent", "provider", "backend"))
        families = [latency, healthy, requests, samples, forwarded, failed, capped, degraded, queue, limit, parent_up,
                    threshold, restarts, info]
        node = server.node
        if node is None:  # loading: the names are there, the values come with the node
            yield from families
            return
        cfg, ex, c = node.cfg, node.executor, node.counters
        requests.add_metric(["ok"], c.get("replies", 0))
        for code, count in dict.copy(node.errors_by_code).items():
            requests.add_metric([code], count)
        early = ex.served_early  # patience: samples answered before the node's own exit
        for e in range(1, cfg.exit):
            if early[e]:
                samples.add_metric([str(e)], int(early[e]))
        samples.add_metric([str(cfg.exit)], c.get("served", 0) - int(early.sum()))
        forwarded.add_metric([], c.get("forwarded", 0) + c.get("forward_failed", 0))
        failed.add_metric([], c.get("forward_failed", 0))
        capped.add_metric([], c.get("capped", 0))
        degraded.add_metric([], c.get("degraded", 0))
        queue.add_metric([], ex.queued)
        limit.add_metric([], cfg.queue_limit)
        parent_up.add_metric([], 1.0 if cfg.parent is None or node.parent_up else 0.0)
        threshold.add_metric([], ex.policy.thresholds[cfg.node_id])
        restarts.add_metric([], cfg.restarts)
        backend = cfg.backend
        provider = backend.provider if backend is not None else "custom"
        runs = backend.describe() if backend is not None else "custom stages"
        info.add_metric([cfg.node_id, str(cfg.exit), cfg.parent or "", provider, runs], 1.0)
        yield from families
