"""--strategy auto: candidates, pilots on the validation split, and a run that continues from the winner."""

import json

import numpy as np
import pytest
import torch

from cis.errors import CisError
from training.auto import pick, pilot_length
from training.strategies import distinct_candidates, make_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAIN = ["--dataset", "digits", "--rounds", "4", "--no-progress", "--json"]


def test_pilot_length_and_pick():
    assert pilot_length(60, 0.2) == 12
    assert pilot_length(4, 0.2) == 1
    assert pilot_length(2, 0.9) == 1  # the run must go on after the choice
    assert pick({"equal": 0.5, "serving-rate": 0.7, "balanced-adj": 0.6}) == "serving-rate"
    assert pick({"equal": 0.7, "serving-rate": 0.7}) == "equal"  # a tie goes to the earlier candidate


def test_candidates_within_tolerance_are_one():
    vs = {"equal": np.full(3, 1 / 3), "serving-rate": np.full(3, 1 / 3), "balanced-adj": np.array([0.32, 0.345, 0.335])}
    assert list(distinct_candidates(vs)) == ["equal"]
    vs["serving-rate"] = np.array([0.8, 0.15, 0.05])
    assert list(distinct_candidates(vs)) == ["equal", "serving-rate"]
    w = make_weights("auto", 3, exit_serving_rate=[80, 15, 5], candidates=["equal", "serving-rate"])
    assert list(w.candidates) == ["equal", "serving-rate"] and np.allclose(w.at(1), 1 / 3)
    w.choose("serving-rate")
    assert np.allclose(w.at(7), [0.8, 0.15, 0.05])
    with pytest.raises(CisError, match="candidates"):
        make_weights("auto", 3, exit_serving_rate=[80, 15, 5], candidates=["flops"])


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_continues_from_the_winner_so_it_equals_the_winners_own_run(tmp_path, run_cli):
    cfg = tmp_path / "auto.json"
    cfg.write_text(json.dumps({"auto_candidates": ["equal", "serving-rate"], "auto_pilot": 0.5}))
    auto = tmp_path / "auto"
    r = run_cli("train", *TRAIN, "--serving", "80-15-5", "--strategy", "auto", "--config", cfg, "--out", auto)
    assert r.code == 0, r.err
    choice = json.loads((auto / "auto.json").read_text())
    scores = choice["pilot_val_cis_accuracy"]
    assert set(scores) == {"equal", "serving-rate"} and choice["pilot_rounds"] == 2
    assert choice["chosen"] == max(scores, key=scores.get)
    for pilot in choice["pilots"].values():  # pilots are rounds 1..P, scored on validation
        assert [ln["round"] for ln in pilot["lines"]] == [1, 2]
        assert pilot["val_cis_accuracy"] == pytest.approx(np.mean([ln["val_cis_accuracy"] for ln in pilot["lines"]]))
    lines = [json.loads(ln) for ln in (auto / "metrics.jsonl").read_text().splitlines()]
    assert [ln["round"] for ln in lines] == [1, 2, 3, 4]
    summary = json.loads((auto / "summary.json").read_text())
    assert summary["weights"]["strategy"] == "auto" and summary["weights"]["chosen"] == choice["chosen"]
    fixed = tmp_path / "fixed"
    assert run_cli("train", *TRAIN, "--serving", "80-15-5", "--strategy", choice["chosen"], "--out", fixed).code == 0
    assert _same(_weights(auto), _weights(fixed))


def test_auto_with_one_distinct_candidate_is_that_candidates_run_and_resumes(tmp_path, run_cli):
    cfg = tmp_path / "auto.json"
    cfg.write_text(json.dumps({"auto_candidates": ["equal", "serving-rate"]}))
    auto, equal = tmp_path / "auto", tmp_path / "equal"
    args = [*TRAIN, "--serving", "33-33-33", "--config", cfg]
    r = run_cli("train", *args, "--strategy", "auto", "--out", auto, "--stop-after", "2")
    assert r.code == 0 and json.loads((auto / "auto.json").read_text())["chosen"] == "equal"
    assert run_cli("train", "--out", auto, "--resume", "--no-progress", "--json").code == 0
    assert run_cli("train", *args, "--strategy", "equal", "--out", equal).code == 0
    assert _same(_weights(auto), _weights(equal))


def test_auto_is_refused_for_other_methods(run_cli, tmp_path):
    r = run_cli("train", *TRAIN, "--method", "depthfl", "--strategy", "auto", "--out", tmp_path / "x")
    assert r.code == 2 and "auto" in r.err


def test_auto_is_refused_on_the_flower_engine(run_cli, tmp_path):
    r = run_cli("train", *TRAIN, "--engine", "flower", "--strategy", "auto", "--out", tmp_path / "x")
    assert r.code == 2 and "builtin engine" in r.err
