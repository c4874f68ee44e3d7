"""`cis train`'s run found by a hunt of the training docs (helper-47's items 2, 3, 4, 9b, 10, 13, 16).

Gradient clipping by value and by norm together (value first, then the total norm); ExclusiveFL refused where
its only trained exit weighs 0; a run dir that removes only what the run wrote and is refused where the run
would overwrite its own inputs or a user's file; the round a failed validation names; --rates-from's files
written only after the config is checked; per-exit losses of the multi-exit trainers; --model's method
conflict said before its file is looked for.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from cis.training.config import make_config  # noqa: E402

FAST = ("--rounds", "1", "--local-steps", "1", "--no-progress", "--log-level", "warning")

TRIPPING = '''
from torch import nn

STATE = {{"trained": False}}


class Trip(nn.Module):
    """Passes its input through; raises in training mode ("train"), or in eval mode once it trained ("eval")."""

    def forward(self, h):
        if self.training:
            STATE["trained"] = True
            if {fail!r} == "train":
                raise RuntimeError("boom while training")
        elif STATE["trained"] and {fail!r} == "eval":
            raise RuntimeError("boom while validating")
        return h


def make(num_classes, input_shape):
    c, h, w = input_shape
    stage = lambda n: nn.Sequential(nn.Linear(n, 16), nn.ReLU())  # noqa: E731
    return [(nn.Sequential(nn.Flatten(), stage(c * h * w), Trip()), nn.Linear(16, num_classes)),
            (stage(16), nn.Linear(16, num_classes)), (stage(16), nn.Linear(16, num_classes))]
'''


def tripping_model(folder: Path, fail: str) -> str:
    path = folder / f"trip_{fail}.py"
    path.write_text(TRIPPING.format(fail=fail))
    return f"{path}:make"


def one_line(r) -> str:
    assert r.code == 2 and "Traceback" not in r.err and r.err.count("\n") == 1, (r.code, r.err)
    return r.err.strip().removeprefix("cis train: error: ")


# item 2: --clip-grad-norm with option clip_value


def param_change(method: str, clip_value: float, clip_grad_norm: float) -> float:
    """The norm of one round's change of the model's parameters (plain SGD: no momentum, no weight decay)."""
    from cis.training.run import build_setup

    config = make_config({}, {
        "method": method, "options": {"clip_value": clip_value}, "clip_grad_norm": clip_grad_norm, "rounds": 1,
        "local_steps": 1, "momentum": 0.0, "weight_decay": 0.0, "strategy": "equal",
    })
    s = build_setup(config)
    names = [k for k, _ in s.model.named_parameters()]
    start = {k: s.engine.global_state[k].clone() for k in names}
    s.engine.run_round()
    return float(sum((s.engine.global_state[k] - start[k]).pow(2).sum() for k in names)) ** 0.5


@pytest.mark.parametrize("method", ["depthfl", "exclusivefl"])
def test_clip_grad_norm_bounds_the_step_when_clip_value_is_set_too(method):
    """Each client's step is at most lr x the norm bound; their per-entry average at most sqrt(7 clients) times it."""
    bound = make_config({}, {}).lr * 1e-2 * 7**0.5
    assert param_change(method, 1.0, 1e-2) <= bound  # was ~0.2: only the values clipped
    assert param_change(method, 1.0, 1e9) > 20 * bound  # a loose norm bound leaves the step as it was
    assert param_change(method, 1e-6, 1e9) < 1e-3  # and the value clip still applies


# item 3: ExclusiveFL with its only trained exit at weight 0


@pytest.mark.parametrize("strategy", ["auto", "serving-rate"])
def test_exclusivefl_whose_last_exit_serves_nothing_is_refused_before_training(tmp_path, run_cli, strategy):
    out = tmp_path / "run"
    said = one_line(run_cli("train", "--method", "exclusivefl", "--serving", "50-50-0", "--strategy", strategy,
                            *FAST, "--out", out))
    assert said.startswith("--method exclusivefl: only the clients of exit 3 (the full model) train, and the ")
    assert "weight 0 in round 1" in said and not out.exists()


# item 4: the user's files in --out


