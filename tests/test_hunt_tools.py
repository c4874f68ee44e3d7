"""Bad input to the tools around a bundle is one line and exit status 2: ``cis rates`` on a requests file,
``cis report``, ``cis keys``, ``cis simulate``, ``cis inspect`` and bundle loading, ``cis deploy``.

No torch: the bundle here has the manifest and profiles of a real one and placeholder stage files (nothing
opens them), and the requests files are written by hand."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cis.core.bundle import load_bundle, write_manifest, write_profiles
from cis.core.errors import BundleError, CisError
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.spec import CisSpec, Node, spec_to_dict, validate, write_spec
from cis.core.topologies import make_spec

HEADER = "id,entry,node,exit,outcome,arrive_s\n"


def one_line(r, *words: str) -> None:
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    for w in words:
        assert w in r.err, (w, r.err)


def chain_spec(tmp_path: Path) -> Path:
    spec = validate(CisSpec((
        Node("root", 3), Node("mid", 2, parent="root", max_transfer_rate=1.0),
        Node("leaf", 1, parent="mid", arrival_rate=4.0, max_transfer_rate=2.0),
    ), 3, name="chain"))
    write_spec(spec, tmp_path / "chain.toml")
    return tmp_path / "chain.toml"


def placeholder_bundle(root: Path) -> Path:
    """paper-7, three stages: a real manifest and profiles, stage files nobody opens."""
    spec = make_spec("paper-7", "60-30-10", num_classes=3)
    (root / "stages").mkdir(parents=True)
    stages = []
    for k in (1, 2, 3):
        (root / "stages" / f"stage{k}.onnx").write_bytes(b"placeholder")
        carry = [{"name": f"features_{k}", "shape": [None, 6], "dtype": "float32"}] if k < 3 else []
        stages.append({
            "index": k, "exit": k, "file": f"stages/stage{k}.onnx", "flops": 10, "params": 5, "bytes": 11,
            "inputs": [{"name": "input" if k == 1 else f"features_{k - 1}", "shape": [None, 6], "dtype": "float32"}],
            "outputs": [{"name": "logits", "shape": [None, 3], "dtype": "float32"}, *carry],
        })
    policy = ExitPolicy("max_softmax", {n.id: (-np.inf if n.parent is None else 0.5) for n in spec.nodes})
    nodes = {n.id: {"exit": n.exit, "stages": list(range(1, n.exit + 1)), "threshold": 0.5} for n in spec.nodes}
    write_profiles(root, np.full((4, 3), 0.5), np.ones((4, 3), bool), {k: {1: 1e-4, 8: 2e-4} for k in (1, 2, 3)})
    write_manifest(root, {"method": "cis", "stages": stages, "nodes": nodes, "policy": policy.to_json(),
                          "spec": spec_to_dict(spec), "feature_dtype": "fp32"})
    return root


@pytest.fixture
def bundle(tmp_path) -> Path:
    return placeholder_bundle(tmp_path / "bundle")


def edit_manifest(bundle: Path, edit) -> Path:
    path = bundle / "manifest.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps(edit(m) or m))
    return path


# ---------------------------------------------------------------- cis rates: requests files


@pytest.mark.parametrize(
    "rows, words",
    [
        ("0,leaf,leaf,1,served,0.0\n1,leaf,mid,x,served,1.0\n", ("row 3, column 'exit'", "'x'", "an integer")),
        ("0,leaf,leaf,1,served,0.0\n1,leaf,mid,2,served,abc\n", ("row 3, column 'arrive_s'", "'abc'", "seconds")),
        ("0,leaf,leaf,1,served,0.0\n1,leaf,mid\n", ("row 3", "no cell in column 'exit'")),
        ("0,leaf,leaf,1,served,0.0,7\n1,leaf,mid,2,served,1.0\n", ("row 2", "more than the header's 6 columns")),
    ],
)
def test_a_bad_cell_in_a_requests_file_is_one_line_naming_row_and_column(tmp_path, run_cli, rows, words):
    f = tmp_path / "requests.csv"
    f.write_text(HEADER + rows)
    one_line(run_cli("rates", chain_spec(tmp_path), "--measured", f), str(f), *words)


def test_a_window_longer_than_the_requests_file_is_refused(tmp_path, run_cli):
    f = tmp_path / "requests.csv"
    f.write_text(HEADER + "0,leaf,leaf,1,served,1.0\n1,leaf,mid,2,served,3.0\n2,leaf,root,3,served,5.0\n")
    spec = chain_spec(tmp_path)
    one_line(run_cli("rates", spec, "--measured", f, "--window", "10"), "--window 10 is longer", "span (4 s")
    r = run_cli("rates", spec, "--measured", f, "--window", "4", "--json")
    assert r.code == 0 and r.json()["measurement"]["seconds"] == 4.0
    assert r.json()["exits"]["1"]["measured"]["serving_rate"] == 0.25  # 1 request in 4 s, not in 10


# ---------------------------------------------------------------- cis report


def run_dir(tmp_path: Path, text: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    return run


ROUND = '{"round": %d, "loss": {"1": 0.5}, "val_cis_accuracy": 0.5, "seconds": 1.0}\n'


def test_report_skips_a_last_metrics_line_cut_short_with_a_warning(tmp_path, run_cli):
    run = run_dir(tmp_path, ROUND % 1 + ROUND % 2 + '{"round": 3, "loss": {"1"')
    r = run_cli("report", run, "--json")
    assert r.code == 0, r.err
    assert r.json()["run"]["rounds_done"] == 2
    assert "metrics.jsonl:3: skipped the last line, cut short" in r.err


def test_report_on_a_bad_metrics_line_before_the_last_is_one_line(tmp_path, run_cli):
    run = run_dir(tmp_path, ROUND % 1 + '{"round": 2, "lo\n' + ROUND % 3)
    one_line(run_cli("report", run), "metrics.jsonl:2: not JSON")
    (run / "metrics.jsonl").write_text(ROUND % 1 + "[1, 2]\n")
    one_line(run_cli("report", run), "metrics.jsonl:2: a JSON list", "one JSON object per line")


def test_report_out_onto_a_file_it_reads_is_refused(tmp_path, run_cli, bundle):
    run = run_dir(tmp_path, ROUND % 1)
    one_line(run_cli("report", run, "--out", run / "metrics.jsonl"), "a file the report of", "expected a new file")
    assert (run / "metrics.jsonl").read_text() == ROUND % 1
    manifest = (bundle / "manifest.json").read_text()
    one_line(run_cli("report", bundle, "--out", bundle / "stages" / ".." / "manifest.json"), "a file the report")
    assert (bundle / "manifest.json").read_text() == manifest and not (bundle / "plots").exists()


# ---------------------------------------------------------------- cis keys


def test_keys_copied_onto_themselves_are_one_line_and_make_nothing(tmp_path, run_cli):
    keys = tmp_path / "keys"
    assert run_cli("keys", keys, "--name", "a").code == 0
    one_line(run_cli("keys", keys, "--add", keys / "a.key"), "already in")
    one_line(run_cli("keys", keys, "--name", "b", "--allow", f"{keys}/./"), "is FOLDER itself")
    assert sorted(p.name for p in keys.iterdir()) == ["a.key", "a.key_secret"]


# ---------------------------------------------------------------- cis simulate


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--seed", "-1"), ("--seed is -1", "an integer in 0..4294967295")),
        (("--sweep", "arrival_rate=0.5,1", "--slo-p99", "0"), ("--slo-p99 is 0.0", "> 0")),
        (("--sweep", "arrival_rate=0.5,1", "--slo-p99", "nan"), ("--slo-p99 is nan",)),
        (("--sweep", "arrival_rate=0.5,1", "--jobs", "0"), ("--jobs is 0", ">= 1")),
        (("--calibrate",), ("--calibrate", "expected --bundle")),
        (("--provider", "cuda"), ("--provider", "expected --bundle")),
    ],
)
def test_simulate_flags_out_of_range_or_without_their_bundle_are_one_line(tmp_path, run_cli, flags, words):
    one_line(run_cli("simulate", "--spec", chain_spec(tmp_path), "--requests", "20", *flags), *words)


# ---------------------------------------------------------------- bundles: cis inspect and load_bundle


def _no_file(m):
    del m["stages"][1]["file"]


def _policy_threshold(m):
    m["policy"]["thresholds"]["edge0"] = "high"


def _node_threshold(m):
    m["nodes"]["edge0"]["threshold"] = "high"


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: [m], ("a JSON list", "expected an object")),
        (_no_file, ("stages[1].file is missing",)),
        (_policy_threshold, ("policy.thresholds['edge0'] is 'high'", "a number")),
        (_node_threshold, ("nodes['edge0'].threshold is 'high'",)),
        (lambda m: {**m, "nodes": ["cloud"]}, ("nodes is ['cloud']",)),
        (lambda m: {**m, "stages": {}}, ("stages is {}",)),
    ],
)
def test_a_hand_edited_manifest_is_one_line_naming_it_and_the_key(bundle, run_cli, edit, words):
    path = edit_manifest(bundle, edit)
    one_line(run_cli("inspect", bundle), str(path), *words)


def test_inspect_shows_a_manifest_with_the_fields_it_checks(bundle, run_cli):
    r = run_cli("inspect", bundle)
    assert r.code == 0 and "edge0" in r.out and "0.5000" in r.out


@pytest.mark.parametrize("where", ["parent", "absolute", "unlisted"])
def test_every_stage_file_must_be_inside_the_bundle_and_listed(tmp_path, bundle, where):
    outside = tmp_path / "x.onnx"
    shutil.copy(bundle / "stages" / "stage1.onnx", outside)

    def point(m):
        if where == "parent":  # listed with its true sha256 too: still refused
            m["stages"][0]["file"] = "../x.onnx"
            m["files"]["../x.onnx"] = m["files"]["stages/stage1.onnx"]
        elif where == "absolute":
            m["stages"][0]["file"] = str(outside)
        else:
            (bundle / "stages" / "extra.onnx").write_bytes(b"placeholder")
            m["stages"][0]["file"] = "stages/extra.onnx"

    edit_manifest(bundle, point)
    expected = "outside the bundle folder" if where != "unlisted" else "not in the manifest's files"
    for verify in (True, False):
        with pytest.raises(BundleError, match=expected):
            load_bundle(bundle, verify=verify)


# ---------------------------------------------------------------- cis deploy


def deploy_spec(bundle: Path, tmp_path: Path) -> Path:
    spec = load_bundle(bundle).spec
    assert spec is not None
    spec = spec.replace_nodes(replace(n, address=f"tcp://10.0.0.{i + 1}:5555") for i, n in enumerate(spec.nodes))
    write_spec(spec, tmp_path / "spec.toml")
    return tmp_path / "spec.toml"


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--set", "max_batch=-1"), ("--set 'max_batch=-1'", ">= 1")),
        (("--set", "queue_limit=0"), ("--set 'queue_limit=0'", ">= 1")),
        (("--set", "http_timeout=0"), ("--set 'http_timeout=0'", "seconds > 0")),
        (("--set", "http_max_connections=0"), ("--set 'http_max_connections=0'", ">= 1")),
        (("--set", "http_port=70000"), ("--set 'http_port=70000'", "65535")),
        (("--env-dir", "etc/cis"), ("--env-dir 'etc/cis' is relative", "absolute")),
        (("--bundle-path", "bundle"), ("--bundle-path 'bundle' is relative",)),
        (("--cis", "/opt/my cis/bin/cis"), ("--cis '/opt/my cis/bin/cis'", "no spaces")),
        (("--env-dir", "/etc/100%"), ("--env-dir '/etc/100%'",)),
        (("--user", "a b"), ("--user 'a b'", "a user name")),
    ],
)
def test_deploy_systemd_refuses_what_a_unit_or_serve_cannot_take(bundle, tmp_path, run_cli, flags, words):
    out = tmp_path / "out"
    one_line(run_cli("deploy", "systemd", deploy_spec(bundle, tmp_path), "-o", out, *flags), *words)
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--headroom", "inf"), ("--headroom inf", "finite")),
        (("--bundle-volume", "hostpath", "--bundle-path", "srv/b"), ("--bundle-path 'srv/b' is relative",)),
        (("--set", "rcv_hwm=0"), ("--set 'rcv_hwm=0'", ">= 1")),
    ],
)
def test_deploy_kubernetes_refuses_out_of_range_values(bundle, tmp_path, run_cli, flags, words):
    out = tmp_path / "out"
    one_line(run_cli("deploy", "kubernetes", deploy_spec(bundle, tmp_path), bundle, "-o", out, *flags), *words)
    assert not out.exists()


@pytest.mark.parametrize("value", ["1.5", "-0.2", "nan"])
def test_simulate_threshold_is_a_confidence_as_serve_takes(tmp_path, run_cli, value):
    from cis.core.topologies import make_spec
    from cis.sim.config import SimConfig, check_config

    spec = make_spec("paper-7", "60-30-10")
    with pytest.raises(CisError, match=r"--threshold .*; expected a confidence in \[0, 1\], or inf"):
        check_config(SimConfig(requests=10, threshold=float(value)), spec, with_bundle=True)
