"""Issue 33's "done when": tritonclient's HTTP and gRPC clients (a real Open Inference Protocol client nobody
here wrote) against a whole cis tree (``cis serve --all --http-port 0 --grpc-port 0 --json``, paper-7 digits):
``is_server_live``, ``get_model_metadata`` and ``infer`` at a device, with JSON and with binary tensors, give the
same predictions as ``cis infer`` sending the same samples over ZeroMQ to the same device; forwarded samples
answer from the edge or the cloud, as over ZeroMQ."""

from __future__ import annotations

import csv
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("httptools")
pytest.importorskip("grpc")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

from cli_process import cis_argv, start, started_nodes, stop  # noqa: E402

N = 40


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle
    from cis.training.data.loading import load_dataset

    root = tmp_path_factory.mktemp("triton")
    bundle = make_demo_bundle(root, steps=150)
    test = load_dataset("digits", seed=0).test
    np.savez(root / "digits.npz", x=test.x[:N], y=test.y[:N])
    proc = start(
        "serve", bundle, "--all", "--free-ports", "--http-port", 0, "--grpc-port", 0, "--json", "--provider", "cpu",
        "--no-cap", "--forward-timeout", "5",
    )  # fmt: skip
    try:
        nodes = started_nodes(proc)
        yield nodes, root, test.x[:N].astype(np.float32)
    finally:
        assert stop(proc) == 0


def _cis_infer(address: str, root) -> tuple[np.ndarray, list[str]]:
    """Classes and serving nodes from ``cis infer`` (one request of all samples, as the Triton clients send)."""
    out = root / "infer.csv"
    argv = cis_argv("infer", "--connect", address, "--dataset", root / "digits.npz", "--batch-size", N,
                    "--window", 1, "--out", out)  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(out)))
    return np.array([int(r["class"]) for r in rows]), [r["node"] for r in rows]


def test_every_node_prints_its_urls(tree):
    nodes, _, _ = tree
    for node in nodes.values():
        assert node["http"].startswith("http://127.0.0.1:") and node["grpc"].startswith("127.0.0.1:")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_gets_what_cis_infer_gets(tree, protocol, binary):
    nodes, root, x = tree
    device = nodes["device0"]
    want_cls, want_nodes = _cis_infer(device["address"], root)
    module = httpclient if protocol == "http" else grpcclient
    url = device[protocol].removeprefix("http://")
    client = module.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cis")
    meta = client.get_model_metadata("cis")
    if protocol == "http":
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    else:
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("input", "FP32", [-1, 1, 8, 8])]
    given = module.InferInput("input", list(x.shape), "FP32")
    if protocol == "http":
        given.set_data_from_numpy(x, binary_data=binary)
        outputs = [module.InferRequestedOutput(n, binary_data=binary) for n in ("class", "exit", "node")]
    else:
        given.set_data_from_numpy(x)
        outputs = [module.InferRequestedOutput(n) for n in ("class", "exit", "node")]
    result = client.infer("cis", [given], outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("class"), want_cls)
    served = [s.decode() if isinstance(s, bytes) else s for s in result.as_numpy("node")]
    assert served == want_nodes
    assert set(served) - {"device0"}, "some samples should be forwarded up the tree"
    response = result.get_response()
    assert (response["id"] if protocol == "http" else response.id) == "req-7"


def test_a_malformed_traceparent_is_a_new_trace_and_forwarding_goes_on(tree):
    """A door passes the caller's traceparent as it came; one that is no W3C traceparent must not spoil the
    forward to the parent (the request is answered as any other, its forwarded samples from above)."""
    nodes, root, x = tree
    want_cls, want_nodes = _cis_infer(nodes["device0"]["address"], root)
    client = httpclient.InferenceServerClient(nodes["device0"]["http"].removeprefix("http://"))
    given = httpclient.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("cis", [given], headers={"traceparent": "not-a-trace-context"})
    np.testing.assert_array_equal(result.as_numpy("class"), want_cls)
    assert [s.decode() for s in result.as_numpy("node")] == want_nodes
    assert not result.as_numpy("flags").any()  # nothing degraded: the parent took the forward
