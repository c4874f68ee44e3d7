"""Where the front doors meet the fleet (a hunt's findings): a door's reply names the bundle that answered it
(``model_version``), not the newest the node holds: during a rollout's load phase the new bundle is held but
does not answer yet (found: 2,116 replies named the new bundle while the old one's logits answered them).

A real node process with its HTTP door, two digits bundles of two trainings, the rollout's messages."""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("httptools")

from cli_process import read_until, start, stop  # noqa: E402
from test_rollout import bundles  # noqa: E402,F401 (the two bundles of two trainings)

from cis.core.bundle import load_bundle  # noqa: E402
from cis.runtime.client import Client  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402


def _model_version(url: str) -> str:
    x = np.zeros((1, 1, 8, 8), np.float32)
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    req = urllib.request.Request(f"{url}/v2/models/cis/infer", json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["model_version"]


def test_a_door_reply_names_the_bundle_that_answered_not_a_held_one(bundles):  # noqa: F811
    one, two = bundles
    b1, b2 = load_bundle(one).id, load_bundle(two).id
    zmq = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", one, "--node", "cloud", "--bind", zmq, "--provider", "cpu", "--http-port", 0)
    try:
        text = "".join(read_until(proc.stderr, proc, "node_start"))
        url = re.search(r"http front door at (\S+)", text).group(1)
        assert _model_version(url) == b1
        with Client(zmq, timeout=30) as c:
            c.control("load", timeout=60, path=str(two))  # held beside it, not serving yet
            assert _model_version(url) == b1, "the held bundle did not answer"
            c.control("switch", bundle=b2)
        assert _model_version(url) == b2
    finally:
        assert stop(proc) == 0


def test_a_bundle_of_other_classes_is_not_loaded_beside_the_served_one(bundles, tmp_path, monkeypatch):  # noqa: F811
    """Same stage-1 input, 12 classes instead of 10: a load (so a rollout) is refused with the reason, the node
    serves as before (found: a rollout put a 12-class bundle on a 10-class tree, the doors' metadata stale)."""
    import cis
    from cis.runtime.client import ServerError

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((360, 1, 8, 8)).astype(np.float32)
    run = cis.train(None, (x, np.arange(360) % 12), serving="60-30-10", rounds=1, out=str(tmp_path / "run"))
    twelve = cis.export(run)
    zmq = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", bundles[0], "--node", "cloud", "--bind", zmq, "--provider", "cpu")
    try:
        read_until(proc.stderr, proc, "node_start")
        with Client(zmq, timeout=30) as c:
            with pytest.raises(ServerError) as got:
                c.control("load", timeout=60, path=str(twelve))
            assert got.value.code == "bad_bundle" and "its logits have 12 classes" in str(got.value)
            assert "the bundle it serves has 10" in str(got.value)
            st = c.status()
            assert st["bundle"] == load_bundle(bundles[0]).id and len(st["bundles"]) == 1
    finally:
        assert stop(proc) == 0


def test_grpc_health_check_says_not_serving_from_the_moment_the_node_stops():
    """Check answers from the node's state when asked, not from the door's last tick (up to 0.5 s old: found
    SERVING for 0.25 s after SIGTERM, while ServerReady said false). A real grpc server and channel."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from cis.runtime.oip.grpc_door import _Health

    serves = [True]
    servicer = _Health(lambda: serves[0])
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)  # the door's last tick
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            assert check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == 1  # SERVING
            serves[0] = False  # the node stops; no tick has run since
            assert check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == 2  # NOT_SERVING
    finally:
        server.stop(0)


def test_a_door_on_every_interface_says_so_beside_its_loopback_url(caplog):
    import logging

    from cis.runtime.oip.door import DoorConfig, announce

    cfg = DoorConfig(0, cert="c.pem", key="k.pem", token="t")  # TLS and a token: every interface by default
    with caplog.at_level(logging.INFO, logger="cis"):
        announce("http", "cloud", "https://127.0.0.1:8000", cfg, "cis")
    (line,) = [r.getMessage() for r in caplog.records if "front door at" in r.getMessage()]
    assert line.endswith("listens on every interface (0.0.0.0)") and "https://127.0.0.1:8000" in line
