"""Mistakes around ``cis export``, ``cis evaluate``, a run's checkpoint, ``cis demo``'s rounds and a bundle's
manifest are one line and exit status 2, said before the slow part; a SIGTERM leaves no half-written bundle.

The run is the fixture's small digits model (cis.exporter.fixture_bundle, a few training steps); its bundle is
exported once, from the run's checkpoint.json given in place of the run folder."""

from __future__ import annotations

import json
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import read_until, start  # noqa: E402

from cis.core.spec import write_spec  # noqa: E402
from cis.core.topologies import make_spec  # noqa: E402


def one_line(r, *words: str) -> None:
    assert r.code == 2, (r.code, r.out, r.err)
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    for w in words:
        assert w in r.err, (w, r.err)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_run

    return make_demo_run(tmp_path_factory.mktemp("hunt-export") / "run", steps=20)


@pytest.fixture(scope="module")
def bundle(run_dir, tmp_path_factory) -> Path:
    """The run exported through the CLI, named by its checkpoint.json (the run's pair, not PyTorch's error)."""
    from cis.cli.main import main

    out = tmp_path_factory.mktemp("hunt-export-bundle") / "bundle"
    assert main(["export", str(run_dir / "checkpoint.json"), "--out", str(out), "--latency-repeats", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["run_dir"] == str(run_dir)
    return out


def edited_run(run_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of the run whose checkpoint.json is ``edit(meta)`` (its return value written back)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    meta = json.loads((copy / "checkpoint.json").read_text())
    (copy / "checkpoint.json").write_text(json.dumps(edit(meta)))
    return copy


def test_sigterm_during_export_leaves_no_temporary_folder(run_dir, tmp_path):
    out = tmp_path / "bundles" / "b"
    proc = start("export", run_dir, "--out", out, "--latency-repeats", "100000000", "--log-level", "info")
    try:
        read_until(proc.stderr, proc, "profiling latency", timeout=120)
        assert any(p.name.startswith(".b.") for p in out.parent.iterdir())  # the stage files, mid-export
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert code == 130, (code, proc.stderr.read())
    assert "cis export: interrupted" in proc.stderr.read()
    assert list(out.parent.iterdir()) == []


def test_demo_refuses_zero_rounds(run_cli, tmp_path):
    one_line(run_cli("demo", "--rounds", "0", "--out", tmp_path / "demo"), "--rounds is 0; expected an integer >= 1")
    assert not (tmp_path / "demo").exists()


def test_evaluate_refuses_a_spec_whose_classes_differ_from_the_model(run_cli, run_dir, tmp_path):
    write_spec(make_spec("paper-7", "60-30-10", num_classes=5), tmp_path / "five.toml")
    one_line(run_cli("evaluate", run_dir, "--spec", tmp_path / "five.toml"),
             "[cis] classes is 5; the model in", "has 10")


def test_evaluate_refuses_an_empty_serving(run_cli, run_dir):
    one_line(run_cli("evaluate", run_dir, "--serving", ""), "serving setting ''")


def test_evaluate_takes_either_checkpoint_file_for_its_run(run_cli, run_dir, tmp_path):
    by_pt = run_cli("evaluate", run_dir / "checkpoint.pt", "--serving", "80-15-5", "--json")
    assert by_pt.code == 0, by_pt.err
    by_json = run_cli("evaluate", run_dir / "checkpoint.json", "--serving", "80-15-5", "--json")
    assert by_json.code == 0, by_json.err
    assert by_pt.json()["cis_accuracy"] == by_json.json()["cis_accuracy"]
    (tmp_path / "notes.txt").write_text("not a run\n")
    one_line(run_cli("evaluate", tmp_path / "notes.txt"), "notes.txt: a file; expected the run folder")


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: {k: v for k, v in m.items() if k != "spec"}, ("no 'spec' in the checkpoint metadata", "--spec")),
    (lambda m: None, ("checkpoint.json: null; expected an object",)),
    (lambda m: {**m, "classes": 5}, ("checkpoint.json: classes is 5; expected a list of",)),
    (lambda m: {**m, "classes": m["classes"][:5]}, ("classes lists 5 names; the model's exits give 10 logits",)),
])
def test_evaluate_refuses_a_hand_edited_checkpoint_json(run_cli, run_dir, tmp_path, edit, words):
    one_line(run_cli("evaluate", edited_run(run_dir, tmp_path, edit)), *words)


@pytest.fixture
def no_export(monkeypatch):
    """Fails the test where the export reaches its slow part (the stages exported)."""
    import cis.exporter.bundle_writer as bw

    def exported(*_, **__):
        raise AssertionError("the export went on to export the stages")

    monkeypatch.setattr(bw, "_export_stages", exported)


def test_export_refuses_a_run_whose_classes_were_cut(run_cli, run_dir, tmp_path, no_export):
    run = edited_run(run_dir, tmp_path, lambda m: {**m, "classes": m["classes"][:5]})
    one_line(run_cli("export", run, "--out", tmp_path / "b"), "classes lists 5 names; the model's exits give 10")


@pytest.mark.parametrize(("flags", "words"), [
    (("--latency-repeats", "0"), ("--latency-repeats is 0; expected an integer >= 1",)),
    (("--latency-repeats", "-5"), ("--latency-repeats is -5; expected an integer >= 1",)),
    (("--patience", "3"), ("--patience: the run's method is 'cis'",)),
    (("--spec", "{idle}"), ("idle.toml: no node has an arrival_rate > 0",)),
    (("--out", "{file}/sub"), ("--out:", "a.txt: a file; expected a folder (for")),
])
def test_export_refuses_before_exporting(run_cli, run_dir, tmp_path, no_export, flags, words):
    spec = make_spec("paper-7", "60-30-10")
    write_spec(replace(spec, nodes=tuple(replace(n, arrival_rate=0.0) for n in spec.nodes)), tmp_path / "idle.toml")
    (tmp_path / "a.txt").write_text("a file\n")
    given = [f.format(idle=tmp_path / "idle.toml", file=tmp_path / "a.txt") for f in flags]
    out = [] if "--out" in given else ["--out", tmp_path / "b"]
    argv = ["export", run_dir, "--log-level", "warning", *given, *out]
    one_line(run_cli(*argv), *words)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: m["stages"][2].update(exit=7), ("stages[2].exit is 7; expected 3",)),
    (lambda m: m.update(classes=m["classes"][:5]), ("classes lists 5 names; stages[0] outputs 10 logits",)),
    (lambda m: m["inputs"][0].update(shape=[None, 3, 32, 32]),
     ("inputs[0] is input float32 [null, 3, 32, 32]; stages[0] takes input float32 [null, 1, 8, 8]",)),
])
def test_inspect_refuses_a_hand_edited_manifest(run_cli, bundle, tmp_path, edit, words):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    one_line(run_cli("inspect", copy), "manifest.json: ", *words)
