"""A model defined in a file outside the repo, through the command line: train (digits, paper-7; stopped and
resumed without the flags), evaluate, export, serve (real processes), infer, simulate, fine-tune with --init;
a changed file stops them in one line; every bad model input is one line, exit 2, and no run dir.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import start, started_nodes, stop  # noqa: E402

MODEL = '''
from torch import nn


def block(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.BatchNorm2d(o), nn.ReLU())


def head(c, num_classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def make(num_classes, input_shape, width=8):
    c, w = input_shape[0], width
    return [(block(c, w, 1), head(w, num_classes)), (block(w, 2 * w, 2), head(2 * w, num_classes)),
            (block(2 * w, 4 * w, 2), head(4 * w, num_classes))]


def two(num_classes, input_shape):
    return make(num_classes, input_shape)[:2]


def mismatched(num_classes, input_shape):
    first, _, last = make(num_classes, input_shape)
    return [first, (block(3, 16, 2), head(16, num_classes)), last]


def module(num_classes):
    return nn.Linear(2, num_classes)


constant = 3
'''
TRAIN = ["--dataset", "digits", "--topology", "paper-7", "--serving", "60-30-10", "--no-progress"]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The model file (outside the repo) and a run trained from it: stopped after round 2, resumed."""
    from cis.cli.main import main

    root = tmp_path_factory.mktemp("yours")
    (root / "model.py").write_text(MODEL)
    run = root / "run"
    ref = f"{root / 'model.py'}:make"
    argv = ["train", "--model", ref, "--model-arg", "width=16", *TRAIN, "--rounds", "6", "--out", str(run), "--json"]
    assert main([*argv, "--stop-after", "2"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--no-progress", "--json"]) == 0  # no --model again
    return root, run, ref


def test_the_run_dir_records_the_reference_its_arguments_and_the_files_hash(user):
    import hashlib

    root, run, ref = user
    digest = hashlib.sha256((root / "model.py").read_bytes()).hexdigest()
    config = json.loads((run / "config.json").read_text())
    assert (config["model"], config["model_args"], config["model_sha256"]) == (ref, {"width": 16}, digest)
    model = json.loads((run / "checkpoint.json").read_text())["model"]
    assert model == {"reference": ref, "args": {"width": 16, "num_classes": 10, "input_shape": [1, 8, 8]},
                     "sha256": digest, "input_shape": [1, 8, 8], "input_dtype": "float32"}
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [ln["round"] for ln in lines] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["final_exit_accuracy"] > 0.5


def test_train_export_serve_infer_simulate(user, run_cli, tmp_path):
    root, run, _ = user
    ev = run_cli("evaluate", run, "--json")
    assert ev.code == 0, ev.err
    exported = run_cli("export", run, "--out", tmp_path / "bundle", "--latency-repeats", "2", "--json")
    assert exported.code == 0, exported.err
    assert exported.json()["verification"]["passed"]
    from cis.training.data.loading import load_dataset

    test = load_dataset("digits").test
    np.savez(tmp_path / "test.npz", x=test.x[:120], y=test.y[:120])
    proc = start("serve", tmp_path / "bundle", "--all", "--free-ports", "--json")
    try:
        nodes = started_nodes(proc)
        device = next(nid for nid in nodes if nid.startswith("device"))
        sent = run_cli("infer", "--connect", nodes[device]["address"], "--dataset", tmp_path / "test.npz",
                       "--bundle", tmp_path / "bundle", "--json")
        assert sent.code == 0, sent.err
        got = sent.json()
        assert got["samples_answered"] == 120 and got["errors"] == {} and got["accuracy"] > 0.4
    finally:
        stop(proc)
    sim = run_cli("simulate", "--spec", run / "spec.toml", "--bundle", tmp_path / "bundle", "--requests", 300,
                  "--json")
    assert sim.code == 0, sim.err
    data = sim.json()
    assert data["requests"] == {"arrived": 300, "served": 300, "dropped": 0} and set(data["exits"]) == {"1", "2", "3"}


def test_init_rebuilds_the_model_from_the_run(user, run_cli, tmp_path):
    _, run, ref = user
    done = run_cli("train", "--init", run, "--rounds", "1", "--out", tmp_path / "tuned", "--no-progress", "--json")
    assert done.code == 0, done.err
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["model"] == ref


def test_a_model_file_changed_since_the_run_is_one_line(user, run_cli, tmp_path):
    root, run, _ = user
    original = (root / "model.py").read_text()
    try:
        (root / "model.py").write_text(original + "\n# changed\n")
        for argv in (["evaluate", run], ["export", run, "--out", tmp_path / "b"],
                     ["train", "--out", run, "--resume"], ["train", "--init", run, "--out", tmp_path / "t"]):
            r = run_cli(*argv, "--log-level", "warning")  # export's progress lines are info
            assert r.code == 2 and r.err.count("\n") == 1 and "changed since the run" in r.err, (argv, r.err)
        assert not (tmp_path / "b").exists() and not (tmp_path / "t").exists()
        ok = run_cli("evaluate", run, "--allow-model-change", "--json")
        assert ok.code == 0 and "changed since the run" in ok.err
    finally:
        (root / "model.py").write_text(original)


@pytest.mark.parametrize("factory, args, message", [
    ("nowhere.py:make", [], "file .*nowhere.py not found"),
    ("model.py:absent", [], "has no 'absent'; expected a callable of that name"),
    ("model.py:constant", [], ":constant is a int; expected a callable"),
    ("model.py:module", [], "returned a Linear \\(one torch module\\); expected a list of \\(body, head\\) pairs"),
    ("model.py:two", [], "the factory returned 2 stages; the spec has 3 exits"),
    ("model.py:mismatched", [], "stage 2's body cannot take stage 1's body output of shape \\(2, 8, 8, 8\\)"),
    ("model.py:make", ["--model-arg", "depth=3"], "no argument 'depth'; it takes num_classes, input_shape, width"),
    ("model.py:make", ["--method", "reefl"], "method 'reefl' trains its own ViT"),
    ("model.py:make", ["--weights", "0.6,0.3,0.1"], "explicit exit weights are --exit-weights 0.6,0.3,0.1"),
])
def test_bad_model_inputs_are_one_line_exit_2_and_no_run_dir(user, run_cli, tmp_path, factory, args, message):
    root, _, _ = user
    ref = factory if factory.startswith("nowhere") else f"{root / factory}"
    r = run_cli("train", "--model", ref, *args, *TRAIN, "--rounds", "1", "--out", tmp_path / "run", "--log-level",
                "warning")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    import re

    assert re.search(message, r.err), r.err
    assert not (tmp_path / "run").exists()


def test_weights_start_a_run_and_its_resume_needs_the_file_no_more(user, run_cli, tmp_path):
    import torch

    _, run, ref = user
    state = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    torch.save({k: v for k, v in state.items() if not k.startswith("stage_list.2.head.")}, tmp_path / "start.pt")
    out = tmp_path / "warm"
    first = run_cli("train", "--model", ref, "--model-arg", "width=16", "--weights", tmp_path / "start.pt", *TRAIN,
                    "--rounds", "2", "--stop-after", "1", "--out", out)
    assert first.code == 0, first.err
    assert "loaded 25 of the model's 27 tensors" in first.err and "missing 2" in first.err
    (tmp_path / "start.pt").unlink()
    again = run_cli("train", "--out", out, "--resume", "--no-progress", "--json")
    assert again.code == 0, again.err
    assert json.loads((out / "config.json").read_text())["weights_file"] == str(tmp_path / "start.pt")


def test_a_token_id_model_goes_train_export_serve_infer_on_an_int_npz(run_cli, tmp_path):
    """int64 token ids (N, L) from a .npz, a small transformer with exits between its encoder layers."""
    from test_your_model import TOKENS

    (tmp_path / "tokens.py").write_text(TOKENS)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 16, (420, 6))
    np.savez(tmp_path / "tokens.npz", x=x, y=x[:, 0] % 4)  # the first token decides the class
    np.savez(tmp_path / "send.npz", x=x[:40].astype(np.int32), y=x[:40, 0] % 4)
    trained = run_cli("train", "--model", f"{tmp_path / 'tokens.py'}:make", "--data", tmp_path / "tokens.npz",
                      "--serving", "60-30-10", "--rounds", "2", "--out", tmp_path / "run", "--no-progress", "--json")
    assert trained.code == 0, trained.err
    exported = run_cli("export", tmp_path / "run", "--out", tmp_path / "bundle", "--latency-repeats", "1", "--json")
    assert exported.code == 0, exported.err
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["inputs"][0]["dtype"] == "int64" and manifest["inputs"][0]["shape"] == [None, 6]
    proc = start("serve", tmp_path / "bundle", "--all", "--free-ports", "--json")
    try:
        nodes = started_nodes(proc)
        sent = run_cli("infer", "--connect", nodes["device0"]["address"], "--dataset", tmp_path / "send.npz",
                       "--bundle", tmp_path / "bundle", "--json")
        assert sent.code == 0, sent.err
        assert sent.json()["samples_answered"] == 40 and sent.json()["errors"] == {}
    finally:
        stop(proc)
