"""The examples run, and the tutorial says what they and the code do.

examples/vision (torchvision's MobileNetV3-Small cut into three exits, on a folder of drawn shapes) and
examples/text (a transformer with an exit after each encoder layer, on int64 token ids from an npz with a
node column) run end to end through their run.sh at a small scale: every step a real ``cis`` process (spec,
federated training on paper-7, export, serve --all, infer, simulate). docs/your-model.md walks the same
commands (checked against the scripts), every ``cis`` command in it parses, its model and data files build,
and its table of mistakes says what the code says.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "your-model.md"
SHAPES = ["circle", "cross", "square", "triangle"]


def run_example(name: str, out: Path, **scale: int) -> str:
    """``bash examples/NAME/run.sh OUT`` with the scale in the environment and this interpreter's ``cis`` first
    on PATH; its stdout (the commands' human summaries)."""
    env = {**os.environ, **{k: str(v) for k, v in scale.items()}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CIS_CACHE_DIR"] = str(out.parent / "cache")  # decoded image folders: not the user's ~/.cache
    done = subprocess.run(["bash", str(ROOT / "examples" / name / "run.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def check_pipeline(out: Path, stdout: str, samples: int, reference: str) -> dict:
    """What every example leaves behind: a run, a bundle, answers to every sample, a simulation."""
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert 0.0 <= summary["final_exit_accuracy"] <= 1.0 and 0.0 <= summary["cis_accuracy"] <= 1.0
    assert json.loads((out / "run" / "config.json").read_text())["model"] == reference
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert manifest["model"]["reference"] == reference and len(manifest["stages"]) == 3
    assert all((out / "bundle" / s["file"]).is_file() for s in manifest["stages"])
    nodes = json.loads((out / "serve.json").read_text())["nodes"]
    assert len(nodes) == 7 and {n["exit"] for n in nodes.values()} == {1, 2, 3}

    with open(out / "infer.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == samples and all(r["error"] == "" for r in rows)
    assert f"{samples} of {samples} samples answered; errors: none" in stdout
    accuracy = float(re.search(r"^accuracy ([\d.]+)%", stdout, re.M).group(1))
    assert 0.0 <= accuracy <= 100.0
    assert accuracy == pytest.approx(100 * np.mean([r["label"] == r["class"] for r in rows]), abs=0.01)
    served = re.search(r"^served per exit: (.*)$", stdout, re.M).group(1)
    shares = {int(e): float(p) for e, p in re.findall(r"exit (\d) ([\d.]+)%", served)}
    assert set(shares) <= {1, 2, 3} and sum(shares.values()) == pytest.approx(100.0, abs=0.2)
    by_exit = {e: sum(r["exit"] == str(e) for r in rows) / samples for e in shares}
    assert all(100 * by_exit[e] == pytest.approx(shares[e], abs=0.1) for e in shares)

    sim = json.loads((out / "sim" / "result.json").read_text())
    assert sim["requests"] == {"arrived": 1000, "served": 1000, "dropped": 0}
    assert sum(e["share"] for e in sim["exits"].values()) == pytest.approx(1.0)
    return manifest


@pytest.mark.slow
def test_the_vision_example_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    pytest.importorskip("PIL")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision not installed (pip install 'cis-inference[vision]')")
    out = tmp_path / "vision"
    stdout = run_example("vision", out, TRAIN=8, TEST=4, ROUNDS=1, LOCAL_STEPS=1)
    assert sorted(p.name for p in (out / "shapes" / "train").iterdir()) == SHAPES
    manifest = check_pipeline(out, stdout, 4 * 4, f"{ROOT / 'examples' / 'vision' / 'model.py'}:make")
    (entry,) = manifest["inputs"]
    assert entry["dtype"] == "float32" and entry["shape"] == [None, 3, 32, 32]
    assert entry["preprocessing"]["kind"] == "normalise"  # the image folder's mean and std, for raw PNGs


@pytest.mark.slow
def test_the_text_example_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    out = tmp_path / "text"
    stdout = run_example("text", out, N=240, QUERIES=30, ROUNDS=2)
    config = json.loads((out / "run" / "config.json").read_text())
    assert config["partition"] == "node"
    data = np.load(out / "data" / "topics.npz")
    assert data["x"].dtype == np.int64 and data["x"].shape == (240, 16) and set(data["node"]) <= set(range(7))
    manifest = check_pipeline(out, stdout, 30, f"{ROOT / 'examples' / 'text' / 'model.py'}:make")
    assert manifest["inputs"] == [{"name": "input", "dtype": "int64", "shape": [None, 16],
                                   "preprocessing": {"kind": "none"}, "index_range": [0, 64]}]  # its vocabulary


# ---- the tutorial ----------------------------------------------------------------------------------------


def code_blocks(path: Path, language: str = "") -> list[str]:
    """The fenced blocks of a markdown file (``language``: only those fenced as it) and its indented blocks."""
    return code_blocks_of(path.read_text(), language)


def code_blocks_of(text: str, language: str = "") -> list[str]:
    """:func:`code_blocks` of markdown text."""
    fenced = [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S) if lang == language]
    if language:
        return fenced
    unfenced = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    indented = re.findall(r"(?:^(?: {4}).*\n?)+", unfenced, re.M)
    return fenced + ["\n".join(line[4:] for line in block.splitlines()) for block in indented]


def commands(block: str) -> list[str]:
    """Its shell commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip()]


def cis_commands(path: Path) -> list[str]:
    """Every ``cis ...`` command in the file's code blocks but synopses (``[OPTIONAL]``, ``A | B``, ``...``) and
    diagrams' rows (``cis rates     cis spec update``), cut before a redirection (``> FILE``, ``&``)."""
    found = [c for b in code_blocks(path) for c in commands(b) if re.match(r"cis (-|[a-z]+( |$))", c)]
    return [re.split(r" [>&]", c)[0] for c in found if not re.search(r"\[|\||\.\.\.|\s{2,}cis ", c)]


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")
                                                 if cis_commands(p))])
def test_every_cis_command_in_the_docs_parses(doc):
    """Flags, their values' choices and the subcommands exist as written (argparse, nothing run)."""
    from cis.cli.main import build_parser

    found = cis_commands(ROOT / doc)
    assert found, doc
    parser = build_parser()
    for command in found:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:  # argparse's usage error; 0: --version or --help
            assert exc.code == 0, f"{doc}: {command!r} does not parse"


def test_the_readmes_first_screen_shows_the_two_references():
    top = (ROOT / "README.md").read_text().split("\n## Install")[0]
    assert "--model PATH.py:FACTORY" in top and "--data PATH.npz | DIR | hf:DIR | PATH.py:FACTORY" in top
    assert "examples/" in top and "docs/your-model.md" in top
    assert any("--model" in c and "--data" in c for c in cis_commands(ROOT / "README.md"))


def script_commands(name: str) -> list[str]:
    """run.sh's commands (cis, python3, the device's address) with its variables at their defaults, ``$HERE``
    the example's folder in the repo and ``$OUT`` ``cis-NAME``: as the tutorial writes them."""
    text = (ROOT / "examples" / name / "run.sh").read_text()
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text).replace('"$HERE', f'"examples/{name}').replace(
        '"$OUT', f'"cis-{name}')
    return [" ".join(shlex.split(c)) for c in commands(text) if c.startswith(("cis ", "python3 ", "DEVICE="))]


@pytest.mark.parametrize("name", ["vision", "text"])
def test_the_tutorial_walks_the_run_scripts_commands(name):
    """Each command the tutorial shows for an example is one its run.sh runs (which the tests above run)."""
    walk = TUTORIAL.read_text().split("\n## 1. ")[1].split("\n## 2. ")[0]  # section 1 walks the examples
    shown = [" ".join(shlex.split(c)) for b in code_blocks_of(walk) for c in commands(b)
             if f"cis-{name}" in c and c.startswith(("cis ", "python3 ", "DEVICE="))]
    script = script_commands(name)
    assert len(shown) >= 6, shown
    by_hand = [c for c in shown if c not in script]  # serving at the spec's addresses, from two terminals
    assert all(c == f"cis serve cis-{name}/bundle --all" or c.startswith(f"cis infer --spec cis-{name}/spec.toml")
               for c in by_hand), by_hand
    assert [c for c in script if c not in shown] == [], "the tutorial skips a step of run.sh"


def test_the_tutorials_model_and_data_files_build(tmp_path):
    """The python blocks that start ``# NAME.py`` are real files: each model factory builds a model whose
    stages chain on one batch, each data factory reads as data."""
    torch = pytest.importorskip("torch")
    from cis.training.data.loading import load_dataset
    from cis.training.models.model_ref import user_model

    files = {}
    for block in code_blocks(TUTORIAL, "python"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/.~-]+\.py", first):
            path = tmp_path / Path(first[2:]).name
            path.write_text(block)
            files[path.stem] = path
    assert {"small_cnn", "mobilenet", "my_data"} <= set(files), files
    model = user_model(f"{files['small_cnn']}:make", {"width": 8},
                       {"num_classes": 10, "num_exits": 3, "input_shape": (1, 8, 8)}, torch.float32)
    assert [tuple(t.shape) for t in model(torch.randn(2, 1, 8, 8))] == [(2, 10)] * 3
    if importlib.util.find_spec("torchvision") is not None:  # the backbone helper's example
        cut = user_model(f"{files['mobilenet']}:make", {}, {"num_classes": 4, "input_shape": (3, 32, 32)},
                         torch.float32)
        assert [tuple(t.shape) for t in cut.eval()(torch.randn(2, 3, 32, 32))] == [(2, 4)] * 3
    splits = load_dataset(f"{files['my_data']}:make")
    assert [len(s.y) for s in (splits.train, splits.val, splits.test)] == [900, 100, 200]
    assert splits.train.x.shape[1:] == (3, 64) and splits.train.classes == ["quiet", "busy"]
