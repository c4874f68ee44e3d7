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
        yield nodes, root, test.x[:N].astype(np.float32), bundle
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
    nodes, _, _, _ = tree
    for node in nodes.values():
        assert node["http"].startswith("http://127.0.0.1:") and node["grpc"].startswith("127.0.0.1:")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_gets_what_cis_infer_gets(tree, protocol, binary):
    nodes, root, x, _ = tree
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
    nodes, root, x, _ = tree
    want_cls, want_nodes = _cis_infer(nodes["device0"]["address"], root)
    client = httpclient.InferenceServerClient(nodes["device0"]["http"].removeprefix("http://"))
    given = httpclient.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("cis", [given], headers={"traceparent": "not-a-trace-context"})
    np.testing.assert_array_equal(result.as_numpy("class"), want_cls)
    assert [s.decode() for s in result.as_numpy("node")] == want_nodes
    assert not result.as_numpy("flags").any()  # nothing degraded: the parent took the forward


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_reads_the_config_the_statistics_and_the_bundle_version(tree, protocol):
    """Issue 41 item 5: Triton's clients read a node's model configuration and statistics in Triton's forms, and
    the model metadata lists the bundle versions the node holds (here one: the bundle id, sha256[:16])."""
    from cis.core.bundle import load_bundle

    nodes, _, x, bundle = tree
    version = load_bundle(bundle).sha256[:16]
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(nodes["edge0"][protocol].removeprefix("http://"))
    given = module.InferInput("input", list(x[:5].shape), "FP32")
    given.set_data_from_numpy(x[:5])
    result = client.infer("cis", [given])
    response = result.get_response(as_json=True) if protocol == "grpc" else result.get_response()
    assert response["model_version"] == version
    meta = client.get_model_metadata("cis", as_json=True) if protocol == "grpc" else client.get_model_metadata("cis")
    assert meta["versions"] == [version]
    config = client.get_model_config("cis", version, as_json=True) if protocol == "grpc" else (
        client.get_model_config("cis", version))  # fmt: skip
    config = config.get("config", config)
    assert config["name"] == "cis" and int(config["max_batch_size"]) >= 1
    (given_input,) = config["input"]
    assert given_input["name"] == "input" and given_input["data_type"] == "TYPE_FP32"
    assert [int(d) for d in given_input["dims"]] == [1, 8, 8]
    assert {o["name"] for o in config["output"]} >= {"class", "confidence", "exit", "flags", "node"}
    stats = client.get_inference_statistics("cis", as_json=True) if protocol == "grpc" else (
        client.get_inference_statistics("cis"))  # fmt: skip
    (model,) = stats["model_stats"]
    assert model["name"] == "cis" and model["version"] == version
    assert int(model["inference_count"]) >= 5 and int(model["execution_count"]) >= 1
    success = model["inference_stats"]["success"]
    assert int(success["count"]) >= 1 and int(success["ns"]) > 0  # the answered requests and their latency
    assert int(model["inference_stats"]["queue"]["count"]) >= 1
    one = client.get_inference_statistics("cis", "1", as_json=True) if protocol == "grpc" else (
        client.get_inference_statistics("cis", "1"))  # fmt: skip
    assert one["model_stats"][0]["version"] == version  # version 1 names the newest the node holds
    with pytest.raises(Exception, match="no version"):
        client.get_model_config("cis", "nope")


def test_the_grpc_health_service(tree):
    """grpc.health.v1: SERVING for the server and for the inference service, no token needed; Watch says it too."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    nodes, _, _, _ = tree
    with grpc.insecure_channel(nodes["cloud"]["grpc"]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
