"""The simulator's model: bundle profiles, the exit policy, arrivals, traces, seeds and errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cis.core.bundle import load_bundle, write_manifest, write_profiles
from cis.core.errors import CisError
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.spec import CisSpec, Link, Node, spec_to_dict, validate, write_spec
from cis.sim import SimConfig, simulate
from cis.sim.arrivals import assign_trace, deterministic, mmpp, parse_trace, poisson

LINK = Link(bandwidth=1e5, latency=0.01)
STAGE_SECONDS = {1: 0.004, 2: 0.010}
CARRY = {"name": "features", "shape": [None, 64], "dtype": "float16"}  # 128 bytes per request


def leaf_and_root(cap: float = 1000.0) -> CisSpec:
    return validate(
        CisSpec(
            (
                Node("root", 2, speed=2.0),
                Node("leaf", 1, parent="root", arrival_rate=5.0, max_transfer_rate=cap, link=LINK),
            ),
            2,
        )
    )


def profile_rows(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Confidence rising over the rows at exit 1 (flat at exit 2); exit 1 right on even rows, exit 2 always."""
    confidence = np.stack([np.linspace(0.0, 1.0, n), np.full(n, 0.9)], axis=1)
    correct = np.stack([np.arange(n) % 2 == 0, np.ones(n, dtype=bool)], axis=1)
    return confidence, correct


def write_placeholder_bundle(
    root: Path,
    spec: CisSpec,
    confidence: np.ndarray,
    correct: np.ndarray,
    policy: ExitPolicy | None = None,
    latency: dict[int, dict[int, float]] | None = None,
) -> Path:
    """A bundle folder for the simulator: real manifest and profiles, placeholder stage files.

    The simulator never opens the ONNX files; it reads the stage metadata (for
    carry sizes) and the profiles.
    """
    (root / "stages").mkdir(parents=True)
    stages = []
    for k in range(1, spec.num_exits + 1):
        (root / "stages" / f"stage{k}.onnx").write_bytes(b"placeholder")
        outputs = [{"name": "logits", "shape": [None, spec.num_classes], "dtype": "float32"}]
        if k < spec.num_exits:
            outputs.append(CARRY)
        stages.append({"index": k, "exit": k, "file": f"stages/stage{k}.onnx", "inputs": [], "outputs": outputs})
    latency = latency or {k: {1: s, 8: 4 * s} for k, s in STAGE_SECONDS.items()}
    write_profiles(root, confidence, correct, latency)
    write_manifest(
        root,
        {
            "stages": stages,
            "spec": spec_to_dict(spec),
            "policy": policy.to_json() if policy else None,
            "nodes": {n.id: {"stages": list(range(1, n.exit + 1))} for n in spec.nodes},
        },
    )
    return root


def test_bundle_profile_drives_decisions_service_times_payload_and_accuracy(tmp_path):
    spec = leaf_and_root()
    conf, correct = profile_rows()
    policy = ExitPolicy("max_softmax", {"leaf": 0.5, "root": -math.inf})
    bundle = load_bundle(write_placeholder_bundle(tmp_path / "b", spec, conf, correct, policy))
    result = simulate(spec, SimConfig(requests=4000, seed=0), bundle)
    s, req = result.summary, result.requests

    kept = conf[:, 0] >= 0.5
    assert s["exits"]["1"]["share"] == pytest.approx(kept.mean(), abs=0.03)
    expected_accuracy = np.where(kept, correct[:, 0], correct[:, 1]).mean()
    assert s["accuracy"] == pytest.approx(expected_accuracy, abs=0.03)
    assert s["exits"]["2"]["accuracy"] == 1.0
    assert s["decision"]["kind"] == "thresholds" and s["decision"]["thresholds"]["leaf"] == 0.5

    # Deterministic service from the latency profile, the carry size, the link and the root's speed.
    latency = req["finish"] - req["arrive"]
    assert latency[req["exit"] == 1].min() == pytest.approx(STAGE_SECONDS[1])
    over_the_link = STAGE_SECONDS[1] + 128 / LINK.bandwidth + LINK.latency + STAGE_SECONDS[2] / 2.0
    assert latency[req["exit"] == 2].min() == pytest.approx(over_the_link)
    assert s["links"]["leaf->root"]["payload_bytes"] == 128


def test_bundle_without_policy_is_calibrated_to_the_rate_calculus(tmp_path):
    spec = leaf_and_root(cap=2.0)  # leaf keeps f = 3/5 of its 5 requests/s
    conf, correct = profile_rows()
    bundle = load_bundle(write_placeholder_bundle(tmp_path / "b", spec, conf, correct))
    s = simulate(spec, SimConfig(requests=4000, seed=0, burst=10.0), bundle).summary
    assert s["exits"]["1"]["share"] == pytest.approx(0.6, abs=0.03)
    assert s["decision"]["thresholds"]["leaf"] == pytest.approx(0.4, abs=0.01)


