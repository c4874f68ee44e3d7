"""A NeFL model from ``cis train --method nefl`` exports, serves through the runtime and simulates.

The carry between tiers is the raw input (a parent re-runs its own, larger
sub-model on it); the runtime and the simulator take that from the manifest.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from test_runtime_integration import serve_through_leaves  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.policy.exit_policy import evaluate_cis  # noqa: E402
from cis.runtime.result_summary import summarize  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nefl_bundle(tmp_path_factory):
    from cis.cli.main import main

    root = tmp_path_factory.mktemp("nefl")
    code = main(
        [
            "train",
            "--method",
            "nefl",
            "--dataset",
            "digits",
            "--rounds",
            "4",
            "--out",
            str(root / "run"),
            "--no-progress",
            "--json",
        ]
    )
    assert code == 0
    assert main(["export", str(root / "run"), "--out", str(root / "bundle"), "--latency-repeats", "2", "--json"]) == 0
    return root


@pytest.fixture(scope="module")
def test_set():
    from cis.training.data.loading import load_dataset

    d = load_dataset("digits", seed=0).test
    return d.x, d.y


def test_manifest_carries_the_raw_input_and_stages_match_the_sub_models(nefl_bundle, test_set):
    from cis.core.stages.runner import run_chain
    from cis.training.checkpoint import load_checkpoint
    from cis.training.evaluate import predict_exits

    x, _ = test_set
    bundle = load_bundle(nefl_bundle / "bundle")
    stages = json.loads((nefl_bundle / "bundle" / "manifest.json").read_text())["stages"]
    for k, st in enumerate(stages, start=1):
        (inp,) = st["inputs"]
        assert inp["name"] == ("input" if k == 1 else f"input_{k - 1}") and inp["shape"][1:] == [1, 8, 8]
        if k < len(stages):  # logits + the input, unchanged
            assert [o["name"] for o in st["outputs"]] == ["logits", f"input_{k}"]
            assert st["outputs"][1]["shape"] == inp["shape"] and st["carry_bytes_per_sample"] == 8 * 8 * 4
    model, _, _ = load_checkpoint(nefl_bundle / "run")
    offline = predict_exits(model, x)  # sub-model k on the input, in torch
    served = run_chain(bundle, x)
    for e in (1, 2, 3):
        np.testing.assert_allclose(served[e], offline[e], atol=1e-3)


def test_nefl_bundle_serves_like_the_offline_evaluation(nefl_bundle, test_set):
    from cis.core.stages.runner import run_chain

    x, y = test_set
    bundle = load_bundle(nefl_bundle / "bundle")
    spec = bundle.spec
    logits = run_chain(bundle, x)
    offline = evaluate_cis(spec, logits, y, policy=bundle.policy)
    results = serve_through_leaves(nefl_bundle / "bundle", x)
    live = summarize(results, y)
    assert live["errors"] == {} and live["samples_answered"] == len(y) and live["degraded"] == 0
    for e, share in offline.exit_shares.items():
        assert abs(live["served_share_per_exit"].get(str(e), 0.0) - share) <= 0.02, (live, offline)
    assert abs(live["accuracy"] - offline.accuracy) <= 0.02
    # every answer is the class of the sub-model that served it, run on the raw input (ties aside)
    wrong = sum(int(r.cls[0]) != int(np.argmax(logits[int(r.exit[0])][i])) for i, r in enumerate(results))
    assert wrong <= len(results) // 100


def test_simulator_takes_the_raw_input_carry_from_the_manifest(nefl_bundle, tmp_path, run_cli):
    from cis.core.spec import write_spec

    bundle = load_bundle(nefl_bundle / "bundle")
    write_spec(bundle.spec, tmp_path / "spec.toml")
    res = run_cli(
        "simulate", "--spec", tmp_path / "spec.toml", "--bundle", nefl_bundle / "bundle", "--requests", "300", "--json"
    )
    assert res.code == 0, res.err
    out = res.json()
    assert out["requests"]["served"] == 300
    assert out["links"] and all(link["payload_bytes"] == 8 * 8 * 4 for link in out["links"].values())
