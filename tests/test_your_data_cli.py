"""``cis train --data REF`` end to end (issue 32, items 3 and 5): a user's npz trains federated (its own node
column as the partition) and centralised; evaluate and export rebuild the data from the run; bad data is one
line, exit status 2, and nothing is written."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cis.training.config import make_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 210  # 8x8 one-channel images of 3 classes: the small CNN's size, a second per round


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))


def tiny_images(path, n=N, seed=0, **extra):
    """Class k: a bright k-th third of the image, plus noise (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = rng.normal(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    for k in range(3):
        x[y == k, :, :, 3 * k : 3 * k + 2] += 2.0
    np.savez(path, x=x, y=y, **extra)
    return path


def train(run_cli, *args):
    return run_cli("train", "--threads", "1", "--no-progress", "--batch-size", "16", *args)


def test_npz_trains_federated_on_its_own_node_column(tmp_path, run_cli):
    node = np.arange(N) % 7
    data = tiny_images(tmp_path / "d.npz", node=node)
    out = tmp_path / "fed"
    r = train(run_cli, "--data", data, "--partition", "node", "--rounds", "1", "--local-steps", "2", "--out", out,
              "--json")
    assert r.code == 0, r.err
    summary = r.json()
    assert summary["dataset"] == str(data) and summary["centralised"] is False
    assert summary["sgd_steps"]["per_node"] == {n: 2 for n in summary["sgd_steps"]["per_node"]}
    meta = json.loads((out / "checkpoint.json").read_text())
    assert meta["data_sha256"] == summary["data_sha256"] and len(meta["data_sha256"]) == 64
    assert meta["model"]["arch"] == "digits-cnn" and meta["model"]["num_classes"] == 3
    assert json.loads((out / "config.json").read_text())["partition"] == "node"

    from cis.training.run import build_setup

    s = build_setup(make_config({"dataset": str(data), "partition": "node", "rounds": 1}))
    counts = np.bincount(s.splits.train.node, minlength=7)
    assert [c.size for c in s.clients] == counts.tolist()  # node k = the spec's k-th node
    skewed = build_setup(make_config({"dataset": str(data), "dirichlet": 0.3, "rounds": 1}))
    assert sum(c.size for c in skewed.clients) == len(s.splits.train)


def test_centralised_trains_on_pooled_data_and_evaluates_and_exports(tmp_path, run_cli):
    data = tiny_images(tmp_path / "d.npz")
    out = tmp_path / "central"
    r = train(run_cli, "--dataset", data, "--centralised", "--rounds", "2", "--local-steps", "3", "--out", out,
              "--json")
    assert r.code == 0, r.err
    summary = r.json()
    assert summary["centralised"] is True
    assert summary["sgd_steps"] == {"total": 6, "root": None, "per_node": {"pooled": 6}, "per_round": 3,
                                    "federated": {"per_round": 21, "total": 42}}  # 7 nodes x 3 steps a round
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [ln["round"] for ln in lines] == [1, 2] and set(lines[-1]["loss"]) == {"1", "2", "3"}
    assert summary["final_exit_accuracy"] > 0.5  # three bright stripes: learnt in 6 steps

    r = run_cli("evaluate", out, "--serving", "80-15-5", "--json")
    assert r.code == 0, r.err and r.json()["spec"]
    bundle = tmp_path / "bundle"
    r = run_cli("export", out, "--out", bundle, "--json", "--latency-repeats", "1")
    assert r.code == 0, r.err
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["dataset"] == str(data) and manifest["normalisation"] == {"mean": None, "std": None}

    tiny_images(data, seed=1)  # the data file changes
    for argv in (("evaluate", out), ("export", out, "--out", tmp_path / "b2"), ("train", "--out", out, "--resume")):
        r = run_cli(*argv)
        errors = [ln for ln in r.err.splitlines() if "error:" in ln]  # export logs its progress above
        assert r.code == 2 and len(errors) == 1 and "changed since the run" in errors[0] and "Traceback" not in r.err
    assert not (tmp_path / "b2").exists()


def test_centralised_weights_are_the_federated_runs(tmp_path):
    from cis.training.run import build_setup

    data = str(tiny_images(tmp_path / "d.npz"))
    for strategy in ("serving-rate", "flops", "equal"):
        values = {"dataset": data, "strategy": strategy, "rounds": 4, "serving": "80-15-5"}
        fed = build_setup(make_config(values))
        central = build_setup(make_config({**values, "centralised": True}))
        assert central.weights.describe() == fed.weights.describe()
        assert [c.id for c in central.clients] == ["pooled"] and central.clients[0].size == len(fed.splits.train)


@pytest.mark.parametrize(
    "make, flags, match",
    [
        (lambda p: _nan(p), (), "NaN or inf"),
        (lambda p: tiny_images(p, node=np.arange(N) % 9), ("--partition", "node"), "node index [78]; the spec has 7"),
        (lambda p: tiny_images(p), ("--partition", "node"), "has no node column"),
        (lambda p: tiny_images(p, n=8), (), r"5 training samples \(what the validation split leaves\) for 7 nodes"),
        (lambda p: tiny_images(p), ("--centralised", "--dirichlet", "0.5"), "dirichlet"),
        (lambda p: tiny_images(p), ("--centralised", "--method", "depthfl"), "centralised trains method 'cis'"),
        (lambda p: _bad_split(p), (), "split value 'dev'"),
    ],
)
def test_bad_data_is_one_line_and_writes_nothing(tmp_path, run_cli, make, flags, match):
    data = make(tmp_path / "d.npz")
    out = tmp_path / "run"
    r = train(run_cli, "--data", data, "--rounds", "1", "--out", out, *flags)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert re.search(match, r.err), r.err
    assert not out.exists()


def test_a_node_outside_the_spec_in_a_test_row_is_one_line_too(tmp_path, run_cli):
    """Only training rows are partitioned, but a node value outside the spec in any split is the user's typo."""
    from cis.training.data.loading import load_dataset

    node = np.arange(N) % 7
    test_row = int(load_dataset(str(tiny_images(tmp_path / "d.npz", node=node))).test.rows[0])
    node[test_row] = 9
    data = tiny_images(tmp_path / "d.npz", node=node)
    r = train(run_cli, "--data", data, "--partition", "node", "--rounds", "1", "--out", tmp_path / "run")
    assert r.code == 2 and "node column names node index 9; the spec has 7 nodes" in r.err, r.err
    assert not (tmp_path / "run").exists()


def test_image_folder_with_one_class_is_one_line(tmp_path, run_cli):
    from PIL import Image

    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    for j in range(3):
        Image.fromarray(np.full((8, 8), j, np.uint8), "L").save(tmp_path / "imgs" / "cat" / f"{j}.png")
    r = train(run_cli, "--data", tmp_path / "imgs", "--rounds", "1", "--out", tmp_path / "run")
    assert r.code == 2 and "1 class folder (cat/); expected at least 2 classes" in r.err
    assert not (tmp_path / "run").exists()


def _nan(path):
    tiny_images(path)
    z = dict(np.load(path))
    z["x"][5, 0, 1, 1] = np.nan
    np.savez(path, **z)
    return path


def _bad_split(path):
    return tiny_images(path, split=np.array(["train"] * (N - 20) + ["dev"] * 20))


def test_a_resumed_centralised_run_ends_with_the_same_weights(tmp_path, run_cli):
    import torch

    data = tiny_images(tmp_path / "d.npz")
    flags = ("--data", data, "--centralised", "--rounds", "3", "--local-steps", "2", "--strategy", "flops")
    assert train(run_cli, *flags, "--out", tmp_path / "whole").code == 0
    assert train(run_cli, *flags, "--out", tmp_path / "cut", "--stop-after", "1").code == 0
    r = train(run_cli, "--out", tmp_path / "cut", "--resume")
    assert r.code == 0, r.err
    whole = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    cut = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(whole[k], cut[k]) for k in whole)
