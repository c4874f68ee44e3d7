"""Prometheus metrics and health probes for one node: ``cis serve --metrics-port PORT``.

An HTTP server thread beside the node's poll loop (prometheus-client, part of
the core install) answers

- ``GET /metrics``: Prometheus text. The node's counters are read when Prometheus
  scrapes (a custom collector), so serving pays nothing for them; the histograms
  cost one :meth:`Buckets.observe` (a bisect and two additions) per result
  (latency), per request run (queue time) and per micro-batch (compute time, batch
  size). The process's CPU, memory and open files come from prometheus-client's
  process, platform and GC collectors;
- ``GET /livez``: ``200`` while the node's loop is alive (also while its stages
  load, and while it drains); ``503`` when the loop has not turned for
  STALL_SECONDS (``stalled``) or has ended (``stopped``);
- ``GET /readyz`` and ``GET /healthz`` (the same answer): ``200 {"node": ID,
  "state": "serving"}`` while the node serves, ``503`` with the state otherwise:
  ``loading`` (the server is up, the node does not serve yet: stages loading,
  sockets not bound), ``stage_failed`` (the last stage run raised, so a request was
  answered ``internal``; until a stage run succeeds again), ``shutting_down``
  (SIGTERM: draining) or ``stopped``.

The server starts before the node loads its stages, so an orchestrator sees
``loading`` rather than a refused connection. See docs/runtime.md, *Metrics and health*.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Any
from urllib.parse import urlsplit

from cis.core.errors import CisError
from cis.core.version import __version__
from cis.runtime.requests import Request

# seconds; from well under a millisecond (a hot CPU stage) to the forward timeouts of deep trees
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TIME_BUCKETS = (0.0001, 0.00025, *LATENCY_BUCKETS)  # queue and compute time: a hot hop waits tens of microseconds
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # samples per micro-batch
STATES = ("loading", "serving", "stage_failed", "shutting_down", "stopped")
STALL_SECONDS = 30.0  # /livez: the loop has not turned for this long (a stage stuck, a deadlock)
PATHS = ("/metrics", "/livez", "/readyz", "/healthz")


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
    from cis.runtime.oip.door import url

    return url("http", host, port) + "/metrics"


class Buckets:
    """Cumulative histogram counts, cheap to fill from the node's loop (no lock: one writer, and a
    scrape copies the list); prometheus-client's Histogram takes a lock and ~2.7 us per observation here."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
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


class BatchTimings:
    """What the executor reports per micro-batch (its ``timings`` hook): each request's queue time, the batch's
    size, and its compute time (stages and exit decision, until its answers and forward are sent)."""

    __slots__ = ("queue", "compute", "batch", "last")

    def __init__(self) -> None:
        self.queue, self.compute, self.batch = Buckets(TIME_BUCKETS), Buckets(TIME_BUCKETS), Buckets(BATCH_BUCKETS)
        self.last = 0.0  # wall-clock time the last micro-batch started (0: none yet)

    def started(self, now: float, requests: list[Request], samples: int) -> None:
        observe = self.queue.observe
        for req in requests:
            observe(now - req.t0)
        self.batch.observe(samples)
        self.last = time.time()


def node_timings(node: Any) -> tuple[Buckets, BatchTimings]:
    """A node's latency histogram (fed by its ``observe_latency``) and its executor's batch timings, installed
    once: the metrics server and the front doors' statistics (cis.runtime.oip.triton) read the same ones."""
    latency = getattr(node.observe_latency, "__self__", None)
    if not isinstance(latency, Buckets):
        latency = Buckets(LATENCY_BUCKETS)
        node.observe_latency = latency.observe
    if node.executor.timings is None:
        node.executor.timings = BatchTimings()
    return latency, node.executor.timings


