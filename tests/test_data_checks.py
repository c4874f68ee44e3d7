"""Data checked before training, naming the sample (issue 43 items 1-2).

Every sample's label, dtype, shape and, where the model declares one (its input embedding), index range is
checked before the first step, and a fault names the sample as the user knows it (its row in the npz, or
``train sample 5`` of a factory's parts); an error that still happens while training is one line, exit 2, and
leaves no run dir that ``--resume`` would take for a run. The class count comes from the data's class names,
else the spec's ``classes``, else the largest label; a stray label, labels that skip a class and float labels
are one line; ``cis spec new --data REF`` takes the count from the data, and a spec without ``classes`` takes
it from the data it trains on.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from cis.core.errors import CisError  # noqa: E402
from cis.training.data.loading import load_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT_MODEL = f"{ROOT / 'examples' / 'text' / 'model.py'}:make"  # vocab 64 by default
TRAIN = ("--serving", "60-30-10", "--rounds", "1", "--local-steps", "1", "--no-progress", "--log-level", "warning")
WITH_SPEC = TRAIN[2:]  # a spec decides the serving rates itself: --serving beside it is refused


def ids(n: int = 300, seed: int = 0, classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(30, 64, (n, 16)), rng.integers(0, classes, n)


def error(r, command: str = "train") -> str:
    assert r.code == 2 and r.err.count("\n") == 1, (r.code, r.err)
    return r.err.strip().removeprefix(f"cis {command}: error: ")


@pytest.mark.parametrize("row", [217, 3])  # 217: a training sample, 3: a test sample (seed 0's split)
def test_a_token_id_outside_the_embedding_names_its_sample_before_anything_trains(tmp_path, run_cli, row):
    x, y = ids()
    x[row, 5] = 64
    np.savez(tmp_path / "oov.npz", x=x, y=y)
    out = tmp_path / "run"
    r = run_cli("train", "--model", TEXT_MODEL, "--data", tmp_path / "oov.npz", *TRAIN, "--out", out)
    assert error(r) == (
        f"data {tmp_path / 'oov.npz'}: sample {row} holds 64 at position 5 of x; the model's embedding "
        "stage_list.0.body.0.token (num_embeddings 64) takes 0..63"
    )
    assert not out.exists()


FACTORY = '''
import numpy as np


class Part:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def good(n):
    return [(np.arange(4, dtype=np.int64) + i, i % 2) for i in range(n)]


def dtype():
    test = good(4)
    test[2] = (np.zeros(4, np.float32), 0)
    return Part(good(20)), Part(good(4)), Part(test)


def onehot():
    items = good(12)
    items[3] = (items[3][0], np.eye(2, dtype=np.int64)[1])
    return Part(items)


def shape():
    items = good(12)
    items[7] = (np.zeros(5, np.int64), 1)
    return {"train": Part(items), "test": Part(good(4))}
'''


def test_a_factory_sample_of_another_dtype_shape_or_label_is_named(tmp_path):
    (tmp_path / "parts.py").write_text(FACTORY)
    cases = {
        "dtype": "test sample 2's x is float32 (4,), test sample 0's int64 (4,); expected one shape and dtype",
        "onehot": "sample 3's label is int64 (2,) (2 values); expected one integer class label",
        "shape": "train sample 7's x is int64 (5,), train sample 0's int64 (4,); expected one shape and dtype",
    }
    for name, said in cases.items():
        ref = f"{tmp_path / 'parts.py'}:{name}"
        with pytest.raises(CisError) as got:
            load_dataset(ref)
        assert str(got.value) == f"data {ref}: {said}"


def test_the_sample_named_after_the_split_is_the_users_row(tmp_path):
    x, y = ids()
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    s = load_dataset(str(tmp_path / "ok.npz"), seed=0)
    for part in (s.train, s.val, s.test):
        i = len(part) // 2
        row = int(part.sample_name(i).removeprefix("sample "))
        assert np.array_equal(x[row], part.x[i]) and y[row] == part.y[i]


FAILING = '''
import sys

from torch import nn

sys.path.insert(0, {folder!r})
import model as text  # noqa: E402

CALLS = {{"n": 0}}


class FailsWhileTraining(nn.Module):
    """Passes its input through; in training mode its {fail_at}th call raises (after a checkpoint or not)."""

    def forward(self, h):
        if self.training:
            CALLS["n"] += 1
            if CALLS["n"] >= {fail_at}:
                raise RuntimeError("CUDA error: device-side assert triggered")
        return h


def make(num_classes, input_shape):
    stages = text.make(num_classes, input_shape)
    body, head = stages[0]
    return [(nn.Sequential(body, FailsWhileTraining()), head), *stages[1:]]
'''


@pytest.mark.parametrize("fail_at, round_, kept", [(1, 1, None), (8, 2, 1)])
def test_an_error_while_training_is_one_line_and_leaves_no_run_resume_would_trust(
    tmp_path, run_cli, fail_at, round_, kept
):
    """7 nodes train once per round: the 1st call fails in round 1 (no checkpoint yet: nothing is left), the 8th
    in round 2 (round 1's checkpoint stays, a round that finished)."""
    (tmp_path / "fails.py").write_text(FAILING.format(folder=str(ROOT / "examples" / "text"), fail_at=fail_at))
    x, y = ids()
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    out = tmp_path / "run"
    r = run_cli("train", "--model", f"{tmp_path / 'fails.py'}:make", "--data", tmp_path / "ok.npz", *TRAIN,
                "--rounds", "3", "--out", out)
    said = error(r)
    assert said.startswith(f"training stopped in round {round_}, node cloud training exit 3: RuntimeError: CUDA "
                           "error: device-side assert triggered; ")  # the cloud trains first in each round
    if kept is None:
        assert said.endswith(f"nothing kept (no checkpoint yet; {out} removed)") and not out.exists()
    else:
        assert said.endswith(f"{out} keeps round 1's checkpoint ('cis train --out {out} --resume' continues from it)")
        assert json.loads((out / "checkpoint.json").read_text())["round"] == 1


def labelled(tmp_path: Path, name: str, y: np.ndarray, **arrays) -> Path:
    x, _ = ids(len(y))
    np.savez(tmp_path / name, x=x, y=y, **arrays)
    return tmp_path / name


def three_classes(n: int = 300) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 3, n)


