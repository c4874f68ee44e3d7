"""The loop from a measurement back to training and thresholds, on digits.

A small paper-7 run is served in the simulator under shifted traffic (edge0's devices get 3x
the arrivals); its requests file is the measurement. ``cis export --rates-from`` calibrates
thresholds to the measured rates (and says how far the design's were off), ``cis train --init
--rates-from`` continues the run with the measured serving rates as its weights.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cis.core.rates import compute_rates  # noqa: E402
from cis.core.spec import load_spec, write_spec  # noqa: E402
from cis.core.topologies import make_spec  # noqa: E402
from cis.runtime.measure import read_requests_file  # noqa: E402

SHIFTED = ("device0", "device1")


@pytest.fixture(scope="module")
def loop(tmp_path_factory, one_torch_thread_module):
    """A 2-round digits run for paper-7 80-15-5, its bundle, and a requests file of the shifted load."""
    from cis.cli.main import main
    from cis.exporter.bundle_writer import export_bundle
    from cis.sim.config import SimConfig
    from cis.sim.output import write_outputs
    from cis.sim.simulation import simulate

    tmp = tmp_path_factory.mktemp("loop")
    design = make_spec("paper-7", "80-15-5", total_rate=40.0)
    write_spec(design, tmp / "design.toml")
    assert main(["train", "--dataset", "digits", "--spec", str(tmp / "design.toml"), "--rounds", "2",
                 "--out", str(tmp / "base"), "--no-progress", "--json"]) == 0
    export_bundle(tmp / "base", tmp / "bundle", latency_repeats=1)
    shifted = design.replace_nodes(
        replace(n, arrival_rate=3 * n.arrival_rate) if n.id in SHIFTED else n for n in design.nodes
    )
    write_spec(shifted, tmp / "shifted.toml")
    from cis.core.bundle import load_bundle

    res = simulate(shifted, SimConfig(requests=3000, seed=1), load_bundle(tmp / "bundle"))
    write_outputs(tmp / "sim", res.summary, res.requests)
    return {"tmp": tmp, "design": design, "requests": tmp / "sim" / "requests.csv"}


@pytest.fixture(scope="module")
def one_torch_thread_module():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_export_rates_from_calibrates_each_node_to_the_measured_rates(loop, run_cli):
    tmp = loop["tmp"]
    r = run_cli("export", tmp / "base", "--out", tmp / "b2", "--rates-from", loop["requests"],
                "--latency-repeats", "1", "--json")
    assert r.code == 0, r.err
    cal = r.json()["calibration"]
    measured = read_requests_file(loop["requests"], loop["design"]).rates()
    for e, share in measured.exit_share.items():
        assert cal["target_share_per_exit"][str(e)] == pytest.approx(share)
    assert cal["max_share_error"] <= 0.05  # the new thresholds reproduce the measured shares on validation
    assert cal["rates_from"]["kind"] == "requests" and cal["rates_from"]["served"] > 0
    prev = cal["previous"]
    assert set(prev["nodes"]) == set(loop["design"].ids) and prev["spec"] == loop["design"].name
    base = json.loads((tmp / "bundle" / "manifest.json").read_text())["nodes"]
    for nid, n in prev["nodes"].items():
        assert n["previous"] == base[nid]["threshold"]  # the design's thresholds: the bundle exported before
        assert n["threshold"] == r.json()["nodes"][nid]["threshold"]
    # the traffic moved to edge0's devices: the design's thresholds serve too little there
    assert prev["share_per_exit"]["1"]["previous"] < prev["share_per_exit"]["1"]["measured"]
    bundle_spec = json.loads((tmp / "b2" / "manifest.json").read_text())["spec"]
    arrivals = {n["id"]: n.get("arrival_rate", 0.0) for n in bundle_spec["nodes"]}
    assert arrivals["device0"] == pytest.approx(measured.arrival_rate["device0"], abs=1e-5)
    assert arrivals["device0"] > 2 * arrivals["device2"]
    human = run_cli("export", tmp / "base", "--out", tmp / "b3", "--rates-from", loop["requests"],
                    "--latency-repeats", "1")
    assert "points off at worst" in human.out and "device0" in human.out


def test_a_node_no_measured_request_reached_keeps_the_designs_threshold(loop, run_cli):
    """Found by a hunt: an idle node's threshold was +inf (forward everything, the 0/0 share), so traffic that
    came there later was all forwarded. It keeps the design's threshold (docs/closed-loop.md)."""
    tmp = loop["tmp"]
    lines = loop["requests"].read_text().splitlines()
    idle = ("device2", "device3")  # their requests left out: nothing reaches them
    kept = [lines[0], *(row for row in lines[1:] if row.split(",")[1] not in idle)]
    (tmp / "idle.csv").write_text("\n".join(kept) + "\n")
    r = run_cli("export", tmp / "base", "--out", tmp / "b_idle", "--rates-from", tmp / "idle.csv",
                "--latency-repeats", "1", "--json")
    assert r.code == 0, r.err
    base = json.loads((tmp / "bundle" / "manifest.json").read_text())["nodes"]
    for nid in idle:
        assert r.json()["nodes"][nid]["threshold"] == base[nid]["threshold"] != "inf"
    assert r.json()["nodes"]["device0"]["threshold"] != base["device0"]["threshold"]  # measured ones move


