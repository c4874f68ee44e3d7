"""The bundle format and the onnxruntime stage runner, without torch.

A two-stage bundle is built by hand from tiny ONNX graphs (onnx.helper), so
these tests exercise cis/core/bundle.py and cis/core/stages/runner.py exactly as a node that has
no torch installed does.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from cis.core.bundle import BundleError, StageInfo, TensorInfo, load_bundle, write_manifest, write_profiles  # noqa: E402
from cis.core.policy.exit_policy import ExitPolicy  # noqa: E402
from cis.core.spec import spec_to_dict  # noqa: E402
from cis.core.stages.runner import StageRunner, run_chain, run_stages  # noqa: E402
from cis.core.topologies import make_spec  # noqa: E402

D, C = 6, 3


def _graph(name, inputs, outputs, nodes, inits):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, ["batch", *shape])


def _stage(k, w_feat, w_head, last):
    """logits = relu(x @ Wf) @ Wh ; carry = relu(x @ Wf)."""
    src = "input" if k == 1 else f"features_{k - 1}"
    feat = f"features_{k}" if not last else "hidden"
    nodes = [
        helper.make_node("MatMul", [src, "wf"], ["pre"]),
        helper.make_node("Relu", ["pre"], [feat]),
        helper.make_node("MatMul", [feat, "wh"], ["logits"]),
    ]
    inits = [numpy_helper.from_array(w_feat, "wf"), numpy_helper.from_array(w_head, "wh")]
    outputs = [_vi("logits", [C])] + ([] if last else [_vi(feat, [D])])
    return _graph(f"stage{k}", [_vi(src, [D])], outputs, nodes, inits)


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((D, D)).astype(np.float32), rng.standard_normal((D, C)).astype(np.float32))
        for _ in range(3)
    ]


@pytest.fixture
def bundle_dir(tmp_path, weights):
    root = tmp_path / "bundle"
    (root / "stages").mkdir(parents=True)
    stages = []
    for k, (wf, wh) in enumerate(weights, start=1):
        last = k == len(weights)
        onnx.save_model(_stage(k, wf, wh, last), str(root / f"stages/stage{k}.onnx"))
        src = "input" if k == 1 else f"features_{k - 1}"
        outputs = [TensorInfo("logits", (None, C), "float32")] + (
            [] if last else [TensorInfo(f"features_{k}", (None, D), "float32")]
        )
        stages.append(
            {
                "index": k,
                "exit": k,
                "file": f"stages/stage{k}.onnx",
                "inputs": [TensorInfo(src, (None, D), "float32").to_json()],
                "outputs": [t.to_json() for t in outputs],
                "flops": 2 * D * (D + C),
                "params": D * (D + C),
            }
        )
    spec = make_spec("paper-7", "60-30-10", num_classes=C)
    policy = ExitPolicy("max_softmax", {n.id: (-np.inf if n.parent is None else 0.5) for n in spec.nodes})
    nodes = {n.id: {"exit": n.exit, "stages": list(range(1, n.exit + 1)), "threshold": 0.5} for n in spec.nodes}
    write_profiles(
        root, np.full((4, 3), 0.5), np.ones((4, 3), bool), {k: {1: 1e-4, 8: 2e-4, 32: 5e-4} for k in (1, 2, 3)}
    )
    write_manifest(
        root,
        {
            "method": "cis",
            "stages": stages,
            "nodes": nodes,
            "policy": policy.to_json(),
            "spec": spec_to_dict(spec),
            "feature_dtype": "fp32",
        },
    )
    return root


def _reference(weights, x):
    out, h = {}, x
    for k, (wf, wh) in enumerate(weights, start=1):
        h = np.maximum(h @ wf, 0)
        out[k] = h @ wh
    return out


def test_load_and_run_chain(bundle_dir, weights):
    bundle = load_bundle(bundle_dir)
    assert bundle.num_exits == 3 and bundle.feature_dtype == "fp32"
    assert bundle.stages_for_node("edge0") == [1, 2]
    assert bundle.stage(1).carry_bytes_per_sample() == D * 4
    x = np.random.default_rng(1).standard_normal((17, D)).astype(np.float32)
    got = run_chain(bundle, x, batch_size=5)  # odd batch over uneven chunks
    ref = _reference(weights, x)
    for e in (1, 2, 3):
        np.testing.assert_allclose(got[e], ref[e], atol=1e-4)
    assert set(run_chain(bundle, x, upto=2)) == {1, 2}
    conf, correct = bundle.confidence_profile()
    assert conf.shape == (4, 3) and correct.dtype == bool
    assert bundle.latency_profile()[2][8] == pytest.approx(2e-4)


def test_forwarded_request_continues_at_next_stage(bundle_dir, weights):
    bundle = load_bundle(bundle_dir)
    x = np.random.default_rng(2).standard_normal((4, D)).astype(np.float32)
    first, carry = run_stages([StageRunner(bundle, 1)], {"input": x})
    assert list(carry) == ["features_1"]
    rest, final = run_stages([StageRunner(bundle, 2), StageRunner(bundle, 3)], carry)
    ref = _reference(weights, x)
    np.testing.assert_allclose(rest[3], ref[3], atol=1e-4)
    assert final == {}


def test_runner_rejects_bad_feeds(bundle_dir):
    runner = StageRunner(load_bundle(bundle_dir), 2)
    with pytest.raises(BundleError, match="missing input 'features_1'"):
        runner.run({"input": np.zeros((1, D), np.float32)})
    with pytest.raises(BundleError, match="dtype int64"):
        runner.run({"features_1": np.zeros((1, D), np.int64)})
    with pytest.raises(BundleError, match="stage 2 cannot take this input .onnxruntime"):  # StageInputError
        runner.run({"features_1": np.zeros((1, D + 1), np.float32)})
    out = runner.run({"features_1": np.zeros((2, D), np.float64)})  # float64 is cast
    assert out["logits"].shape == (2, C)
    with pytest.raises(BundleError, match="no stage 4"):
        StageRunner(load_bundle(bundle_dir), 4)


def test_tampered_file_refused(bundle_dir):
    path = bundle_dir / "stages/stage2.onnx"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"stage2\.onnx: sha256 .* changed after export"):
        load_bundle(bundle_dir)


def test_missing_file_refused(bundle_dir):
    (bundle_dir / "profiles/latency.json").unlink()
    with pytest.raises(BundleError, match="latency.json: listed in the manifest but missing"):
        load_bundle(bundle_dir)


def test_bad_manifest_refused(bundle_dir, tmp_path):
    m = json.loads((bundle_dir / "manifest.json").read_text())
    m["schema_version"] = 99
    (bundle_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="schema_version is 99"):
        load_bundle(bundle_dir)
    (bundle_dir / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(bundle_dir)
    with pytest.raises(BundleError, match="no manifest.json"):
        load_bundle(tmp_path / "nowhere")


def test_added_file_in_manifest_is_hashed(bundle_dir):
    shutil.copy(bundle_dir / "stages/stage1.onnx", bundle_dir / "stages/extra.onnx")
    m = json.loads((bundle_dir / "manifest.json").read_text())
    m.pop("files"), m.pop("schema_version")
    write_manifest(bundle_dir, m)
    assert "stages/extra.onnx" in load_bundle(bundle_dir).manifest["files"]


def test_tensor_info_quantisation_round_trip():
    t = TensorInfo("features_1", (None, 16, 8, 8), "int8", 0.03125, -128)
    d = t.to_json()
    assert d["scale"] == 0.03125 and d["zero_point"] == -128
    assert TensorInfo.from_json(d) == t
    assert t.bytes_per_sample() == 16 * 8 * 8
    plain = TensorInfo.from_json({"name": "logits", "shape": [None, 10], "dtype": "float32"})
    assert plain.scale is None and "scale" not in plain.to_json()
    info = StageInfo.from_json({"index": 1, "exit": 1, "file": "f", "inputs": [], "outputs": [d, plain.to_json()]})
    assert info.carry_bytes_per_sample() == 1024