def user_folder(folder: Path, run_cli) -> dict[str, bytes]:
    assert run_cli("spec", "new", "-o", folder / "spec.toml").code == 0
    (folder / "config.json").write_text(json.dumps({"rounds": 1, "local_steps": 1}))
    (folder / "notes.txt").write_text("mine\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_an_out_that_holds_the_runs_own_inputs_is_refused_and_left_as_it_was(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = user_folder(tmp_path, run_cli)
    said = one_line(run_cli("train", "--spec", "spec.toml", "--config", "config.json", "--no-progress", "--out", "."))
    assert said.startswith("--out .: the run writes its own spec.toml there, and ")
    said = one_line(run_cli("train", "--config", "config.json", "--no-progress", "--out", "."))
    assert "config.json" in said and "--config file" in said
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_an_out_that_holds_a_users_file_the_run_writes_is_refused(tmp_path, run_cli):
    files = user_folder(tmp_path, run_cli)
    said = one_line(run_cli("train", *FAST, "--out", tmp_path))
    assert said.startswith(f"--out {tmp_path}: holds ") and "no run of cis" in said
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_a_failed_run_removes_only_the_files_it_wrote(tmp_path, run_cli):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    said = one_line(run_cli("train", "--model", tripping_model(tmp_path, "train"), "--strategy", "equal", *FAST,
                            "--out", out))
    assert said.startswith("training stopped in round 1, node ") and "boom while training" in said
    assert said.endswith(f"nothing kept (no checkpoint yet; the files it wrote removed from {out})")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


# item 9b: the round a failure while validating names


def test_a_failure_while_validating_names_the_round_that_finished(tmp_path, run_cli):
    out = tmp_path / "run"
    said = one_line(run_cli("train", "--model", tripping_model(tmp_path, "eval"), "--strategy", "equal", *FAST,
                            "--out", out))
    assert said.startswith("training stopped in round 1, validating: RuntimeError: boom while validating; ")
    assert not out.exists()


# item 10: --rates-from writes nothing before the config is checked


def test_rates_from_with_a_bad_setting_writes_nothing(tmp_path, run_cli):
    spec = tmp_path / "design.toml"
    assert run_cli("spec", "new", "-o", spec).code == 0
    measured = tmp_path / "requests.csv"
    measured.write_text("entry,node,exit,arrive_s\n" + "".join(f"device0,device0,1,{i / 10}\n" for i in range(20)))
    out = tmp_path / "run"
    said = one_line(run_cli("train", "--rates-from", measured, "--spec", spec, "--lr", "-1", *FAST, "--out", out))
    assert "lr" in said and not out.exists()
    np.savez(tmp_path / "bad.npz", x=np.zeros((50, 1, 8, 8), np.float32), y=np.arange(50) * 0.5)  # float labels
    said = one_line(run_cli("train", "--rates-from", measured, "--spec", spec, "--data", tmp_path / "bad.npz",
                            *FAST, "--out", out))
    assert "expected integer class labels" in said and not out.exists()  # found once the files were written


# item 13: metrics.jsonl's loss per exit of the multi-exit trainers


@pytest.mark.parametrize("method", ["depthfl", "reefl", "scalefl"])
def test_multi_exit_methods_record_each_exits_own_loss(tmp_path, run_cli, method):
    """After one step from the start each exit's cross-entropy is near ln 10 = 2.3; the sum of the cloud's three
    exits (~7), filed under exit 3, was what metrics.jsonl said."""
    out = tmp_path / "run"
    r = run_cli("train", "--method", method, "--serving", "60-30-10", *FAST, "--out", out)
    assert r.code == 0, r.err
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert sorted(line["loss"]) == ["1", "2", "3"]  # the cloud trains exits 1..3, the edges 1..2, devices 1
    assert all(1.5 < v < 3.5 for v in line["loss"].values()), line["loss"]


def test_a_multi_exit_trainers_exit_loss_is_each_exits_cross_entropy():
    from cis.training.run import build_setup

    s = build_setup(make_config({}, {"method": "exclusivefl", "rounds": 1, "local_steps": 2, "strategy": "equal"}))
    r = s.engine.run_round()
    (pair,) = r["pairs"]
    assert len(pair["exit_loss"]) == 3 and pair["loss"] == pytest.approx(sum(pair["exit_loss"]), rel=1e-5)
    assert all(isinstance(v, float) for v in pair["exit_loss"]) and torch.isfinite(torch.tensor(pair["loss"]))


# item 16: --model with a method that trains its own architecture


def test_a_methods_model_conflict_is_said_before_the_models_file_is_looked_for(tmp_path, run_cli):
    said = one_line(run_cli("train", "--method", "reefl", "--model", tmp_path / "missing.py:make", *FAST,
                            "--out", tmp_path / "run"))
    assert said.startswith("--model: method 'reefl' trains its own ViT")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"method": "scalefl"}))
    said = one_line(run_cli("train", "--config", cfg, "--model", tmp_path / "missing.py:make", *FAST,
                            "--out", tmp_path / "run"))
    assert said.startswith("--model: method 'scalefl'")


