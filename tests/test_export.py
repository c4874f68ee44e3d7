"""``cis export`` and ``cis inspect`` on a small digits model trained for a few seconds.

The run dir is made here (cis.exporter.fixture_bundle: central training on all exits, saved in
the trainer's checkpoint format with a paper-7 60-30-10 spec in its metadata),
so these tests do not depend on ``cis train``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.policy.exit_policy import evaluate_cis  # noqa: E402
from cis.core.rates import compute_rates  # noqa: E402
from cis.core.stages.runner import StageRunner, run_chain  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_run

    return make_demo_run(tmp_path_factory.mktemp("export") / "run", steps=200)


@pytest.fixture(scope="module")
def model_and_val(run_dir):
    from cis.training.checkpoint import load_checkpoint
    from cis.training.data.loading import load_dataset

    model, meta, _ = load_checkpoint(run_dir)
    return model, load_dataset(meta["dataset"], seed=meta["seed"]).val


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    """The fp32 bundle, written through the CLI with --json."""
    from cis.cli.main import main

    out = tmp_path_factory.mktemp("bundles") / "fp32"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["export", str(run_dir), "--out", str(out), "--json", "--latency-repeats", "3"])
    assert code == 0
    return out, json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def exported_int8(run_dir, tmp_path_factory):
    from cis.exporter.bundle_writer import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "int8"
    return out, export_bundle(run_dir, out, feature_dtype="int8", latency_repeats=2)


def test_export_report_and_manifest(exported):
    out, report = exported
    v = report["verification"]
    assert v["passed"] and v["max_abs_diff"] <= TOL
    assert sorted(b["size"] for b in v["batches"].values()) == [1, 17, 64]
    bundle = load_bundle(out)  # verifies every sha256
    m = bundle.manifest
    for key in (
        "schema_version",
        "model",
        "classes",
        "normalisation",
        "method",
        "stages",
        "nodes",
        "policy",
        "spec",
        "feature_dtype",
        "versions",
        "files",
    ):
        assert key in m, key
    assert m["method"] == "cis" and m["feature_dtype"] == "fp32" and m["opset"] >= 17
    assert set(m["versions"]) >= {"torch", "onnx", "onnxruntime", "cis"}
    assert len(m["classes"]) == 10 and set(m["normalisation"]) == {"mean", "std"}
    assert bundle.num_exits == 3
    names = [([t.name for t in s.inputs], [t.name for t in s.outputs]) for s in bundle.stages]
    assert names == [
        (["input"], ["logits", "features_1"]),
        (["features_1"], ["logits", "features_2"]),
        (["features_2"], ["logits"]),
    ]
    for s, raw in zip(bundle.stages, m["stages"]):
        assert s.flops > 0 and s.params > 0 and raw["bytes"] == (out / s.file).stat().st_size
        assert raw["sha256"] == m["files"][s.file]
        assert all(t.shape[0] is None for t in (*s.inputs, *s.outputs))  # dynamic batch
    assert bundle.stage(1).inputs[0].shape == (None, 1, 8, 8)
    # the nodes table follows the spec; thresholds are the policy's
    assert m["nodes"]["device0"] == {
        "exit": 1,
        "stages": [1],
        "threshold": pytest.approx(bundle.policy.thresholds["device0"]),
    }
    assert m["nodes"]["cloud"]["threshold"] == "-inf" and bundle.stages_for_node("edge1") == [1, 2]
    assert bundle.spec.ids == [n["id"] for n in m["spec"]["nodes"]] and bundle.spec.num_exits == 3


def test_graphs_are_static(exported):
    import onnx

    out, _ = exported
    for s in load_bundle(out).stages:
        model = onnx.load(str(out / s.file))
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"If", "Loop", "Scan"}
        assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17


def test_stages_and_chain_match_torch(exported, model_and_val):
    from cis.training.evaluate import predict_exits

    out, _ = exported
    model, val = model_and_val
    bundle = load_bundle(out)
    full = predict_exits(model, val.x)
    chain = run_chain(bundle, val.x)
    for e in (1, 2, 3):
        assert np.abs(chain[e] - full[e]).max() <= TOL
        assert (chain[e].argmax(1) == full[e].argmax(1)).all()
    # every stage alone on torch's carry, at batch 1 and an odd batch
    for n in (1, 17):
        x = torch.from_numpy(val.x[:n])
        carry = {"input": x}
        with torch.no_grad():
            for k, stage in enumerate(model.stages(), start=1):
                logits, feats = stage(carry["input"] if k == 1 else carry[f"features_{k - 1}"])
                got = StageRunner(bundle, k).run({name: t.numpy() for name, t in carry.items()})
                assert np.abs(got["logits"] - logits.numpy()).max() <= TOL
                if k < 3:
                    assert np.abs(got[f"features_{k}"] - feats.numpy()).max() <= TOL
                carry = {f"features_{k}": feats}


def test_thresholds_reproduce_target_shares(exported, model_and_val):
    out, report = exported
    _, val = model_and_val
    bundle = load_bundle(out)
    logits = run_chain(bundle, val.x)
    result = evaluate_cis(bundle.spec, logits, val.y, policy=bundle.policy)
    targets = compute_rates(bundle.spec).exit_share
    assert targets == pytest.approx({1: 0.6, 2: 0.3, 3: 0.1})
    for e, share in targets.items():
        assert abs(result.exit_shares[e] - share) <= 0.02
    assert report["calibration"]["max_share_error"] <= 0.02
    assert bundle.policy.measure == bundle.spec.confidence


def test_profiles(exported, model_and_val):
    out, _ = exported
    _, val = model_and_val
    bundle = load_bundle(out)
    conf, correct = bundle.confidence_profile()
    assert conf.shape == correct.shape == (len(val), 3)
    assert 0 <= conf.min() and conf.max() <= 1
    assert correct[:, 2].mean() > 0.85  # a trained model, not noise
    latency = bundle.latency_profile()
    assert set(latency) == {1, 2, 3} and all(set(v) == {1, 8, 32} and min(v.values()) > 0 for v in latency.values())


def test_feature_dtype_report(exported):
    _, report = exported
    d = report["feature_dtypes"]
    assert set(d) == {"fp32", "fp16", "int8"}
    fp32 = d["fp32"]["bytes_per_forwarded_request"]
    assert fp32 == {"1": 16 * 8 * 8 * 4, "2": 32 * 4 * 4 * 4}
    assert d["fp16"]["bytes_per_forwarded_request"] == {k: v // 2 for k, v in fp32.items()}
    assert d["int8"]["bytes_per_forwarded_request"] == {k: v // 4 for k, v in fp32.items()}
    for name in ("fp16", "int8"):
        assert all(abs(c) <= 0.03 for c in d[name]["val_accuracy_change"].values())
        assert d[name]["val_accuracy_change"]["1"] == 0.0  # exit 1 never reads a carry


def test_int8_bundle(exported_int8, model_and_val, exported):
    out, report = exported_int8
    _, val = model_and_val
    bundle = load_bundle(out)
    assert bundle.feature_dtype == "int8"
    sent = bundle.stage(1).outputs[1]
    received = bundle.stage(2).inputs[0]
    assert sent == received and sent.dtype == "int8" and sent.scale > 0 and -128 <= sent.zero_point <= 127
    assert bundle.stage(1).carry_bytes_per_sample() == 16 * 8 * 8
    runner = StageRunner(bundle, 1)
    for n in (1, 17):
        outs = runner.run({"input": val.x[:n]})
        assert outs["features_1"].dtype == np.int8 and outs["features_1"].shape == (n, 16, 8, 8)
    logits = run_chain(bundle, val.x)
    fp32 = run_chain(load_bundle(exported[0]), val.x)
    for e in (2, 3):
        assert abs((logits[e].argmax(1) == val.y).mean() - (fp32[e].argmax(1) == val.y).mean()) <= 0.03
    result = evaluate_cis(bundle.spec, logits, val.y, policy=bundle.policy)
    for e, share in compute_rates(bundle.spec).exit_share.items():
        assert abs(result.exit_shares[e] - share) <= 0.02
    assert report["verification"]["max_abs_diff"] <= TOL  # fp32 graphs verified before quantising


def test_fp16_bundle(run_dir, tmp_path, model_and_val):
    from cis.exporter.bundle_writer import export_bundle

    _, val = model_and_val
    export_bundle(run_dir, tmp_path / "fp16", feature_dtype="fp16", latency_repeats=1, latency_batches=(1,))
    bundle = load_bundle(tmp_path / "fp16")
    assert [t.dtype for s in bundle.stages for t in s.carry_outputs] == ["float16", "float16"]
    assert bundle.stage(3).inputs[0].dtype == "float16"
    logits = run_chain(bundle, val.x[:17])
    assert logits[3].shape == (17, 10)


def test_export_cli_human_summary(exported, run_dir, tmp_path, run_cli):
    from cis.cli.commands.export import summary

    _, report = exported
    text = summary(report)
    assert "verified with onnxruntime: max abs diff" in text and "int8" in text and "device0" in text
    res = run_cli("export", run_dir, "--out", tmp_path / "b", "--opset", "17", "--latency-repeats", "1")
    assert res.code == 0 and "served on validation" in res.out and "cis export: wrote" in res.err


def test_inspect_cli(exported, run_cli):
    out, _ = exported
    res = run_cli("inspect", out)
    assert res.code == 0, res.err
    assert "sha256 verified" in res.out and "features_1 float32[Nx16x8x8]" in res.out and "device0" in res.out
    res = run_cli("inspect", out, "--json")
    assert res.code == 0 and res.json()["stages"][0]["file"] == "stages/stage1.onnx"


def test_inspect_imports_no_torch(exported):
    out, _ = exported
    code = (
        "import sys; from cis.cli.main import main; rc = main(['inspect', sys.argv[1], '--json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    res = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["feature_dtype"] == "fp32"


def test_tampered_bundle_refused(exported, tmp_path, run_cli):
    src, _ = exported
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    f = bad / "stages/stage2.onnx"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    res = run_cli("inspect", bad)
    assert res.code == 2 and "stage2.onnx: sha256" in res.err and "Traceback" not in res.err
    (bad / "profiles/confidence.npz").unlink()
    f.write_bytes((src / "stages/stage2.onnx").read_bytes())
    res = run_cli("inspect", bad)
    assert res.code == 2 and "confidence.npz: listed in the manifest but missing" in res.err


def test_mismatched_checkpoint_refused(run_dir, tmp_path, run_cli):
    bad = tmp_path / "run"
    shutil.copytree(run_dir, bad)
    meta = json.loads((bad / "checkpoint.json").read_text())
    meta["model"]["width"] = 0.5
    (bad / "checkpoint.json").write_text(json.dumps(meta))
    res = run_cli("export", bad, "--out", tmp_path / "b")
    assert res.code == 2 and "do not match the architecture" in res.err
    assert not (tmp_path / "b").exists()


def test_export_bad_input(run_dir, tmp_path, run_cli):
    res = run_cli("export", run_dir, "--out", tmp_path / "b", "--opset", "13")
    assert res.code == 2 and "opset 13" in res.err
    spec = tmp_path / "two.toml"
    spec.write_text('[cis]\nexits = 2\n[[nodes]]\nid = "root"\nexit = 2\n')
    res = run_cli("export", run_dir, "--out", tmp_path / "b", "--spec", spec)
    assert res.code == 2 and "exits is 2" in res.err
    notempty = tmp_path / "occupied"
    notempty.mkdir()
    (notempty / "keep.txt").write_text("x")
    res = run_cli("export", run_dir, "--out", notempty)
    assert res.code == 2 and "not empty" in res.err
    meta = json.loads((run_dir / "checkpoint.json").read_text())
    nospec = tmp_path / "nospec"
    shutil.copytree(run_dir, nospec)
    meta.pop("spec")
    (nospec / "checkpoint.json").write_text(json.dumps(meta))
    res = run_cli("export", nospec, "--out", tmp_path / "b")
    assert res.code == 2 and "--spec" in res.err


def test_trt_without_tensorrt_is_one_clear_line(run_dir, tmp_path, run_cli):
    try:
        import tensorrt  # noqa: F401

        if torch.cuda.is_available():
            pytest.skip("TensorRT and a GPU are present; see test_tensorrt_engines")
    except Exception:
        pass
    res = run_cli("export", run_dir, "--out", tmp_path / "b", "--trt")
    assert res.code == 2 and "--trt needs" in res.err
    assert len(res.err.strip().splitlines()) == 1


@pytest.mark.gpu
def test_tensorrt_engines(run_dir, tmp_path):
    pytest.importorskip("tensorrt")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from cis.exporter.bundle_writer import export_bundle

    report = export_bundle(run_dir, tmp_path / "trt", trt=True, latency_repeats=2)
    bundle = load_bundle(tmp_path / "trt")
    assert all(s.engine and (tmp_path / "trt" / s.engine).is_file() for s in bundle.stages)
    for stage in report["tensorrt"]["stages"].values():
        assert all(c["passed"] for c in stage["checks"].values())


def test_stages_are_timed_on_real_carries(exported, model_and_val):
    """The latency profile feeds each stage what the one before passes on for real samples (a stage's time can
    depend on its values), repeating the samples up to the batch size."""
    from cis.core.stages.runner import stage_runners
    from cis.exporter.profile import latency_profile, stage_inputs

    _, val = model_and_val
    runners = stage_runners(load_bundle(exported[0]))
    feeds = stage_inputs(runners, val.x[:3], 5)
    first = feeds[0][runners[0].input_names[0]]
    assert first.shape[0] == 5 and np.array_equal(first[3:], val.x[:2])
    out = runners[0].run(feeds[0])
    assert all(np.array_equal(feeds[1][name], out[name]) for name in runners[1].input_names)
    timed = latency_profile(runners, (1, 4), repeats=2, x=val.x)
    assert set(timed) == {1, 2, 3} and all(min(v.values()) > 0 for v in timed.values())
