"""docs/your-model.md's table of mistakes says what the code says: each row's line, its ``...`` standing for a
path or a detail (and 12 hex digits for any sha256 prefix), is the whole error line that the command gives for
that mistake, with exit status 2 and nothing written: ``cis train`` before any run dir, and on a tiny trained
run ``cis evaluate`` (a changed model file or data), ``cis export`` (a stage ONNX cannot express) and
``cis infer`` (an input the bundle's entry stage does not take).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TEXT_MODEL = ROOT / "examples" / "text" / "model.py"

BAD = '''
import sys

import numpy as np
from torch import nn

sys.path.insert(0, {folder!r})
import model as m  # noqa: E402


def two(num_classes, input_shape):
    return m.make(num_classes, input_shape)[:2]


def one(num_classes):
    return nn.Linear(2, num_classes)


def wrong(num_classes, input_shape):
    s = m.make(num_classes, input_shape)
    return [s[0], (nn.Sequential(nn.Flatten(), nn.Linear(7, 32)), s[1][1]), s[2]]


def heads(num_classes, input_shape):
    s = m.make(num_classes, input_shape)
    return [(s[0][0], nn.Linear(32, 3)), s[1], s[2]]


def boom(num_classes, input_shape):
    raise ValueError("no GPU here")


def needs(num_classes, input_shape, depth):
    return m.make(num_classes, input_shape)


def data_int():
    return 7


def data_dict():
    return {{"train": [(1, 2)]}}


def data_ragged():
    good = [(np.arange(4), i % 2) for i in range(20)]
    return {{"train": good, "test": [good[0], (np.arange(3), 1)]}}


class Fails(nn.Module):
    def forward(self, h):
        if self.training:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return h


def fails(num_classes, input_shape):
    s = m.make(num_classes, input_shape)
    return [(nn.Sequential(s[0][0], Fails()), s[0][1]), s[1], s[2]]


answer = 42
'''


def documented() -> dict[str, str]:
    """The table's rows: mistake -> the line it documents."""
    text = (ROOT / "docs" / "your-model.md").read_text().split("## 13. Mistakes")[1]
    return dict(re.findall(r"^\| ([^|*][^|]*?) \| `(.+)` \|$", text, re.M))


def pattern(line: str) -> str:
    """The documented line as a regex: ``...`` any text, 12 hex digits any sha256 prefix."""
    return ".*".join(re.sub(r"[0-9a-f]{12}", "[0-9a-f]{12}", re.escape(part)) for part in line.split("..."))


def said(r, command: str) -> str:
    """The one error line of a failed command, without its ``cis COMMAND: error:`` prefix."""
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    return r.err.strip().removeprefix(f"cis {command}: error: ")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The files the rows name: bad.py and broken.py beside the text example's model, and the npz files."""
    d = tmp_path_factory.mktemp("mistakes")
    (d / "bad.py").write_text(BAD.format(folder=str(TEXT_MODEL.parent)))
    (d / "broken.py").write_text("def make(:\n")
    rng = np.random.default_rng(0)
    x, y = rng.integers(30, 64, (300, 16)), rng.integers(0, 4, 300)

    def npz(name, **arrays):
        np.savez(d / name, **{"x": x, "y": y, **arrays})

    npz("ok.npz")
    npz("negative.npz", y=np.where(np.arange(300) == 3, -1, y))
    npz("labels.npz", y=np.where(np.arange(300) == 3, 9, y), classes=np.array(list("abcd")))
    npz("stray.npz", y=np.where(np.arange(300) == 3, 9, y))
    npz("skip.npz", y=np.where(y == 1, 2, y))
    npz("floats.npz", y=y.astype(np.float64))
    npz("oov.npz", x=np.where(np.arange(300 * 16).reshape(300, 16) == 7 * 16 + 2, 64, x))
    from cis.core.spec import write_spec
    from cis.core.topologies import make_spec

    write_spec(make_spec("paper-7", "60-30-10", num_classes=4), d / "spec4.toml")
    npz("lengths.npz", y=y[:299])
    floats = rng.normal(size=(300, 16)).astype(np.float32)
    floats[5, 0] = np.nan
    npz("nan.npz", x=floats)
    npz("one.npz", y=np.zeros(300, np.int64))
    npz("split.npz", split=np.array(["train"] * 200 + ["dev"] * 100))
    npz("few.npz", x=x[:8], y=y[:8])
    npz("nonode.npz")
    npz("nodeout.npz", node=np.arange(300) % 9)
    npz("nodeempty.npz", node=np.arange(300) % 6)
    torch.save({"stage_list.0.head.fc.weight": torch.zeros(3, 32)}, d / "shape.pt")
    torch.save({"foo.bar": torch.zeros(2)}, d / "nofit.pt")
    torch.save({"model.backbone.stage_list.0.head.fc.weight": torch.zeros(4, 32),
                "model.backbone.stage_list.0.head.fc.bias": torch.zeros(4)}, d / "wrapped.pt")
    from PIL import Image

    (d / "photos" / "cat").mkdir(parents=True)
    for j in range(3):
        Image.fromarray(np.full((8, 8), j, np.uint8), "L").save(d / "photos" / "cat" / f"{j}.png")
    return d


