"""--strategy auto (issue 22): flops where the last exit serves most, else the serving-rate ramp; one run's
compute, no pilots."""

import json

import numpy as np
import pytest
import torch

from cis.training.aggregation.weights import auto_choice, make_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAIN = ["--dataset", "digits", "--rounds", "4", "--no-progress", "--json"]
FLOPS = [2.8e6, 9.4e6, 17.7e6]


@pytest.mark.parametrize(
    "rates, choice",
    [([80, 15, 5], "serving-ramp"), ([1, 1, 1], "serving-ramp"), ([40, 20, 40], "serving-ramp"),
     ([5, 15, 80], "flops"), ([30, 30, 40], "flops"), ([0.2, 0.8], "flops"), ([0.8, 0.2], "serving-ramp")],
)
def test_auto_runs_flops_where_the_last_exit_serves_more_than_the_first(rates, choice):
    assert auto_choice(rates) == choice


def test_a_flat_split_from_the_rate_recurrence_is_not_back_heavy():
    """33-33-33's exit rates come out of the recurrence a few 1e-11 apart: still the ramp (= equal), not flops."""
    from cis.core.rates import compute_rates
    from cis.core.topologies import make_spec

    rates = compute_rates(make_spec("paper-7", "33-33-33")).exit_serving_rate
    assert auto_choice([rates[e] for e in sorted(rates)]) == "serving-ramp"


@pytest.mark.parametrize("rates", [[80, 15, 5], [5, 15, 80]])
def test_auto_has_the_weights_of_its_choice_in_every_round(rates):
    choice = auto_choice(rates)
    auto = make_weights("auto", 3, total_rounds=20, exit_serving_rate=rates, flops=FLOPS)
    same = make_weights(choice, 3, total_rounds=20, exit_serving_rate=rates, flops=FLOPS)
    assert all(np.array_equal(auto.at(t), same.at(t)) for t in range(1, 21))
    assert auto.describe()["strategy"] == "auto" and auto.describe()["auto"] == choice
    assert np.allclose(auto.at(1), 1 / 3)


def test_auto_ends_at_the_serving_rates_at_80_15_5_and_at_the_flops_shares_at_5_15_80():
    front = make_weights("auto", 3, total_rounds=20, exit_serving_rate=[80, 15, 5], flops=FLOPS)
    back = make_weights("auto", 3, total_rounds=20, exit_serving_rate=[5, 15, 80], flops=FLOPS)
    assert np.allclose(front.at(20), [0.8, 0.15, 0.05])
    assert np.allclose(back.at(20), np.array(FLOPS) / sum(FLOPS))


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("serving, choice", [("80-15-5", "serving-ramp"), ("5-15-80", "flops")])
def test_an_auto_run_is_its_choice_s_run_at_the_same_compute(tmp_path, run_cli, serving, choice):
    runs = {}
    for strategy in ("auto", choice, "equal"):
        out = tmp_path / strategy
        r = run_cli("train", *TRAIN, "--serving", serving, "--strategy", strategy, "--out", out)
        assert r.code == 0, r.err
        runs[strategy] = json.loads((out / "summary.json").read_text())
    assert _same(_weights(tmp_path / "auto"), _weights(tmp_path / choice))
    assert not _same(_weights(tmp_path / "auto"), _weights(tmp_path / "equal"))
    assert not (tmp_path / "auto" / "auto.json").exists()  # no pilots
    steps = {k: v["sgd_steps"]["total"] for k, v in runs.items()}
    assert steps["auto"] == steps[choice] == steps["equal"] > 0  # exactly one run's SGD steps
    assert runs["auto"]["weights"]["last_round"] == pytest.approx(runs[choice]["weights"]["last_round"])
    assert runs["auto"]["weights"]["auto"] == choice


def test_at_33_33_33_auto_is_equal_weighting():
    # the benchmarks reuse equal's runs for auto there (as for serving-rate): the same weights up to rounding
    auto = make_weights("auto", 3, total_rounds=60, exit_serving_rate=[1 / 3] * 3, flops=FLOPS)
    assert all(np.allclose(auto.at(t), 1 / 3, rtol=0, atol=1e-15) for t in range(1, 61))
