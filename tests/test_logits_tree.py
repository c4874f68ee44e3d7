"""The answering exit's logits and probabilities on a real three-tier tree (``cis serve --all``, paper-7 digits,
real processes, ZeroMQ between them, HTTP and gRPC doors at the device):

- a request that asks (``Client.infer(x, logits=True)``, the wire's ``want_logits``) gets, per sample, the logits
  of the exit that answered it, whichever node that was (device, edge or cloud), equal to running the bundle's
  ONNX stages offline (onnxruntime) on the same inputs up to that exit; a child merges its own rows with its
  parent's, one request or many in one micro-batch;
- probabilities are their softmax and sum to 1;
- an old-style request (no ``want_logits``) gets the four tensors of before and nothing else;
- tritonclient asking for ``probabilities`` (and ``logits``) gets them over HTTP, JSON and binary, and gRPC;
  without naming them it gets today's five outputs.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("httptools")
pytest.importorskip("grpc")

from cli_process import start, started_nodes, stop  # noqa: E402

from cis.core.bundle import load_bundle, write_manifest  # noqa: E402
from cis.core.policy.confidence import confidence, softmax  # noqa: E402
from cis.core.stages.runner import run_chain  # noqa: E402
from cis.runtime.client import Client  # noqa: E402

N = 40
TOL = {"rtol": 1e-4, "atol": 1e-4}  # one sample alone offline, in a micro-batch at the node: float kernels differ


def _split(conf: np.ndarray, lo: int, hi: int) -> float:
    """A threshold that leaves between ``lo`` and ``hi`` of ``conf`` at or above it: the middle of the widest gap
    between neighbouring values there (float kernels in a batch and alone differ far less than the gap)."""
    v = np.sort(conf)[::-1]
    k = max(range(lo, hi + 1), key=lambda k: v[k - 1] - v[k])
    assert v[k - 1] - v[k] > 1e-4, "no clear threshold"
    return float((v[k - 1] + v[k]) / 2)


def _thresholds(logits: dict[int, np.ndarray], measure: str) -> tuple[float, float]:
    """Device and edge thresholds that leave samples for each of the three exits (about a third each)."""
    c1, c2 = confidence(logits[1], measure), confidence(logits[2], measure)
    t1 = _split(c1, N // 4, N // 2)
    up = c2[c1 < t1]
    return t1, _split(up, len(up) // 3, 2 * len(up) // 3)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle
    from cis.training.data.loading import load_dataset

    bundle_dir = make_demo_bundle(tmp_path_factory.mktemp("logits"), steps=150)
    bundle = load_bundle(bundle_dir)
    x = load_dataset("digits", seed=0).test.x[:N].astype(np.float32)
    offline = run_chain(bundle, x)  # {exit: (N, C)}: the stages alone, onnxruntime on the CPU
    assert bundle.policy is not None
    device, edge = _thresholds(offline, bundle.policy.measure)
    manifest = {k: v for k, v in bundle.manifest.items() if k not in ("schema_version", "files")}
    assert bundle.spec is not None
    layer = {n.id: n.exit for n in bundle.spec.nodes}
    manifest["policy"]["thresholds"] = {nid: {1: device, 2: edge, 3: "-inf"}[e] for nid, e in layer.items()}
    for nid, t in manifest["policy"]["thresholds"].items():  # the nodes table agrees (a contradiction is refused)
        manifest["nodes"][nid]["threshold"] = t
    write_manifest(bundle_dir, manifest)
    proc = start(
        "serve", bundle_dir, "--all", "--free-ports", "--http-port", 0, "--grpc-port", 0, "--json",
        "--provider", "cpu", "--no-cap", "--forward-timeout", "5",
    )  # fmt: skip
    try:
        yield started_nodes(proc), x, offline
    finally:
        assert stop(proc) == 0


def _check_exit_logits(logits: np.ndarray, exits: np.ndarray, offline: dict[int, np.ndarray]) -> None:
    assert logits.shape == (N, offline[1].shape[1]) and logits.dtype == np.float32
    for i, e in enumerate(exits):
        np.testing.assert_allclose(logits[i], offline[int(e)][i], **TOL, err_msg=f"sample {i}, exit {e}")


def test_logits_from_device_edge_and_cloud_equal_the_bundles_stages_run_offline(tree):
    nodes, x, offline = tree
    layer = {nid: n["exit"] for nid, n in nodes.items()}
    with Client(nodes["device0"]["address"], timeout=30) as c:
        one = c.infer(x, logits=True)  # one request: the device merges its rows with the edge's, the edge the cloud's
        many = c.infer_many(x, batch_size=4, window=10, logits=True)  # several requests per micro-batch and forward
    assert set(one.exit.tolist()) == {1, 2, 3} and not one.flags.any()
    assert [layer[s] for s in one.served_by] == one.exit.tolist()  # device, edge and cloud each answered some
    _check_exit_logits(one.logits, one.exit, offline)
    np.testing.assert_array_equal(one.cls, one.logits.argmax(axis=1))
    np.testing.assert_allclose(one.probabilities.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(one.probabilities.max(axis=1), one.confidence, **TOL)  # max_softmax: the confidence
    assert all(r.error is None and r.logits is not None for r in many)
    _check_exit_logits(np.concatenate([r.logits for r in many]), np.concatenate([r.exit for r in many]), offline)


def test_an_old_style_request_gets_the_four_tensors_of_before_and_no_logits(tree):
    nodes, x, _ = tree
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(nodes["device0"]["address"])
    try:  # as docs/protocol.md's example writes it, without the cis package
        h = {"v": 1, "kind": "infer", "id": 1, "stage": 1, "deadline": 0, "route": [],
             "names": ["input"], "dtypes": ["float32"], "shapes": [list(x.shape)]}  # fmt: skip
        sock.send_multipart([msgpack.packb(h), x.tobytes()])
        assert sock.poll(30000)
        head, *frames = sock.recv_multipart()
    finally:
        sock.close()
    h = msgpack.unpackb(head)
    assert h["kind"] == "result" and h["names"] == ["class", "confidence", "exit", "flags"] and len(frames) == 4
    with Client(nodes["device0"]["address"], timeout=30) as c:
        r = c.infer(x)
    assert r.logits is None and r.probabilities is None
    np.testing.assert_array_equal(np.frombuffer(frames[0], np.int64), r.cls)


@pytest.mark.parametrize("protocol, binary", [("http", False), ("http", True), ("grpc", None)])
def test_tritonclient_gets_probabilities_and_logits_when_it_names_them(tree, protocol, binary):
    module = pytest.importorskip(f"tritonclient.{protocol}")
    nodes, x, offline = tree
    device = nodes["device0"]
    client = module.InferenceServerClient(device[protocol].removeprefix("http://"))
    meta = client.get_model_metadata("cis")
    outputs = meta["outputs"] if protocol == "http" else [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs
    ]  # fmt: skip
    width = offline[1].shape[1]
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, width]} in outputs
    given = module.InferInput("input", list(x.shape), "FP32")
    if protocol == "http":
        given.set_data_from_numpy(x, binary_data=binary)
        asked = [module.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "exit", "logits")]
    else:
        given.set_data_from_numpy(x)
        asked = [module.InferRequestedOutput(n) for n in ("probabilities", "exit", "logits")]
    result = client.infer("cis", [given], outputs=asked)
    probs, exits, logits = (result.as_numpy(n) for n in ("probabilities", "exit", "logits"))
    assert probs.shape == logits.shape == (N, width) and probs.dtype == np.float32
    assert set(exits.tolist()) == {1, 2, 3}
    _check_exit_logits(logits, exits, offline)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(probs, softmax(logits), **TOL)
    plain = client.infer("cis", [given])  # no outputs named: today's five, no logits
    names = [o["name"] for o in plain.get_response()["outputs"]] if protocol == "http" else [
        o.name for o in plain.get_response().outputs
    ]  # fmt: skip
    assert names == ["class", "confidence", "exit", "flags", "node"]
