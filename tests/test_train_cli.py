"""`cis train` and `cis evaluate` on the built-in digits data."""

import json

import pytest
import torch

ROUNDS = 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from cis.cli.main import main

    out = tmp_path_factory.mktemp("runs") / "digits"
    code = main(["train", "--dataset", "digits", "--rounds", str(ROUNDS), "--out", str(out), "--no-progress", "--json"])
    assert code == 0
    return out


def test_train_reaches_85_percent_and_writes_the_run_dir(trained):
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["final_exit_accuracy"] >= 0.85
    assert 0 < summary["cis_accuracy"] <= 1
    assert summary["weights"]["strategy"] == "auto" and summary["weights"]["auto"] == "serving-ramp"  # the default
    assert sum(summary["test"]["served_share_per_exit"].values()) == pytest.approx(1.0)
    lines = [json.loads(ln) for ln in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [ln["round"] for ln in lines] == list(range(1, ROUNDS + 1))
    assert (
        set(lines[-1]["val_exit_accuracy"]) == {"1", "2", "3"}
        and "val_cis_accuracy" in lines[-1]
        and lines[-1]["seconds"] > 0
    )
    meta = json.loads((trained / "checkpoint.json").read_text())
    for key in ("model", "classes", "normalisation", "dataset", "seed", "spec", "weights"):
        assert key in meta
    assert meta["model"]["arch"] == "digits-cnn" and meta["round"] == ROUNDS
    config = json.loads((trained / "config.json").read_text())
    assert config["lr"] == 0.05 and config["rounds"] == ROUNDS  # resolved defaults are written out


def test_evaluate_under_another_serving_setting(trained, run_cli):
    r = run_cli("evaluate", trained, "--serving", "80-15-5", "--json")
    assert r.code == 0, r.err
    res = r.json()
    assert res["served_share_per_exit"] == pytest.approx({"1": 0.8, "2": 0.15, "3": 0.05}, abs=0.01)
    assert abs(res["calibrated"]["max_abs_drift"]) < 0.2
    same = run_cli("evaluate", trained, "--json").json()
    summary = json.loads((trained / "summary.json").read_text())
    assert same["cis_accuracy"] == pytest.approx(summary["cis_accuracy"])
    entropy = run_cli("evaluate", trained, "--confidence", "entropy")
    assert entropy.code == 0 and "entropy" in entropy.out


def test_resume_ends_with_the_same_weights(tmp_path, run_cli):
    args = ["--rounds", "3", "--p", "0.2", "--strategy", "flops", "--no-progress", "--json"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_cli("train", "--out", full, *args).code == 0
    r = run_cli("train", "--out", part, *args, "--stop-after", "1")
    assert r.code == 0 and r.json() == {"stopped_after_round": 1}
    assert not (part / "summary.json").exists()
    r = run_cli("train", "--out", part, "--resume", "--no-progress", "--json")
    assert r.code == 0, r.err
    a = torch.load(full / "checkpoint.pt", weights_only=True)
    b = torch.load(part / "checkpoint.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert (
        json.loads((full / "summary.json").read_text())["test"]
        == json.loads((part / "summary.json").read_text())["test"]
    )
    assert len((part / "metrics.jsonl").read_text().splitlines()) == 3


def test_user_mistakes_are_one_line(tmp_path, run_cli):
    r = run_cli("train", "--dataset", "mnist", "--out", tmp_path / "x")
    assert r.code == 2 and "dataset" in r.err and "Traceback" not in r.err
    r = run_cli("train", "--out", tmp_path / "none", "--resume")
    assert r.code == 2 and "nothing to resume" in r.err
    r = run_cli("evaluate", tmp_path / "missing")
    assert r.code == 2 and "no checkpoint" in r.err
    r = run_cli("train", "--out", tmp_path / "y", "--strategy", "explicit", "--rounds", "1")
    assert r.code == 2 and "explicit" in r.err


def test_measure_grad_variance_and_config_file(tmp_path, run_cli):
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"width": 0.5, "sigma_batches": 3}))
    r = run_cli("train", "--measure-grad-variance", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert len(r.json()["grad_variance"]) == 3 and r.json()["width"] == 0.5
    r = run_cli("train", "--out", tmp_path / "b", "--config", cfg, "--strategy", "balanced-adj", "--rounds", "1",
                "--local-steps", "2", "--no-progress", "--json")
    assert r.code == 0, r.err
    w = json.loads((tmp_path / "b" / "weights.json").read_text())
    assert w["strategy"] == "balanced-adj" and len(w["sigma"]) == 3 and sum(w["first_round"]) == pytest.approx(1.0)