def test_train_init_continues_the_run_with_the_measured_serving_rates(loop, run_cli):
    import torch

    tmp = loop["tmp"]
    out = tmp / "ft"
    r = run_cli("train", "--init", tmp / "base", "--rates-from", loop["requests"], "--rounds", "1",
                "--lr", "1e-12", "--out", out, "--no-progress", "--json")
    assert r.code == 0, r.err
    config = json.loads((out / "config.json").read_text())
    base_config = json.loads((tmp / "base" / "config.json").read_text())
    measured = read_requests_file(loop["requests"], loop["design"]).rates()
    lam = [measured.exit_serving_rate[e] for e in (1, 2, 3)]
    assert config["exit_rates"] == pytest.approx(lam) and config["init"] == str((tmp / "base").resolve())
    assert config["rates_from"] == str(loop["requests"])
    assert all(config[k] == base_config[k] for k in ("dataset", "seed", "val_size", "strategy", "width"))
    assert config["lr"] == 1e-12 and config["rounds"] == 1
    weights = json.loads((out / "weights.json").read_text())
    assert weights["exit_serving_rate"] == pytest.approx(lam)
    assert weights["first_round"] == pytest.approx([v / sum(lam) for v in lam])
    spec = load_spec(out / "spec.toml")
    assert spec.node("device0").arrival_rate == pytest.approx(measured.arrival_rate["device0"], abs=1e-5)
    assert (out / "measurement.json").is_file() and (out / "measured-spec.toml").read_text().startswith("#")
    before = torch.load(tmp / "base" / "checkpoint.pt", weights_only=True)["model"]
    after = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    convs = [k for k, v in before.items() if k.endswith("weight") and v.dim() == 4]
    assert convs and all(torch.allclose(before[k], after[k], atol=1e-6) for k in convs)  # lr ~0: it started there
    assert compute_rates(spec).total == pytest.approx(sum(measured.arrival_rate.values()), rel=1e-4)


def test_mistakes_are_one_line(loop, run_cli, tmp_path):
    tmp = loop["tmp"]
    for argv, message in (
        (("train", "--init", tmp / "base", "--seed", "7", "--out", tmp_path / "a"), "keeps its data split"),
        (("train", "--init", tmp_path, "--out", tmp_path / "b"), "no config.json"),
        (("train", "--dataset", "digits", "--rates-from", loop["requests"], "--out", tmp_path / "c"),
         "needs the design spec"),
        (("train", "--resume", "--init", tmp / "base", "--out", tmp / "base"), "drop --init"),
        (("train", "--init", tmp / "base", "--width", "0.5", "--rounds", "1", "--out", tmp_path / "d",
          "--no-progress"), "expected the same architecture"),
        (("export", tmp / "base", "--out", tmp_path / "e", "--window", "3"), "--window goes with --rates-from"),
        (("train", "--dataset", "digits", "--window", "3", "--out", tmp_path / "f"), "--window goes with"),
    ):
        r = run_cli(*argv)
        assert r.code == 2 and message in r.err, (argv, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err
