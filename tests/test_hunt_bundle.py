"""A hunt of docs/bundle.md and your-model.md: a bundle's hand-edited manifest and what ``cis infer`` sends.

- A manifest field that contradicts another (bundle.md: "a hand-edited field is refused with one line naming
  the manifest and the key"): nodes and policy thresholds, measures, carries, logits, nodes tables, profiles.
  manifest.json is not in its own ``files`` table, so the sha256 check never sees such an edit.
- ``cis infer`` of token ids outside the embedding, of labels outside the classes, of uint8 pixels to a bundle
  without a normalisation: one line naming the file (and sample), exit 2, before anything is sent.
- ``check_spec_fits`` with a spec file that does not state ``classes`` (spec.md: it takes the count from the data).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cis.core.bundle import Bundle, TensorInfo, load_bundle
from cis.core.errors import BundleError, CisError
from cis.core.input_files import load_npz

NOWHERE = "tcp://127.0.0.1:9"  # nothing is sent: every case here is refused while the files are read


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("hunt_bundle"), steps=20)


def edited(demo: Path, tmp_path: Path, edit) -> Path:
    """A copy of the demo bundle with ``edit`` applied to its parsed manifest (files left as they are)."""
    root = tmp_path / "b"
    shutil.copytree(demo, root)
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def _set(path: str, value):
    """An edit setting ``m[a][b]...`` (keys split at '/', list indices as integers)."""
    keys = [int(k) if k.isdigit() else k for k in path.split("/")]

    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value

    return edit


def _pop(path: str):
    keys = [int(k) if k.isdigit() else k for k in path.split("/")]

    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m.pop(keys[-1])

    return edit


CONTRADICTIONS = {
    "policy_threshold": (_set("policy/thresholds/edge0", 0.99), "nodes['edge0'].threshold"),
    "node_threshold": (_set("nodes/device1/threshold", 0.01), "policy.thresholds['device1']"),
    "policy_measure": (_set("policy/measure", "entropy"), "policy.measure"),
    "profile_measure": (_set("profiles/measure", "margin"), "profiles.measure"),
    "carry_shape": (_set("stages/1/inputs/0/shape", [None, 1, 2, 3]), "stages[1].inputs[0]"),
    "carry_name": (_set("stages/2/inputs/0/name", "features_9"), "stages[2].inputs[0]"),
    "logits_name": (_set("stages/0/outputs/0/name", "scores"), "stages[0].outputs"),
    "node_added": (_set("nodes/ghost", {"exit": 1, "stages": [1], "threshold": 0.5}), "nodes['ghost']"),
    "node_removed": (_pop("nodes/device3"), "'device3'"),
    "node_stages": (_set("nodes/device0/stages", [1, 2]), "nodes['device0'].stages"),
    "node_exit": (_set("nodes/device0/exit", 2), "nodes['device0']"),
    "spec_node_removed": (lambda m: m["spec"]["nodes"].pop(), "nodes["),
    "policy_ghost": (_set("policy/thresholds/ghost", 0.5), "policy.thresholds['ghost']"),
    "stage_sha": (_set("stages/0/sha256", "0" * 64), "stages[0].sha256"),
    "stage_same_file": (_set("stages/1/file", "stages/stage1.onnx"), "stages[1]"),
    "profile_path": (_set("profiles/confidence", "../elsewhere.npz"), "profiles.confidence"),
    "norm_std_zero": (_set("normalisation/std", [0.0]), "normalisation.std"),
    "norm_channels": (_set("normalisation", {"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 1.0]}), "normalisation"),
    "preprocessing": (_set("inputs/0/preprocessing", {"kind": "none"}), "inputs[0].preprocessing"),
    "index_range_on_floats": (_set("inputs/0/index_range", [0, 64]), "inputs[0].index_range"),
    "model_classes": (_set("model/num_classes", 7), "model.num_classes"),
    "model_exits": (_set("model/exits", [1, 2]), "model.exits"),
    "feature_dtype": (_set("feature_dtype", "int8"), "feature_dtype"),
}


def test_the_demo_bundle_itself_loads(demo):
    bundle = load_bundle(demo)
    assert bundle.num_exits == 3 and bundle.policy is not None and bundle.spec is not None


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_a_hand_edited_field_that_contradicts_another_is_refused(demo, tmp_path, case):
    edit, key = CONTRADICTIONS[case]
    root = edited(demo, tmp_path, edit)
    with pytest.raises(BundleError) as err:
        load_bundle(root)
    line = str(err.value)
    assert line.startswith(f"{root / 'manifest.json'}: ") and key in line and "\n" not in line, line


@pytest.mark.parametrize("command", ["inspect", "simulate", "infer"])
def test_every_reader_says_the_same_line(demo, tmp_path, run_cli, command):
    from cis.core.spec import write_spec

    root = edited(demo, tmp_path, _set("policy/thresholds/edge0", 0.99))
    write_spec(load_bundle(demo).spec, tmp_path / "spec.toml")
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 1, 8, 8), np.float32))
    args = {
        "inspect": ["inspect", root],
        "simulate": ["simulate", "--spec", tmp_path / "spec.toml", "--bundle", root, "--requests", "10"],
        "infer": ["infer", "--connect", NOWHERE, "--dataset", tmp_path / "x.npz", "--bundle", root],
    }[command]
    res = run_cli(*args)
    assert res.code == 2 and "nodes['edge0'].threshold is" in res.err
    assert "policy.thresholds['edge0'] is 0.99" in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err


def test_serve_refuses_a_carry_the_next_stage_cannot_take(demo, tmp_path):
    import subprocess

    from cli_process import cis_argv

    root = edited(demo, tmp_path, _set("stages/1/inputs/0/shape", [None, 1, 2, 3]))
    res = subprocess.run(cis_argv("serve", root, "--node", "cloud", "--bind", "tcp://127.0.0.1:0"),
                         capture_output=True, text=True, timeout=60)  # before: it served, every forward failing
    assert res.returncode == 2 and "stages[1].inputs[0] is features_1 float32 [null, 1, 2, 3]" in res.stderr


# ---------------------------------------------------------------- cis infer: ids, labels, pixels


def token_bundle(tmp_path: Path, index_range="absent", classes=("a", "b", "c", "d")) -> Bundle:
    """A manifest with what the loader reads for int64 token ids (N, 16)."""
    entry = {"name": "input", "dtype": "int64", "shape": [None, 16], "preprocessing": {"kind": "none"}}
    if index_range != "absent":
        entry["index_range"] = index_range
    stage = {"index": 1, "exit": 1, "file": "stages/stage1.onnx", "outputs": [],
             "inputs": [{k: entry[k] for k in ("name", "dtype", "shape")}]}  # fmt: skip
    return Bundle(tmp_path, {"stages": [stage], "inputs": [entry], "classes": list(classes),
                             "normalisation": {"mean": None, "std": None}})  # fmt: skip


def test_negative_token_ids_are_one_line_naming_file_sample_and_value(tmp_path):
    x = np.tile(np.arange(16), (5, 1))
    x[3, 4] = -5  # ONNX's Gather reads it from the end of the embedding: a silently wrong answer
    np.savez(tmp_path / "q.npz", x=x, y=np.zeros(5, int))
    for bundle, entry in ((token_bundle(tmp_path), None), (None, TensorInfo("input", (None, 16), "int64"))):
        with pytest.raises(CisError, match=r"q\.npz: sample 3 holds -5 at position 4 of x; token ids are 0 or more"):
            load_npz(tmp_path / "q.npz", bundle, entry)
    assert load_npz(tmp_path / "q.npz", token_bundle(tmp_path, index_range=None)).x[3, 4] == -5  # none applies


def test_ids_outside_the_recorded_index_range_are_one_line(tmp_path):
    x = np.tile(np.arange(16), (4, 1))
    np.savez(tmp_path / "ok.npz", x=x)
    assert load_npz(tmp_path / "ok.npz", token_bundle(tmp_path, [0, 64])).x.dtype == np.int64
    x[2, 7] = 64
    np.savez(tmp_path / "oov.npz", x=x)
    with pytest.raises(CisError, match=r"oov\.npz: sample 2 holds 64 at position 7 of x; .* token ids 0\.\.63"):
        load_npz(tmp_path / "oov.npz", token_bundle(tmp_path, [0, 64]))


def test_a_bad_index_range_in_the_manifest_is_refused(demo, tmp_path):
    root = edited(demo, tmp_path, _set("inputs/0/index_range", [5, 2]))
    with pytest.raises(BundleError, match=r"inputs\[0\]\.index_range is \[5, 2\]"):
        load_bundle(root)


def test_labels_outside_the_bundles_classes_are_one_line(tmp_path, demo, run_cli):
    np.savez(tmp_path / "q.npz", x=np.tile(np.arange(16), (3, 1)), y=np.array([1, 10, 13]))
    with pytest.raises(CisError, match=r"q\.npz: 'y' holds labels 10, 13 \(first at sample 1\); expected the "
                                       r"bundle's 4 classes, 0\.\.3"):  # fmt: skip
        load_npz(tmp_path / "q.npz", token_bundle(tmp_path))
    np.savez(tmp_path / "neg.npz", x=np.zeros((3, 1, 8, 8), np.float32), y=np.array([0, -1, 2]))
    with pytest.raises(CisError, match=r"neg\.npz: 'y' holds labels -1 \(first at sample 1\)"):
        load_npz(tmp_path / "neg.npz")
    classes = len(load_bundle(demo).manifest["classes"])
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.array([0, classes]))
    res = run_cli("infer", "--connect", NOWHERE, "--dataset", tmp_path / "d.npz", "--bundle", demo)
    assert res.code == 2 and f"'y' holds labels {classes}" in res.err and "accuracy" not in res.err + res.out


def test_uint8_pixels_to_a_bundle_without_normalisation_say_so(tmp_path):
    stage = {"index": 1, "exit": 1, "file": "stages/stage1.onnx", "outputs": [],
             "inputs": [{"name": "input", "shape": [None, 1, 8, 8], "dtype": "float32"}]}  # fmt: skip
    px = np.zeros((2, 1, 8, 8), np.uint8)
    np.savez(tmp_path / "u.npz", x=px)
    for none in (None, []):  # what a bundle of arrays used as given records
        plain = Bundle(tmp_path, {"stages": [stage], "normalisation": {"mean": none, "std": none}})
        with pytest.raises(CisError, match=r"u\.npz: raw uint8 pixels, but the bundle .* has no pixel normalisation.*"
                                           r"expected float32 input"):  # fmt: skip
            load_npz(tmp_path / "u.npz", plain)
    zero = Bundle(tmp_path, {"stages": [stage], "normalisation": {"mean": [0.5], "std": [0.0]}})
    with pytest.raises(CisError, match=r"std > 0"):
        load_npz(tmp_path / "u.npz", zero)


# ---------------------------------------------------------------- a spec without classes


def test_a_spec_file_without_classes_fits_any_class_count(demo, tmp_path):
    import tomli_w

    from cis.core.spec import load_spec, spec_to_dict
    from cis.training.checkpoint import check_spec_fits, load_checkpoint

    model, meta, _ = load_checkpoint(demo.parent / "run")
    tables = spec_to_dict(load_bundle(demo).spec)
    del tables["cis"]["classes"]
    (tmp_path / "nok.toml").write_text(tomli_w.dumps(tables))
    three = {**meta, "classes": ["a", "b", "c"]}  # a run of 3 classes; the unstated spec parses as 10
    spec = load_spec(tmp_path / "nok.toml")
    fitted = check_spec_fits(spec, model, three, "run", source=tmp_path / "nok.toml")
    assert fitted.num_classes == 3 and fitted.ids == spec.ids
    tables["cis"]["classes"] = 10
    (tmp_path / "k10.toml").write_text(tomli_w.dumps(tables))
    with pytest.raises(CisError, match="classes is 10; the model in run has 3"):
        check_spec_fits(load_spec(tmp_path / "k10.toml"), model, three, "run", source=tmp_path / "k10.toml")


def test_a_spec_without_classes_exports_and_evaluates_the_run_it_trained(tmp_path, run_cli, one_torch_thread):
    """spec.md: a spec without `classes` takes the count from the data; export --spec and evaluate --spec refused
    it ("[cis] classes is 10; the model has 3") even for the spec that trained the run."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((240, 1, 8, 8), dtype=np.float32), y=np.arange(240) % 3)
    spec = tmp_path / "nok.toml"
    assert run_cli("spec", "new", "--topology", "paper-7", "--serving", "80-15-5", "-o", spec).code == 0
    assert "classes" not in spec.read_text()
    small = ("--rounds", "1", "--local-steps", "1", "--no-progress", "--json")
    assert run_cli("train", "--data", tmp_path / "d.npz", "--spec", spec, "--out", tmp_path / "r", *small).code == 0
    r = run_cli("export", tmp_path / "r", "--spec", spec, "--out", tmp_path / "b", "--latency-repeats", "1")
    assert r.code == 0, r.err
    r = run_cli("evaluate", tmp_path / "r", "--spec", spec, "--json")
    assert r.code == 0, r.err