MODEL = f"{TEXT_MODEL}:make"
CASES = {  # the table's mistake -> cis train's flags (in the files' folder; the model: the text example's)
    "no `:` in `--model`": ["--model", "model.py"],
    "a file that is not there": ["--model", "nowhere.py:make"],
    "a file that does not import": ["--model", "{d}/broken.py:make"],
    "a module that does not import": ["--model", "nopkg.models:make"],
    "no such name": ["--model", f"{TEXT_MODEL}:absent"],
    "a name that is not callable": ["--model", "{d}/bad.py:answer"],
    "a `--model-arg` the factory does not take": ["--model", MODEL, "--model-arg", "depth=3"],
    "a `--model-arg` of the wrong kind": ["--model", MODEL, "--model-arg", "dim=abc"],
    "a parameter nothing gives": ["--model", "{d}/bad.py:needs"],
    "a `--model-arg` without `=`": ["--model", MODEL, "--model-arg", "vocab"],
    "the factory raises": ["--model", "{d}/bad.py:boom"],
    "the factory returns something else": ["--model", "{d}/bad.py:one"],
    "stage count differs from the spec's exits": ["--model", "{d}/bad.py:two"],
    "a body cannot take the previous body's output": ["--model", "{d}/bad.py:wrong"],
    "a head's logits are not (N, num_classes)": ["--model", "{d}/bad.py:heads"],
    "a method with its own architecture": ["--model", MODEL, "--method", "nefl"],
    "a data file that is not there": ["--data", "{d}/nothere.npz"],
    "a label outside the classes": ["--data", "{d}/labels.npz"],
    "a stray label, the spec saying the classes": ["--data", "{d}/stray.npz", "--spec", "{d}/spec4.toml"],
    "a stray label, nothing saying the classes": ["--data", "{d}/stray.npz"],
    "labels that skip a class": ["--data", "{d}/skip.npz"],
    "float labels": ["--data", "{d}/floats.npz"],
    "a token id outside the model's embedding": ["--data", "{d}/oov.npz"],
    "a data factory's sample of another shape": ["--data", "{d}/bad.py:data_ragged"],
    "a negative label": ["--data", "{d}/negative.npz"],
    "x and y of different lengths": ["--data", "{d}/lengths.npz"],
    "NaN or inf in x": ["--data", "{d}/nan.npz"],
    "one class only": ["--data", "{d}/one.npz"],
    "an image folder with one class": ["--data", "{d}/photos"],
    "an unknown split value": ["--data", "{d}/split.npz"],
    "a data factory that is not callable": ["--data", "{d}/bad.py:answer"],
    "a data factory that returns something else": ["--data", "{d}/bad.py:data_int"],
    "a dict without train and test": ["--data", "{d}/bad.py:data_dict"],
    "the model or the data fails mid-run": ["--model", "{d}/bad.py:fails"],
    "fewer training samples than nodes": ["--data", "{d}/few.npz"],
    "`--partition node` without a node column": ["--data", "{d}/nonode.npz", "--partition", "node"],
    "a node value outside the spec": ["--data", "{d}/nodeout.npz", "--partition", "node"],
    "a node left without samples": ["--data", "{d}/nodeempty.npz", "--partition", "node"],
    "`--centralised` with a partition option": ["--centralised", "--dirichlet", "0.5"],
    "no such file": ["--weights", "nothere.pt"],
    "exit weights given to `--weights`": ["--weights", "0.6,0.3,0.1"],
    "a tensor of another shape": ["--weights", "{d}/shape.pt"],
    "no name fits": ["--weights", "{d}/nofit.pt"],
    "no name fits but for a wrapper's prefix": ["--weights", "{d}/wrapped.pt"],
    "a `--weights-prefix` no name starts with": ["--weights", "{d}/wrapped.pt", "--weights-prefix", "encoder."],
}