class MetricsServer:
    """The HTTP server of one node; :meth:`attach` the node once it serves (Node.run's ``ready``)."""

    def __init__(self, node_id: str, host: str, port: int) -> None:
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
        from prometheus_client.registry import CollectorRegistry

        self.node_id = node_id
        self.node: Any = None  # cis.runtime.node.Node once attached
        self.finished = False
        self.latency = Buckets(LATENCY_BUCKETS)
        self.timings = BatchTimings()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(self))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)
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
        """Start reporting ``node`` (a cis.runtime.node.Node): its counters, a latency per result, the
        executor's batch timings; the node logs this server's URL in its start line."""
        self.latency, self.timings = node_timings(node)
        node.metrics_url = self.url
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

    @property
    def liveness(self) -> str:
        """The state, or ``stalled`` when the loop has not turned for STALL_SECONDS; /livez is 200 unless
        this is ``stalled`` or ``stopped``."""
        node, state = self.node, self.state
        if state != "stopped" and node is not None and time.monotonic() - node.alive_at > STALL_SECONDS:
            return "stalled"
        return state

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
        elif path in ("/readyz", "/healthz"):
            state = metrics.state
            self._state(200 if state == "serving" else 503, state)
        elif path == "/livez":
            state = metrics.liveness
            self._state(503 if state in ("stalled", "stopped") else 200, state)
        else:
            self._answer(404, "text/plain; charset=utf-8", f"not found: try {', '.join(PATHS)}\n".encode())

    def _state(self, code: int, state: str) -> None:
        metrics: MetricsServer = self.server.metrics  # type: ignore[attr-defined]
        self._answer(code, "application/json", json.dumps({"node": metrics.node_id, "state": state}).encode() + b"\n")

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

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        def histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
            counts, total = buckets.cumulative()
            return HistogramMetricFamily(name, doc, buckets=counts, sum_value=total)

        server = self.server
        timings = server.timings
        yield histogram(
            "cis_request_latency_seconds",
            "seconds from a request's arrival at the node to its result (queueing and the tiers above included)",
            server.latency,
        )
        yield histogram(
            "cis_queue_time_seconds",
            "seconds a request waited in the node's queue before its micro-batch ran",
            timings.queue,
        )
        yield histogram(
            "cis_compute_time_seconds",
            "seconds a micro-batch took: its stages and the exit decision, until its answers and forward were sent",
            timings.compute,
        )
        yield histogram("cis_batch_size", "samples per micro-batch", timings.batch)
        healthy = GaugeMetricFamily("cis_healthy", "1 when /readyz (and /healthz) answer 200, else 0")
        healthy.add_metric([], 1.0 if server.state == "serving" else 0.0)
        yield healthy
        families = self._node_families(CounterMetricFamily, GaugeMetricFamily)
        yield from families.values()
        yield from _door_families(server.node, CounterMetricFamily, GaugeMetricFamily)
        yield from _parent_replicas(GaugeMetricFamily, self.server.node)
        duplicates = CounterMetricFamily("cis_duplicates", "requests whose id this node held or had answered (a "
                                         "client's retry): answered once, not run again")
        duplicates.add_metric([], (self.server.node.counters if self.server.node else {}).get("duplicates", 0))
        yield duplicates

    def _node_families(self, counter: Any, gauge: Any) -> dict[str, Any]:
        """The families of the node's own counters: named before the node is attached, filled after."""
        f = _families(counter, gauge)
        node = self.server.node
        if node is None:  # loading: the names are there, the values come with the node
            return f
        cfg, ex, c = node.cfg, node.executor, node.counters
        for (kind, outcome), count in dict.copy(node.outcomes).items():
            f["requests"].add_metric([kind, outcome], count)
        early = ex.served_early  # samples the policy answered before the node's own exit (patience)
        for e in range(1, cfg.exit):
            if early[e]:
                f["samples"].add_metric([str(e)], int(early[e]))
        f["samples"].add_metric([str(cfg.exit)], c.get("served", 0) - int(early.sum()))
        f["forwarded"].add_metric([], c.get("forwarded", 0) + c.get("forward_failed", 0))
        f["failed"].add_metric([], c.get("forward_failed", 0))
        f["capped"].add_metric([], c.get("capped", 0))
        f["degraded"].add_metric([], c.get("degraded", 0))
        f["mismatch"].add_metric(["refused"], c.get("bundle_mismatch", 0))
        f["mismatch"].add_metric(["parent"], c.get("bundle_mismatch_parent", 0))
        f["restarts"].add_metric([], cfg.restarts)
        f["queue"].add_metric([], ex.queued)
        f["limit"].add_metric([], cfg.queue_limit)
        f["parent_up"].add_metric([], 1.0 if cfg.parent is None or node.parent_up else 0.0)
        f["threshold"].add_metric([], ex.policy.thresholds[cfg.node_id])
        backend = cfg.backend
        provider = backend.provider if backend is not None else "custom"
        runs = backend.describe() if backend is not None else "custom stages"
        f["info"].add_metric([cfg.node_id, str(cfg.exit), cfg.parent or "", provider, runs, cfg.name], 1.0)
        f["build"].add_metric([cfg.node_id, __version__, cfg.bundle_sha256, cfg.parent_id or ""], 1.0)
        for held in ex.versions.describe():
            f["bundles"].add_metric([held["id"], held["state"]], 1.0)
        return f