def test_bad_profiles_and_policies_raise_one_clear_error(tmp_path):
    spec = leaf_and_root()
    conf, correct = profile_rows()
    three = load_bundle(
        write_placeholder_bundle(
            tmp_path / "three", spec, np.hstack([conf, conf[:, :1]]), np.hstack([correct, correct[:, :1]])
        )
    )
    with pytest.raises(CisError, match="3 exits; expected 2"):
        simulate(spec, SimConfig(requests=10), three)
    no_batch1 = load_bundle(
        write_placeholder_bundle(tmp_path / "lat", spec, conf, correct, latency={1: {8: 0.1}, 2: {1: 0.1}})
    )
    with pytest.raises(CisError, match="stage 1 has batch-1 time None"):
        simulate(spec, SimConfig(requests=10), no_batch1)
    partial = ExitPolicy("max_softmax", {"root": -math.inf})
    missing = load_bundle(write_placeholder_bundle(tmp_path / "pol", spec, conf, correct, partial))
    with pytest.raises(CisError, match="no threshold for node 'leaf'.*--calibrate"):
        simulate(spec, SimConfig(requests=10), missing)
    assert simulate(spec, SimConfig(requests=10, calibrate=True), missing).summary["requests"]["arrived"] == 10


def test_identical_seeds_give_identical_runs():
    spec = leaf_and_root(cap=2.0)
    config = SimConfig(requests=3000, seed=7, arrivals="mmpp")
    a, b = simulate(spec, config), simulate(spec, config)
    assert a.summary == b.summary
    assert all(np.array_equal(a.requests[k], b.requests[k]) for k in a.requests)
    c = simulate(spec, SimConfig(requests=3000, seed=8, arrivals="mmpp"))
    assert not np.array_equal(a.requests["arrive"], c.requests["arrive"])


def test_arrival_processes_have_their_rates():
    rng = np.random.default_rng(0)
    times = list(zip(range(20_000), poisson(5.0, rng)))
    assert times[-1][1] / 20_000 == pytest.approx(1 / 5.0, rel=0.03)
    gaps = np.diff([t for _, t in zip(range(5), deterministic(4.0))])
    assert np.allclose(gaps, 0.25)
    bursty = np.array([t for _, t in zip(range(50_000), mmpp(10.0, ratio=4.0, dwell=2.0, rng=rng))])
    assert len(bursty) / bursty[-1] == pytest.approx(10.0, rel=0.05)
    counts = np.bincount(bursty.astype(int))
    assert counts.var() / counts.mean() > 2.0  # overdispersed; a Poisson process gives 1


def test_trace_lines_are_parsed_and_assigned():
    entries = parse_trace(["# replay", "leaf,0.5", "", "0.25", " root , 1.0 "], "t.txt")
    assert entries == [("leaf", 0.5), (None, 0.25), ("root", 1.0)]
    times = assign_trace(entries, {"root": 0.0, "leaf": 5.0}, np.random.default_rng(0), "t.txt")
    assert times == {"root": [1.0], "leaf": [0.25, 0.5]}
    for bad in ("abc", "leaf,-1", "a,b,c", ",1.0", "nan"):
        with pytest.raises(CisError, match=r"t.txt line 1: .*expected 'timestamp' or 'node_id,timestamp'"):
            parse_trace([bad], "t.txt")
    with pytest.raises(CisError, match="unknown node 'nope'"):
        assign_trace([("nope", 1.0)], {"root": 0.0}, np.random.default_rng(0), "t.txt")


def test_a_trace_is_replayed_at_its_timestamps(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("leaf,0.1\nleaf,0.2\nroot,0.3\n")
    result = simulate(leaf_and_root(), SimConfig(requests=100, arrivals="trace", trace=str(trace)))
    assert result.requests["arrive"].tolist() == [0.1, 0.2, 0.3]
    assert result.summary["nodes"]["root"]["served_rate"] is not None


def test_bad_configs_raise_one_clear_error():
    spec = leaf_and_root()
    with pytest.raises(CisError, match="exactly one of --requests N or --duration"):
        simulate(spec, SimConfig())
    with pytest.raises(CisError, match="no node 'nope'"):
        simulate(spec, SimConfig(requests=10, shares={"nope": 0.5}))
    with pytest.raises(CisError, match=r"--share leaf=1.5; expected a fraction"):
        simulate(spec, SimConfig(requests=10, shares={"leaf": 1.5}))
    with pytest.raises(CisError, match="--arrivals is 'bursty'"):
        simulate(spec, SimConfig(requests=10, arrivals="bursty"))
    silent = validate(CisSpec((Node("root", 1),), 1))
    with pytest.raises(CisError, match="no node has an arrival_rate > 0"):
        simulate(silent, SimConfig(requests=10))


def test_the_simulator_imports_no_torch():
    code = "import sys, cis.sim.simulation, cis.sim.sweep, cis.cli.commands.simulate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cli_with_a_bundle_reports_accuracy(run_cli, tmp_path):
    spec = leaf_and_root()
    conf, correct = profile_rows()
    policy = ExitPolicy("max_softmax", {"leaf": 0.5, "root": -math.inf})
    bundle = write_placeholder_bundle(tmp_path / "b", spec, conf, correct, policy)
    spec_path = tmp_path / "spec.toml"
    write_spec(spec, spec_path)
    res = run_cli("simulate", "--spec", spec_path, "--bundle", bundle, "--requests", 500)
    assert res.code == 0, res.err
    assert "estimated CIS accuracy" in res.out and "leaf->root" in res.out
