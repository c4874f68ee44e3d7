"""Every method of ``cis train --method`` on digits: trains, writes its run dir, reloads; option errors are one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torch")

from cis.training.methods.registry import METHODS  # noqa: E402

TINY = [
    "--dataset",
    "digits",
    "--rounds",
    "1",
    "--local-steps",
    "1",
    "--batch-size",
    "16",
    "--width",
    "0.5",
    "--no-progress",
    "--json",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _one_line_error(res) -> str:
    assert res.code == 2, (res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1, res.err
    return lines[0]


@pytest.mark.parametrize("method", [m for m in METHODS if m != "cis"])
def test_every_method_trains_one_round_and_reloads(method, tmp_path, run_cli):
    from cis.training.checkpoint import load_checkpoint

    out = tmp_path / method
    res = run_cli("train", "--method", method, *TINY, "--out", out)
    assert res.code == 0, res.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method and set(summary["test"]["exit_accuracy"]) == {"1", "2", "3"}
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == method and isinstance(config["options"], dict)  # every option written out
    model, meta, _ = load_checkpoint(out)
    assert model.num_exits == 3 and meta["method"] == method
    ev = run_cli("evaluate", out, "--json")
    assert ev.code == 0, ev.err


def test_method_options_reach_the_model_and_the_metrics(tmp_path, run_cli):
    from cis.training.checkpoint import load_checkpoint

    out = tmp_path / "nefl"
    res = run_cli("train", "--method", "nefl", *TINY, "--nefl-mode", "W", "--option", "learn_steps=false",
                  "--option", "gammas=0.25,0.5,1", "--out", out)
    assert res.code == 0, res.err
    model, _, _ = load_checkpoint(out)
    assert [s["width"] for s in model.config()["specs"]] == [0.25, 0.5, 1.0]  # W: width only
    assert model.config()["learn_steps"] is False
    out = tmp_path / "flame"
    res = run_cli(
        "train",
        "--method",
        "flame",
        *TINY,
        "--patience",
        "1,2",
        "--option",
        "flame_aggregation=exit-based",
        "--out",
        out,
    )
    assert res.code == 0, res.err
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    stats = line["nodes"]
    assert {"avg_exit", "train_flops", "patience"} <= set(stats["cloud"])
    assert sorted({s["patience"] for s in stats.values()}) == [1, 2]
    res = run_cli("train", "--method", "reefl", *TINY, "--no-modulation", "--no-distill", "--out", tmp_path / "reefl")
    assert res.code == 0, res.err
    model, meta, _ = load_checkpoint(tmp_path / "reefl")
    assert model.config()["modulation"] is False and meta["options"]["distill"] is False
    res = run_cli("train", "--method", "depthfl", *TINY, "--option", "kd_ramp_rounds=1", "--out", tmp_path / "depthfl")
    assert res.code == 0, res.err
    kd = [
        json.loads(line)["nodes"]["cloud"]["kd_weight"]
        for line in (tmp_path / "depthfl" / "metrics.jsonl").read_text().splitlines()
    ]
    assert kd[0] == pytest.approx(1.0)  # ramped up by round 1, not exp(-5 (1 - 1/300)^2) = 0.007


def test_options_from_a_config_file(tmp_path, run_cli):
    cfg = tmp_path / "run.toml"
    cfg.write_text('method = "heterofl"\n[options]\ngammas = [0.25, 0.5, 1.0]\ntiers = "dynamic"\n')
    out = tmp_path / "run"
    res = run_cli("train", "--config", cfg, *TINY, "--option", "tier_spread=2", "--out", out)
    assert res.code == 0, res.err
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["gammas"] == [0.25, 0.5, 1.0] and config["options"]["tier_spread"] == 2


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--method", "nosuch"], ["method", "nosuch", "nefl"]),
        (["--method", "nefl", "--option", "nosuch=1"], ["nosuch", "nefl", "nefl_mode"]),
        (["--method", "nefl", "--option", "nefl_mode=X"], ["nefl_mode", "W | D | WD"]),
        (["--method", "nefl", "--option", "gammas=a,b"], ["gammas", "numbers"]),
        (["--method", "nefl", "--option", "novalue"], ["KEY=VALUE"]),
        (["--option", "distill=false"], ["distill", "cis", "no options"]),
        (["--method", "heterofl", "--no-distill"], ["distill", "heterofl"]),
        (["--method", "flame", "--patience", "2,x"], ["patience", "integers"]),
        (["--method", "nefl", "--option", "gammas=0.5,1"], ["gammas", "E = 3"]),
        (["--method", "nefl", "--strategy", "balanced-adj"], ["balanced-adj", "sigma"]),
        (["--method", "nefl", "--p", "0.2"], ["--p", "nefl"]),
        (["--method", "slt", "--option", "budgets=0.05,0.05,0.05"], ["SLT", "0.05", "budget"]),
        (["--method", "scalefl", "--option", "vit_exits=1,2"], ["exits"]),
        (["--method", "reefl", "--option", "kd_ramp_rounds=0"], ["kd_ramp_rounds", "positive"]),
    ],
)
def test_bad_method_or_option_is_a_one_line_error(argv, words, tmp_path, run_cli):
    line = _one_line_error(run_cli("train", *TINY, *argv, "--out", tmp_path / "run"))
    for w in words:
        assert w in line, line


@pytest.mark.slow
@pytest.mark.parametrize("method", ["nefl", "heterofl", "reefl"])
def test_resume_ends_with_the_same_weights(method, tmp_path, run_cli):
    from cis.training.checkpoint import load_checkpoint

    argv = ["--method", method, *TINY[:2], "--rounds", "2", *TINY[4:]]
    assert run_cli("train", *argv, "--out", tmp_path / "a").code == 0
    assert run_cli("train", *argv, "--out", tmp_path / "b", "--stop-after", "1").code == 0
    res = run_cli("train", "--out", tmp_path / "b", "--resume", "--no-progress", "--json")
    assert res.code == 0, res.err
    a, _, _ = load_checkpoint(tmp_path / "a")
    b, meta, _ = load_checkpoint(tmp_path / "b")
    assert meta["round"] == 2
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    line = _one_line_error(
        run_cli(
            "train",
            "--out",
            tmp_path / "b",
            "--resume",
            "--option",
            {"nefl": "tiers=dynamic", "heterofl": "static_bn=false"}.get(method, "distill=false"),
        )
    )
    assert "differs" in line