def test_a_stray_label_is_named_with_a_spec_and_without(tmp_path, run_cli):
    y = three_classes()
    y[17] = 9
    data = labelled(tmp_path, "stray.npz", y)
    assert run_cli("spec", "new", "--serving", "60-30-10", "--classes", "3", "-o", tmp_path / "s3.toml").code == 0
    r = run_cli("train", "--model", TEXT_MODEL, "--data", data, *WITH_SPEC, "--spec", tmp_path / "s3.toml",
                "--out", tmp_path / "a")
    assert error(r) == f"data {data}: sample 17 has label 9; expected labels 0..2 (the spec's classes = 3)"
    r = run_cli("train", "--model", TEXT_MODEL, "--data", data, *TRAIN, "--out", tmp_path / "b")
    assert error(r) == (
        f"data {data}: no sample has label 3, 4, 5, 6, 7, 8, yet sample 17 has label 9 (so 10 classes); expected "
        "labels 0..K-1 with a sample of each, or K said: class names (an npz 'classes' array) or a spec's [cis] "
        "classes"
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_labels_that_skip_a_class_or_are_floats_are_one_line(tmp_path):
    gap = labelled(tmp_path, "gap.npz", np.where(three_classes() == 1, 2, three_classes()))
    with pytest.raises(CisError, match=r"no sample has label 1, yet sample \d+ has label 2 \(so 3 classes\)"):
        load_dataset(str(gap))
    floats = labelled(tmp_path, "floats.npz", three_classes().astype(np.float64))
    first = float(three_classes()[0])
    with pytest.raises(CisError) as got:
        load_dataset(str(floats))
    assert str(got.value) == (
        f"data {floats}: y has dtype float64 (sample 0's label is {first!r}); expected integer class labels 0..K-1 "
        "(y.astype(int) where the values are classes)"
    )


def test_a_class_without_samples_is_a_warning_where_the_count_is_said(tmp_path, caplog):
    named = labelled(tmp_path, "named.npz", np.where(three_classes() == 1, 2, three_classes()),
                     classes=np.array(["a", "b", "c"]))
    with caplog.at_level(logging.WARNING, logger="cis.training.data.dataset"):
        s = load_dataset(str(named))
    assert s.train.classes == ["a", "b", "c"]
    assert "no sample has label 1 of the 3 classes (the data's 3 class names)" in caplog.text
    spec_said = load_dataset(str(labelled(tmp_path, "four.npz", three_classes())), num_classes=4)
    assert spec_said.train.num_classes == 4


def test_spec_new_takes_the_classes_from_the_data_and_a_spec_without_them_from_the_run(tmp_path, run_cli):
    data = labelled(tmp_path, "three.npz", three_classes())
    r = run_cli("spec", "new", "--serving", "60-30-10", "--data", data, "-o", tmp_path / "from-data.toml")
    assert r.code == 0 and "3 classes from" in r.out
    assert "classes = 3" in (tmp_path / "from-data.toml").read_text()
    r = run_cli("spec", "new", "--serving", "60-30-10", "-o", tmp_path / "plain.toml")
    assert r.code == 0 and "classes" not in (tmp_path / "plain.toml").read_text()
    r = run_cli("train", "--model", TEXT_MODEL, "--data", data, *WITH_SPEC, "--spec", tmp_path / "plain.toml",
                "--out", tmp_path / "run", "--json")
    assert r.code == 0, r.err
    assert "classes = 3" in (tmp_path / "run" / "spec.toml").read_text()
    r = run_cli("spec", "new", "--serving", "60-30-10", "--data", data, "--classes", "3")
    assert r.code == 2 and "not allowed with argument" in r.err