@pytest.mark.parametrize("inside", ["", "runs/a"])
def test_out_in_the_data_folder_is_refused_before_anything_is_written(tmp_path, run_cli, inside):
    """Found by a hunt: `--data img --out img` trained, and its files changed the data (export then said the data
    changed since the run)."""
    data = tmp_path / "img"
    (data / "cat").mkdir(parents=True)
    (data / "dog").mkdir()
    out = data / inside if inside else data
    r = run_cli("train", "--data", data, "--out", out, "--rounds", "1", "--no-progress")
    assert r.code == 2 and "the data folder" in r.err and "expected an --out outside it" in r.err
    assert sorted(p.name for p in data.iterdir()) == ["cat", "dog"]


@pytest.mark.parametrize("flag", [("--serving", "80-15-5"), ("--topology", "paper-17")])
def test_serving_or_topology_beside_a_spec_is_refused_not_recorded(tmp_path, run_cli, flag):
    """Found by a hunt: `--spec S --serving X` trained for S and recorded X in config.json."""
    spec = tmp_path / "s.toml"
    assert run_cli("spec", "new", "--topology", "paper-7", "--serving", "60-30-10", "-o", spec).code == 0
    r = run_cli("train", "--spec", spec, *flag, "--rounds", "1", "--out", tmp_path / "r", "--no-progress")
    assert r.code == 2 and f"{flag[0]} build the built-in topology's spec" in r.err
    assert not (tmp_path / "r").exists()


def test_init_with_a_new_strategy_leaves_the_runs_weights_behind(tmp_path, run_cli, one_torch_thread):
    """An explicit-weights run fine-tuned with --strategy equal: the earlier vector is not carried into a
    strategy that refuses one."""
    small = ("--rounds", "1", "--local-steps", "1", "--no-progress", "--json")
    assert run_cli("train", "--exit-weights", "1,2,3", "--out", tmp_path / "a", *small).code == 0
    r = run_cli("train", "--init", tmp_path / "a", "--strategy", "equal", "--out", tmp_path / "b", *small)
    assert r.code == 0, r.err
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["strategy"] == "equal" and config["weights"] is None


@pytest.mark.parametrize("method", ["reefl", "nefl", "flame", "depthfl"])
@pytest.mark.parametrize("shape", [(12,), (1, 8, 12), (2, 16)])
def test_other_methods_refuse_data_their_built_in_models_cannot_take(tmp_path, run_cli, method, shape):
    """Found by a hunt: token ids gave an IndexError traceback, 8x12 images a torch error in round 1."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (120, *shape)).astype(np.int64 if len(shape) == 1 else np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=rng.integers(0, 3, 120))
    r = run_cli("train", "--data", tmp_path / "d.npz", "--method", method, "--rounds", "1", "--out",
                tmp_path / "r", "--no-progress")  # fmt: skip
    assert r.code == 2 and f"--method {method}'s built-in models take square images" in r.err


@pytest.mark.parametrize("flags", [("--out", "x"), ("--resume",), ("--engine", "flower")])
def test_measure_grad_variance_refuses_flags_it_would_ignore(run_cli, flags):
    r = run_cli("train", "--measure-grad-variance", *flags)
    assert r.code == 2 and "--measure-grad-variance measures the initial model and trains nothing; drop" in r.err


@pytest.mark.parametrize("method", ["flame", "nefl"])
def test_a_diverging_run_of_the_other_trainers_stops_in_one_line(tmp_path, run_cli, method, one_torch_thread):
    """FLAME's and the nested methods' trainers compute their own loss: a NaN one stops the run there too."""
    r = run_cli("train", "--method", method, "--lr", "1e8", "--rounds", "2", "--local-steps", "3", "--out",
                tmp_path / "r", "--no-progress")  # fmt: skip
    assert r.code == 2 and "NonFiniteLoss: the training loss is nan" in r.err
