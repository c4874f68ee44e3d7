"""An operator's view of real ``cis serve`` processes (issue 24): JSON and text log lines (a node's start,
its parent down after the parent is killed, the launcher's restart), the probes and the operator metrics on
every node, ``--config`` and CIS_* variables taking effect, ``stage`` nil refused and an input that
overflows inside the network refused or flagged. A two-node spec (device0 under cloud) of the digits
demo bundle keeps it short."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("prometheus_client")

from cli_process import read_until, start, started_nodes, stop  # noqa: E402
from test_runtime_metrics import health, scrape  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.spec import write_spec  # noqa: E402
from cis.runtime import protocol as P  # noqa: E402
from cis.runtime.client import Client, ServerError  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402

OVERFLOW = 3.4e38  # finite float32; the network's sums overflow
OPERATOR_METRICS = (
    "cis_restarts_total",
    "process_resident_memory_bytes",
    "cis_build_info",
    "cis_queue_time_seconds_count",
    "cis_compute_time_seconds_count",
    "cis_batch_size_count",
)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("ops"), steps=60)


@pytest.fixture(scope="module")
def two(bundle_dir) -> Path:
    """cloud (exit 3) and device0 (exit 1) under it."""
    spec = load_bundle(bundle_dir).spec
    nodes = {n.id: n for n in spec.nodes}
    path = bundle_dir.parent / "two.toml"
    write_spec(spec.replace_nodes([nodes["cloud"], dataclasses.replace(nodes["device0"], parent="cloud")]), path)
    return path


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def wait_event(path: Path, name: str, count: int = 1, timeout: float = 20) -> list[dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = [x for x in json_lines(path) if x.get("event") == name] if path.exists() else []
        if len(got) >= count:
            return got
        time.sleep(0.1)
    said = "".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(path.parent.glob("*.log")))
    raise AssertionError(f"no {count} {name!r} in {path}; the logs end: {said}")


def test_a_cluster_logs_json_per_node_and_every_node_has_the_operator_metrics(bundle_dir, two, tmp_path, digits):
    logs = tmp_path / "logs"
    proc = start(
        "--log-format", "json", "serve", bundle_dir, "--all", "--spec", two, "--free-ports", "--metrics-port", 0,
        "--json", "--log-dir", logs, "--heartbeat", "0.1", "--forward-timeout", "0.5", "--threshold", "inf",
        "--no-cap",
    )  # fmt: skip
    try:
        nodes = started_nodes(proc)
        urls = {nid: n["metrics"] for nid, n in nodes.items()}
        (start_line,) = wait_event(logs / "device0.log", "node_start")
        assert start_line["level"] == "INFO" and start_line["node"] == "device0" and start_line["parent"] == "cloud"
        assert start_line["address"] == nodes["device0"]["address"] and start_line["provider"] == "cpu"
        assert start_line["bundle_sha256"] == load_bundle(bundle_dir).sha256 and start_line["bundle"] == str(bundle_dir)
        with Client(nodes["device0"]["address"], timeout=20) as c:
            assert c.infer(digits[:5]).exit.tolist() == [3] * 5
            with pytest.raises(ServerError) as err:  # finite, but it overflows inside the network
                c.infer(np.full((2, 1, 8, 8), OVERFLOW, np.float32))
            assert err.value.code == "bad_input" and "overflow" in err.value.message
        for nid, url in urls.items():
            m = scrape(url)
            assert {k[0] for k in m} >= set(OPERATOR_METRICS), nid
            assert health(url, "/livez")[0] == health(url, "/readyz")[0] == 200
        cloud = scrape(urls["cloud"])
        assert cloud[("cis_requests_total", (("kind", "forward"), ("outcome", "ok")))] == 1  # the overflow never came
        build = [dict(k[1]) for k in scrape(urls["device0"]) if k[0] == "cis_build_info"]
        assert build[0]["parent"] == "cloud" and build[0]["bundle_sha256"] == start_line["bundle_sha256"]

        os.kill(nodes["cloud"]["pid"], signal.SIGKILL)  # the parent dies; the launcher starts it again
        (down,) = wait_event(logs / "device0.log", "parent_down")
        assert down["level"] == "WARNING" and down["node"] == "device0" and down["parent"] == "cloud"
        (exited,) = wait_event(logs / "cloud.log", "node_exit")
        (restarted,) = wait_event(logs / "cloud.log", "node_restart")
        assert exited["status"] == -signal.SIGKILL and restarted["restart"] == 1
        assert wait_event(logs / "device0.log", "parent_up", 2)[1]["node"] == "device0"
        end = time.monotonic() + 20
        while health(urls["cloud"], "/readyz")[0] != 200 and time.monotonic() < end:
            time.sleep(0.1)
        assert scrape(urls["cloud"])[("cis_restarts_total", ())] == 1  # the restarted node keeps its port
    finally:
        code = stop(proc)
    assert code == 0
    assert wait_event(logs / "device0.log", "node_stop")[0]["node"] == "device0"


def test_config_file_and_variables_take_effect_and_text_lines_say_so(bundle_dir, tmp_path):
    port, metrics = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    conf = tmp_path / "serve.toml"
    conf.write_text(f'node = "cloud"\nbind = "{address}"\nqueue_limit = 7\nnonfinite = "flag"\nmetrics_port = 1\n')
    env = {**os.environ, "CIS_METRICS_PORT": str(metrics), "CIS_CONFIG": str(conf), "CIS_LOG_FORMAT": "text"}
    proc = start("serve", bundle_dir, env=env)  # the variable's metrics port beats the file's
    try:
        line = read_until(proc.stderr, proc, "node_start")[-1]
        assert " INFO cis.runtime.node node_start: node cloud (exit 3) at " + address + " (root)" in line
        assert line.rstrip().endswith(f"metrics http://127.0.0.1:{metrics}/metrics")
        assert f"; bundle {load_bundle(bundle_dir).id} (" in line
        url = f"http://127.0.0.1:{metrics}/metrics"
        assert health(url, "/readyz") == (200, {"node": "cloud", "state": "serving"})
        assert scrape(url)[("cis_queue_limit", ())] == 7
        with Client(address, timeout=20) as c:
            r = c.infer(np.full((1, 1, 8, 8), OVERFLOW, np.float32))  # nonfinite = "flag": answered, flagged
            assert r.cls.tolist() == [-1] and r.flags.tolist() == [P.FLAG_NONFINITE] and np.isnan(r.confidence[0])
            assert c.status()["queue_limit"] == 7
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.linger = 0
        s.connect(address)
        header = {"v": 1, "kind": "infer", "id": 9, "stage": None, "names": ["input"], "dtypes": ["float32"],
                  "shapes": [[1, 1, 8, 8]]}  # fmt: skip
        s.send_multipart([msgpack.packb(header), np.zeros((1, 1, 8, 8), np.float32).tobytes()])
        assert s.poll(10000)
        reply = P.decode(s.recv_multipart())
        s.close()
        assert reply.kind == P.ERROR and reply.header["code"] == "bad_stage" and reply.id == 9
    finally:
        assert stop(proc) == 0
    rest = proc.stderr.read()
    assert " INFO cis.runtime.node node_stop: node cloud stopped after " in rest


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test.x[:10]


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_nodes_die_with_a_launcher_killed_by_sigkill(bundle_dir, two):
    """No orphans: the nodes ask for SIGTERM on their launcher's death themselves (no preexec_fn fork)."""
    proc = start("serve", bundle_dir, "--all", "--spec", two, "--free-ports", "--json")
    try:
        pids = [n["pid"] for n in started_nodes(proc).values()]
        assert all(str(proc.pid) == open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] for p in pids)
    finally:
        proc.kill()
        proc.wait(10)
    end = time.monotonic() + 20
    while not all(_gone(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


def test_a_node_started_with_a_dead_launchers_pid_exits_at_once(bundle_dir, two):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    proc = start(
        "serve",
        bundle_dir,
        "--spec",
        two,
        "--node",
        "cloud",
        "--bind",
        f"tcp://127.0.0.1:{free_port()}",
        env={**os.environ, "CIS_LAUNCHER_PID": str(dead.pid)},
    )
    assert proc.wait(30) == -signal.SIGTERM