AFTER_A_RUN = {"the model file changed", "the data changed", "a stage ONNX cannot express",
               "`cis infer` of a dtype the entry stage does not take", "`cis infer` of another sample shape"}


def test_every_row_of_the_table_is_a_case_here():
    assert set(documented()) == set(CASES) | AFTER_A_RUN


@pytest.mark.parametrize("mistake", list(CASES))
def test_the_documented_line_is_the_line(files, run_cli, monkeypatch, tmp_path, mistake):
    monkeypatch.chdir(files)
    flags = [a.format(d=files) for a in CASES[mistake]]
    if "--model" not in flags:
        flags = ["--model", MODEL, *flags]
    if "--data" not in flags:
        flags += ["--data", files / "ok.npz"]
    out = tmp_path / "run"
    serving = [] if "--spec" in flags else ["--serving", "60-30-10"]  # a spec decides the serving rates itself
    r = run_cli("train", *flags, *serving, "--rounds", "1", "--no-progress", "--out", out, "--log-level", "warning")
    assert not out.exists()
    assert re.fullmatch(pattern(documented()[mistake]), said(r, "train")), (documented()[mistake], r.err)


CUMMAX = """
import torch
from torch import nn

from model import make as text_model


class Cummax(nn.Module):
    def forward(self, h):
        return torch.cummax(h, dim=1).values


def make(num_classes, input_shape):
    first, (body, head), last = text_model(num_classes, input_shape)
    return [first, (nn.Sequential(body, Cummax()), head), last]
"""


def test_after_a_run_the_documented_lines_are_the_lines(files, run_cli, monkeypatch):
    """A model file or data changed since the run, a stage ONNX cannot express, infer of the wrong input."""
    monkeypatch.chdir(files)
    (files / "model.py").write_text(TEXT_MODEL.read_text())
    (files / "cummax.py").write_text(CUMMAX)
    (files / "topics.npz").write_bytes((files / "ok.npz").read_bytes())
    train = ["--serving", "60-30-10", "--rounds", "1", "--local-steps", "1", "--no-progress", "--json"]
    for model, out in (("model.py:make", "run"), ("cummax.py:make", "cummax-run")):
        done = run_cli("train", "--model", files / model, "--data", files / "topics.npz", *train, "--out", out)
        assert done.code == 0, done.err
    row = documented()
    quiet = ("--log-level", "warning")

    r = run_cli("export", "cummax-run", "--out", "cummax-bundle", *quiet)
    assert re.fullmatch(pattern(row["a stage ONNX cannot express"]), said(r, "export")) and r.out == ""
    assert not (files / "cummax-bundle").exists()

    exported = run_cli("export", "run", "--out", "bundle", "--latency-repeats", "1", "--json", *quiet)
    assert exported.code == 0, exported.err
    np.savez("queries.npz", x=np.zeros((4, 16), np.float32))
    r = run_cli("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "queries.npz", "--bundle", "bundle")
    assert re.fullmatch(pattern(row["`cis infer` of a dtype the entry stage does not take"]), said(r, "infer"))
    np.savez("queries.npz", x=np.zeros((4, 12), np.int64))
    r = run_cli("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "queries.npz", "--bundle", "bundle")
    assert re.fullmatch(pattern(row["`cis infer` of another sample shape"]), said(r, "infer"))

    source = (files / "model.py").read_text()
    (files / "model.py").write_text(source + "\n# changed\n")
    r = run_cli("evaluate", "run")
    assert re.fullmatch(pattern(row["the model file changed"]), said(r, "evaluate")), r.err
    (files / "model.py").write_text(source)
    np.savez(files / "topics.npz", x=np.zeros((300, 16), np.int64), y=np.arange(300) % 4)
    r = run_cli("evaluate", files / "run")
    assert re.fullmatch(pattern(row["the data changed"]), said(r, "evaluate")), r.err
