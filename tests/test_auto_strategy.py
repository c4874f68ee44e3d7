"""--strategy auto: the serving-rate ramp (issue 22), one run's compute, no pilots."""

import json

import numpy as np
import pytest
import torch

from training.aggregation.weights import AUTO, make_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAIN = ["--dataset", "digits", "--rounds", "4", "--no-progress", "--json"]


def test_auto_is_the_serving_ramp():
    assert AUTO == "serving-ramp"
    auto = make_weights("auto", 3, total_rounds=20, exit_serving_rate=[80, 15, 5])
    ramp = make_weights("serving-ramp", 3, total_rounds=20, exit_serving_rate=[80, 15, 5])
    assert all(np.array_equal(auto.at(t), ramp.at(t)) for t in range(1, 21))
    assert auto.describe()["strategy"] == "auto" and auto.describe()["auto"] == "serving-ramp"
    assert np.allclose(auto.at(1), 1 / 3) and np.allclose(auto.at(20), [0.8, 0.15, 0.05])


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_auto_run_is_the_serving_ramp_run_at_the_same_compute(tmp_path, run_cli):
    runs = {}
    for strategy in ("auto", "serving-ramp", "equal"):
        out = tmp_path / strategy
        r = run_cli("train", *TRAIN, "--serving", "80-15-5", "--strategy", strategy, "--out", out)
        assert r.code == 0, r.err
        runs[strategy] = json.loads((out / "summary.json").read_text())
    assert _same(_weights(tmp_path / "auto"), _weights(tmp_path / "serving-ramp"))
    assert not (tmp_path / "auto" / "auto.json").exists()  # no pilots
    steps = {k: v["sgd_steps"]["total"] for k, v in runs.items()}
    assert steps["auto"] == steps["serving-ramp"] == steps["equal"] > 0  # exactly one run's SGD steps
    assert runs["auto"]["weights"]["last_round"] == pytest.approx([0.8, 0.15, 0.05])


def test_at_33_33_33_auto_is_equal_weighting():
    # the benchmarks reuse equal's runs for auto there (as for serving-rate): the same weights up to rounding
    auto = make_weights("auto", 3, total_rounds=60, exit_serving_rate=[1 / 3] * 3)
    assert all(np.allclose(auto.at(t), 1 / 3, rtol=0, atol=1e-15) for t in range(1, 61))