def _door_families(node: Any, counter: Any, gauge: Any) -> Iterator[Any]:
    """The front doors' limits at work (docs/runtime.md, *Limits of the front door*)."""
    conns = gauge("cis_door_connections", "open HTTP connections, or gRPC calls in progress, per front door",
                  labels=("door",))  # fmt: skip
    held = gauge("cis_door_buffered_bytes", "bytes the front doors hold of requests not yet handed to the node "
                 "(gRPC: not yet answered); at most --door-max-buffered-bytes")  # fmt: skip
    refused = counter(
        "cis_door_refused",
        "requests or connections a front door's limit refused or closed, by door and reason (the limit, or "
        "'token' for a request refused before its body for a missing or wrong bearer token)",
        labels=("door", "reason"),
    )
    doors = getattr(node, "doors", None) or []
    for door in doors:
        conns.add_metric([door.kind], door.connections)
        for reason, count in dict(door.refused).items():
            refused.add_metric([door.kind, reason], count)
    held.add_metric([], doors[0].budget.held if doors else 0)
    yield from (conns, held, refused)


def _families(counter: Any, gauge: Any) -> dict[str, Any]:
    """The node's metric families by key, empty (:meth:`_NodeCollector._node_families` fills them)."""
    return {
        "requests": counter(
            "cis_requests",
            "requests by kind (infer: from clients, forward: from children, other: status, ping "
            "or unreadable) and outcome: ok (a result) or the error code",
            labels=("kind", "outcome"),
        ),
        "samples": counter(
            "cis_samples", "samples answered at this node, by the exit that answered them", labels=("exit",)
        ),
        "forwarded": counter("cis_forwarded", "samples sent to the parent (including those it did not answer)"),
        "failed": counter("cis_forward_failed", "forwarded samples the parent did not answer in time: served here"),
        "capped": counter("cis_capped", "samples the transfer cap kept here (flag capped)"),
        "degraded": counter("cis_degraded", "samples served here because the parent was down or late (flag 1)"),
        "mismatch": counter(
            "cis_bundle_mismatch",
            "carries of a bundle not held: refused (requests this node answered bundle_mismatch) or parent "
            "(forwards of this node its parent refused or answered with another bundle; served here, degraded)",
            labels=("side",),
        ),
        "restarts": counter("cis_restarts", "how often the launcher restarted this node (cis serve --all)"),
        "queue": gauge("cis_queue_depth", "samples admitted and waiting in the node's queue"),
        "limit": gauge("cis_queue_limit", "samples the queue admits; beyond, requests get 'overloaded'"),
        "parent_up": gauge("cis_parent_up", "1 while the parent answers heartbeats, else 0 (1 at the root)"),
        "threshold": gauge("cis_threshold", "the exit policy's threshold at this node (moves with --adapt)"),
        "info": gauge(
            "cis_node_info", "the node's identity: 1; replica: its replica id (cloud#1), else the node id",
            labels=("node", "exit", "parent", "provider", "backend", "replica"),
        ),
        "build": gauge(
            "cis_build_info",
            "what the node runs: 1; cis version, the bundle's sha256 (of manifest.json), the "
            "parent's node id ('' at the root)",
            labels=("node", "version", "bundle_sha256", "parent"),
        ),
        "bundles": gauge(
            "cis_bundle_info",
            "1 per bundle the node holds (bundle: its id); state: current (new requests go to it), held, retiring",
            labels=("bundle", "state"),
        ),
    }


def _parent_replicas(gauge: Any, node: Any) -> Iterator[Any]:
    """Per replica of the parent (docs/runtime.md, *Replicas*): up or not, and the forwarded samples in flight."""
    up = gauge("cis_parent_replica_up", "per replica of the parent: 1 while it answers heartbeats, else 0",
               labels=("replica", "address"))
    in_flight = gauge("cis_parent_replica_in_flight", "per replica of the parent: forwarded samples it has not "
                      "answered yet", labels=("replica", "address"))
    for r in node.upstream.status(time.monotonic()) if node is not None else ():
        up.add_metric([r["replica"], r["address"]], 1.0 if r["up"] else 0.0)
        in_flight.add_metric([r["replica"], r["address"]], r["in_flight"])
    yield up
    yield in_flight
