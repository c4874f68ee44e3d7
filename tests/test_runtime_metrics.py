"""A node's Prometheus metrics and health probe in-process (cis.runtime.metrics_http): the documented
/healthz states (loading, serving, stage_failed, shutting_down, stopped), and metric values that follow
the node's work. Real HTTP, real ZeroMQ, tiny numpy stages; the live cluster is in test_serve_tiers.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cis.runtime.client import Client, ServerError  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402
from cis.runtime.metrics_http import MetricsServer, http_host, metrics_url  # noqa: E402
from cis.runtime.node import Node, NodeConfig  # noqa: E402

T = namedtuple("T", "name shape dtype")
REQUIRED = (
    "cis_requests_total",
    "cis_request_latency_seconds",
    "cis_queue_depth",
    "cis_samples_total",
    "cis_forwarded_total",
    "cis_capped_total",
    "cis_degraded_total",
    "cis_parent_up",
)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a /metrics page, parsed by prometheus-client's own parser."""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def names(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return {line.split()[2] for line in r.read().decode().splitlines() if line.startswith("# TYPE")}


def health(metrics: str, path: str = "/healthz") -> tuple[int, dict]:
    """(status, JSON body) of a probe (/healthz, /readyz, /livez) beside a /metrics URL."""
    url = metrics.removesuffix("/metrics") + path
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@dataclass
class Stage:
    """Logits from the input's first two columns; raises on a sample whose first value is 999; optional delay."""

    inputs: tuple = (T("input", (None, 2), "float32"),)
    outputs: tuple = (T("logits", (None, 2), "float32"),)
    delay: float = 0.0

    def run(self, feeds):
        x = feeds["input"]
        if (x[:, 0] == 999).any():
            raise RuntimeError("poisoned sample")
        if self.delay:
            time.sleep(self.delay)
        return {"logits": x * 10}


class Served:
    """A root node with a metrics server, in a thread."""

    def __init__(self, delay: float = 0.0, attach: bool = True):
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.node = Node(NodeConfig("root", 1, bind=self.addr), {1: Stage(delay=delay)})
        self.metrics = MetricsServer("root", "127.0.0.1", 0)
        if attach:
            self.start()

    def start(self):
        self.metrics.attach(self.node)
        self.stop = threading.Event()
        ready = threading.Event()
        run = dict(install_signals=False, ready=ready.set, stop=self.stop.is_set)
        self.thread = threading.Thread(target=self.node.run, kwargs=run, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def close(self):
        if hasattr(self, "thread"):
            self.stop.set()
            self.thread.join(15)
        self.metrics.close()


@pytest.fixture
def served():
    made = []

    def make(**kw) -> Served:
        made.append(Served(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_loading_until_attached_then_serving_and_values_follow_requests(served):
    s = served(attach=False)
    assert s.metrics.url.endswith("/metrics") and s.metrics.port > 0
    assert health(s.metrics.url) == (503, {"node": "root", "state": "loading"})
    assert set(REQUIRED) <= names(s.metrics.url)  # the names are there before the values
    s.start()
    assert health(s.metrics.url) == (200, {"node": "root", "state": "serving"})
    with Client(s.addr, timeout=5) as c:
        for _ in range(3):
            c.infer(np.ones((4, 2), np.float32))
        with pytest.raises(ServerError) as err:
            c.infer(np.ones((2, 3), np.float32))  # wrong shape
        assert err.value.code == "bad_tensor"
    m = scrape(s.metrics.url)
    assert m[("cis_requests_total", (("kind", "infer"), ("outcome", "ok")))] == 3
    assert m[("cis_requests_total", (("kind", "infer"), ("outcome", "bad_tensor")))] == 1
    assert m[("cis_request_latency_seconds_count", ())] == 3
    assert m[("cis_request_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    assert m[("cis_request_latency_seconds_sum", ())] > 0
    assert m[("cis_samples_total", (("exit", "1"),))] == 12
    assert m[("cis_forwarded_total", ())] == 0 and m[("cis_degraded_total", ())] == 0
    assert m[("cis_queue_depth", ())] == 0 and m[("cis_queue_limit", ())] == 1024
    assert m[("cis_parent_up", ())] == 1  # the root has no parent to lose
    assert m[("cis_healthy", ())] == 1
    with pytest.raises(urllib.error.HTTPError) as other:
        urllib.request.urlopen(s.metrics.url.replace("/metrics", "/other"), timeout=5)
    assert other.value.code == 404


def test_a_stage_failure_is_503_until_a_stage_run_succeeds(served):
    s = served()
    with Client(s.addr, timeout=5) as c:
        with pytest.raises(ServerError) as err:
            c.infer(np.full((1, 2), 999, np.float32))
        assert err.value.code == "internal"
        assert health(s.metrics.url) == (503, {"node": "root", "state": "stage_failed"})
        assert scrape(s.metrics.url)[("cis_healthy", ())] == 0
        c.infer(np.ones((1, 2), np.float32))
    assert health(s.metrics.url)[0] == 200
    assert scrape(s.metrics.url)[("cis_requests_total", (("kind", "infer"), ("outcome", "internal")))] == 1


def test_shutting_down_is_503_while_the_node_drains_and_stopped_after(served):
    s = served(delay=1.0)
    with Client(s.addr, timeout=10) as c:
        rid = c.submit(np.ones((1, 2), np.float32))
        end = time.monotonic() + 10
        while s.node.counters["batches"] == 0 and time.monotonic() < end:
            time.sleep(0.01)  # until the slow stage runs (it holds the request read before the stop)
        s.node.request_stop()  # what SIGTERM does
        assert health(s.metrics.url) == (503, {"node": "root", "state": "shutting_down"})
        answers = []
        end = time.monotonic() + 10
        while not answers and time.monotonic() < end:
            answers = [res for got, res in c.poll(0.5) if got == rid]
        assert answers and answers[0].error is None  # the request in flight was finished, not dropped
    s.thread.join(10)
    s.metrics.close()
    assert s.metrics.state == "stopped"


def test_a_taken_port_is_one_line():
    s = MetricsServer("a", "127.0.0.1", 0)
    try:
        with pytest.raises(Exception) as err:
            MetricsServer("b", "127.0.0.1", s.port)
        assert "cannot serve metrics on 127.0.0.1:" in str(err.value) and "\n" not in str(err.value)
    finally:
        s.close()


def test_metrics_host_follows_the_node_address():
    assert http_host("tcp://127.0.0.1:5555") == "127.0.0.1"
    assert http_host("tcp://*:5555") == "0.0.0.0"
    assert http_host("tcp://10.0.0.7:5555") == "10.0.0.7"
    assert http_host("ipc:///tmp/node") == "127.0.0.1"
    assert metrics_url("0.0.0.0", 9100) == "http://127.0.0.1:9100/metrics"
    assert metrics_url("::1", 9100) == "http://[::1]:9100/metrics"


def test_livez_is_alive_while_loading_readyz_waits_for_the_stages(served):
    s = served(attach=False)
    assert health(s.metrics.url, "/livez") == (200, {"node": "root", "state": "loading"})  # loading is alive
    assert health(s.metrics.url, "/readyz") == (503, {"node": "root", "state": "loading"})
    s.start()
    assert health(s.metrics.url, "/livez") == (200, {"node": "root", "state": "serving"})
    assert health(s.metrics.url, "/readyz") == (200, {"node": "root", "state": "serving"})
    s.stop.set()
    s.thread.join(10)
    s.metrics.close()
    assert s.metrics.liveness == "stopped"


def test_livez_says_stalled_when_the_loop_stops_turning(served, monkeypatch):
    from cis.runtime import metrics_http

    monkeypatch.setattr(metrics_http, "STALL_SECONDS", 0.3)
    s = served(delay=1.5)
    with Client(s.addr, timeout=10) as c:
        rid = c.submit(np.ones((1, 2), np.float32))
        end = time.monotonic() + 1.4
        seen = []
        while time.monotonic() < end:  # the stage holds the loop for 1.5 s
            seen.append(health(s.metrics.url, "/livez"))
            time.sleep(0.05)
        assert (503, {"node": "root", "state": "stalled"}) in seen
        while not [r for got, r in c.poll(0.5) if got == rid]:
            pass
    end = time.monotonic() + 10  # the reply leaves from inside the batch: the loop turns (and says so) just after
    while health(s.metrics.url, "/livez")[0] != 200 and time.monotonic() < end:
        time.sleep(0.02)
    assert health(s.metrics.url, "/livez")[0] == 200  # turning again


def test_the_exposition_parses_and_holds_every_documented_family(served):
    s = served()
    s.node.cfg.bundle_sha256, s.node.cfg.restarts = "ab" * 32, 2
    with Client(s.addr, timeout=5) as c:
        c.infer(np.ones((4, 2), np.float32))
        c.infer_many(np.ones((6, 2), np.float32), batch_size=1, window=6)
    with urllib.request.urlopen(s.metrics.url, timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    types = {name: f.type for name, f in families.items()}
    assert types["cis_restarts"] == "counter" and types["cis_requests"] == "counter"
    for name in ("cis_request_latency_seconds", "cis_queue_time_seconds", "cis_compute_time_seconds", "cis_batch_size"):
        assert types[name] == "histogram", name
    assert types["process_resident_memory_bytes"] == "gauge" and "process_cpu_seconds" in types
    assert "process_open_fds" in types and "python_info" in types
    m = scrape(s.metrics.url)
    assert m[("cis_restarts_total", ())] == 2
    assert m[("process_resident_memory_bytes", ())] > 0
    assert m[("cis_queue_time_seconds_count", ())] == 7  # one per request run
    assert m[("cis_batch_size_sum", ())] == 10  # samples run
    assert m[("cis_batch_size_count", ())] == m[("cis_compute_time_seconds_count", ())] == s.node.counters["batches"]
    from cis import __version__

    assert m[("cis_build_info", (("bundle_sha256", "ab" * 32), ("node", "root"), ("parent", ""),
                                 ("version", __version__)))] == 1  # fmt: skip


def test_requests_are_counted_by_kind_so_a_forward_is_not_a_second_client_request():
    raddr, laddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"

    class Unsure(Stage):
        def run(self, feeds):
            return {"logits": np.zeros((len(feeds["input"]), 2), np.float32), "input": feeds["input"]}

    T2 = T("input", (None, 2), "float32")
    root = Node(NodeConfig("root", 2, bind=raddr), {1: Stage(), 2: Stage(inputs=(T2,))})
    leaf_stage = Unsure(outputs=(T("logits", (None, 2), "float32"), T2))
    leaf = Node(NodeConfig("leaf", 1, bind=laddr, parent=raddr, parent_id="root", threshold=0.9, heartbeat=0.05,
                           heartbeat_timeout=0.5), {1: leaf_stage})  # fmt: skip
    servers = {n: MetricsServer(n, "127.0.0.1", 0) for n in ("root", "leaf")}
    stop, threads = threading.Event(), []
    try:
        for node in (root, leaf):
            servers[node.cfg.node_id].attach(node)
            t = threading.Thread(target=node.run, kwargs=dict(install_signals=False, stop=stop.is_set), daemon=True)
            t.start()
            threads.append(t)
        end = time.monotonic() + 5
        while not leaf.parent_up and time.monotonic() < end:
            time.sleep(0.02)
        with Client(laddr, timeout=5) as c:
            assert c.infer(np.ones((3, 2), np.float32)).served_by == ["root"] * 3
        leaf_m, root_m = scrape(servers["leaf"].url), scrape(servers["root"].url)
        ok = {k: ("cis_requests_total", (("kind", k), ("outcome", "ok"))) for k in ("infer", "forward")}
        assert leaf_m[ok["infer"]] == 1 and ok["forward"] not in leaf_m
        assert root_m[ok["forward"]] == 1 and ok["infer"] not in root_m
        build = [k for k in leaf_m if k[0] == "cis_build_info"]
        assert dict(build[0][1])["parent"] == "root"  # the parent's node id, not its address
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for server in servers.values():
            server.close()
