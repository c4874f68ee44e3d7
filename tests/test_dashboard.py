"""docs/grafana-cis.json against the node's exposition: a datasource variable that file provisioning fills, a
__requires block, every query filtered by $job (the info joins too), a panel for each operator metric, and no
query naming a metric that a node does not export."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cis.runtime.client import Client  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402
from cis.runtime.metrics_http import MetricsServer  # noqa: E402
from cis.runtime.node import Node, NodeConfig  # noqa: E402

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-cis.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
METRIC = re.compile(r"\b((?:cis|process)_[a-z_]+)\b(\{[^}]*\})?")
NEW = ("cis_restarts_total", "process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
       "cis_queue_time_seconds_bucket", "cis_compute_time_seconds_bucket", "cis_batch_size_sum", "cis_build_info")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_the_datasource_is_a_variable_and_requires_are_declared(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert variables["job"]["datasource"] == DS and "cis_build_info" in variables["job"]["definition"]
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    assert {("panel", p["type"]) for p in dashboard["panels"]} <= required
    for p in dashboard["panels"]:
        assert p["datasource"] == DS and all(t["datasource"] == DS for t in p["targets"]), p["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)


def test_every_selector_is_filtered_by_job_the_info_joins_too(dashboard):
    for expr in exprs(dashboard):
        for name, labels in METRIC.findall(expr):
            assert labels and 'job=~"$job"' in labels, (name, expr)
        if "group_left" in expr:
            assert "on (job, instance) group_left (node) cis_node_info{" in expr, expr


def test_each_operator_metric_has_a_panel_and_requests_count_clients_once(dashboard):
    named = {name for e in exprs(dashboard) for name, _ in METRIC.findall(e)}
    assert set(NEW) <= named
    first = dashboard["panels"][0]["targets"][0]["expr"]
    assert 'kind="infer"' in first and "cis_requests_total" in first
    assert any("sum by (kind)" in e for e in exprs(dashboard))


def test_no_query_names_a_metric_that_a_node_does_not_export(dashboard):
    addr = f"tcp://127.0.0.1:{free_port()}"

    class Stage:
        inputs = (type("T", (), {"name": "input", "shape": (None, 2), "dtype": "float32"})(),)
        outputs = (type("T", (), {"name": "logits", "shape": (None, 2), "dtype": "float32"})(),)

        def run(self, feeds):
            return {"logits": feeds["input"]}

    node = Node(NodeConfig("root", 1, bind=addr), {1: Stage()})
    metrics = MetricsServer("root", "127.0.0.1", 0)
    metrics.attach(node)
    stop = threading.Event()
    thread = threading.Thread(target=node.run, kwargs=dict(install_signals=False, stop=stop.is_set), daemon=True)
    thread.start()
    try:
        with Client(addr, timeout=5) as c:
            c.infer(np.ones((2, 2), np.float32))
        with urllib.request.urlopen(metrics.url, timeout=5) as r:
            exported = {s.name for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
    finally:
        stop.set()
        thread.join(10)
        metrics.close()
    named = {name for e in exprs(dashboard) for name, _ in METRIC.findall(e)}
    assert named <= exported, named - exported
