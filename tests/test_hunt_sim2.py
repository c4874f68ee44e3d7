"""The simulator/bench hunt's items 9-14 (docs/simulator.md, docs/runtime.md "Load: cis bench"): flags that
would be ignored or overridden are refused in one line, the latency profile's file is checked by name, a
single-request load has no rate, and every load address is asked before the first send."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.topologies import make_spec
from cis.runtime.loadgen import LoadResult, run_load
from cis.runtime.ports import free_port
from cis.sim.config import SimConfig, check_config

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _profile(tmp_path, **extra) -> Path:
    path = tmp_path / "latency.json"
    path.write_text(json.dumps({"stages": {"1": {"1": 0.001}, "2": {"1": 0.002}, "3": {"1": 0.003}}, **extra}))
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mmpp-ratio", "2"], "simulate: --mmpp-ratio shapes mmpp arrivals; expected --arrivals mmpp with it"),
        (["--mmpp-dwell", "3"], "simulate: --mmpp-dwell shapes mmpp arrivals; expected --arrivals mmpp with it"),
        (["--spans", "--sweep", "arrival_rate=1,2"], "simulate: --spans records one run; expected no --sweep"),
    ],
)
def test_simulate_refuses_flags_it_would_ignore(run_cli, paper7, extra, message):
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, *extra)
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1, res.err


def test_mmpp_flags_still_shape_mmpp_arrivals(run_cli, paper7):
    res = run_cli("simulate", "--spec", paper7, "--requests", 50, "--arrivals", "mmpp", "--mmpp-ratio", "2", "--json")
    assert res.code == 0, res.err


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"service_mean": 0.01}, "--service-mean applies without a bundle"),
        ({"payload_bytes": 100}, "--payload-bytes applies without a bundle"),
        ({"calibrate": True, "threshold": 0.5}, "--calibrate and --threshold both set the thresholds"),
    ],
)
def test_a_bundle_run_refuses_what_the_bundle_or_calibration_overrides(fields, message):
    spec = make_spec("paper-7", "60-30-10")
    with pytest.raises(CisError, match=message):
        check_config(SimConfig(requests=10, **fields), spec, with_bundle=True)
    if "calibrate" not in fields:  # without a bundle they are the run's
        check_config(SimConfig(requests=10, **fields), spec, with_bundle=False)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"batch_overhead": {"cloud": True}}, "true is not a number"),
        ({"interference": False}, "false is not a number"),
        ({"stages": {"1": {"1": True}, "2": {"1": 0.002}, "3": {"1": 0.003}}}, "true is not a number"),
        ({"stages": {"1": {"1": 0.001}, "2": {"1": 0.002}, "3": {"1": 0.003}, "4": {"1": 0.004}}},
         "\"stages\" has stage 4; expected stages 1..3 (spec 'paper-7' has 3 exits)"),
        ({"batch_overhead": {"nope": 0.001}}, "batch_overhead nope=0.001: no node 'nope' in spec 'paper-7'"),
    ],
)
def test_a_latency_profile_file_is_checked_and_named(run_cli, paper7, tmp_path, extra, message):
    profile = _profile(tmp_path, **extra)
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, "--latency-profile", profile)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert f"--latency-profile {profile}" in res.err and message in res.err and "--batch-overhead" not in res.err


def test_the_docs_say_what_the_simulator_does():
    text = " ".join((DOCS / "simulator.md").read_text().split())
    assert "rounds of `--jobs` loads (at least 2, so `--jobs 1` runs 2 a round)" in text
    assert "A node's utilisation is its work / (workers x replicas x makespan)" in text
    assert "and the wait is not counted" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--binary"], "--binary: HTTP inputs as raw bytes; expected --transport http with it, not zmq"),
        (["--transport", "grpc", "--binary"], "expected --transport http with it, not grpc"),
        (["--model-name", "m"], "--model-name: the Open Inference Protocol's model; expected --transport http or grpc"),
        (["--server-key", "k.key"], "--server-key: the node's public key for CurveZMQ; expected --curve-key"),
        (["--transport", "http", "--curve-key", "k.key_secret"], "--curve-key: CurveZMQ; expected --transport zmq"),
    ],
)
def test_bench_refuses_flags_its_transport_would_ignore(run_cli, extra, message):
    res = run_cli("bench", f"tcp://127.0.0.1:{free_port()}", "--rate", "5", "--requests", "1", *extra)
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1, res.err


def test_one_request_has_no_rate_and_the_text_says_so():
    from cis.cli.commands.bench import human

    result = LoadResult("zmq", "poisson", 5.0, ["a"], ["a"], np.array([0.0]), np.array([4e-6]), np.array([0.002]),
                        [None], [None], 0.003)  # fmt: skip
    s = result.summary()
    assert s["sent_rate"] is None and s["held_rate"] is None and s["duration_s"] == 0.0
    assert "sent 1 request (no rate over a single send)" in human(s)


class _Door(BaseHTTPRequestHandler):
    """A model's HTTP metadata (the Open Inference Protocol); every inference is counted and refused."""

    posts = 0

    def do_GET(self):  # noqa: N802
        body = json.dumps({"name": "cis", "inputs": [{"name": "x", "shape": [-1, 4], "datatype": "FP32"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_dead_second_address_stops_the_load_before_its_first_send():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Door)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    live, dead = f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{free_port()}"
    try:
        with pytest.raises(CisError, match=f"^{dead}: no model metadata"):
            run_load([live, dead], 50.0, transport="http", requests=4, timeout=2.0)
        assert _Door.posts == 0
        result = run_load([live, live], 50.0, transport="http", requests=2, timeout=2.0)  # both alive: it runs
        assert _Door.posts >= 1 and len(result.errors) == 2
    finally:
        server.shutdown()
        server.server_close()
