"""``cis simulate``'s flags for the runtime's twin: --faults, --latency-profile, --max-batch, --visit-overhead,
--wire tcp, --link-burst, and --sweep arrival_rate=LO:HI with --slo-p99."""

from __future__ import annotations

import json

import pytest

COMMON = ("--requests", 3000, "--seed", 2, "--service", "deterministic", "--service-mean", 0.001, "--json")


def test_a_fault_file_partitions_a_link_in_the_simulation(run_cli, paper7, tmp_path):
    faults = tmp_path / "faults.txt"
    faults.write_text("5 down edge0\n15 up edge0\n")
    plain = run_cli("simulate", "--spec", paper7, "--duration", 20, "--json").json()
    cut = run_cli("simulate", "--spec", paper7, "--duration", 20, "--faults", faults, "--json").json()
    assert plain["degraded_share"] == 0 and cut["degraded_share"] > 0.01
    assert cut["nodes"]["edge0"]["degraded"] > 0 and cut["nodes"]["edge1"]["degraded"] == 0
    assert cut["requests"]["dropped"] == 0
    assert cut["config"]["faults"][0] == {"at": 5.0, "action": "down", "node": "edge0", "value": None}


def test_a_measured_latency_profile_sets_the_stage_times(run_cli, paper7, tmp_path):
    profile = tmp_path / "latency.json"
    profile.write_text(json.dumps({"stages": {"1": {"1": 0.002}, "2": {"1": 0.003}, "3": {"1": 0.004}},
                                   "idle_slowdown": [[0, 0], [1, 0]]}))
    data = run_cli("simulate", "--spec", paper7, *COMMON, "--loopback", "--latency-profile", profile).json()
    assert data["exits"]["1"]["latency"]["p50_s"] == pytest.approx(0.002)
    assert data["exits"]["3"]["latency"]["p50_s"] == pytest.approx(0.002 + 0.003 + 0.004, rel=0.05)
    overhead = run_cli("simulate", "--spec", paper7, *COMMON, "--loopback", "--latency-profile", profile,
                       "--visit-overhead", 0.001).json()
    assert overhead["exits"]["1"]["latency"]["p50_s"] == pytest.approx(0.003)  # one visit, one overhead


def test_max_batch_and_the_tcp_wire_reach_the_model(run_cli, paper7):
    tcp = run_cli("simulate", "--spec", paper7, *COMMON, "--wire", "tcp", "--link-burst", 1600).json()
    plain = run_cli("simulate", "--spec", paper7, *COMMON).json()
    assert tcp["links"]["device0->edge0"]["wire_bytes"] > tcp["links"]["device0->edge0"]["payload_bytes"]
    assert tcp["exits"]["3"]["latency"]["mean_s"] > plain["exits"]["3"]["latency"]["mean_s"]
    assert tcp["config"]["wire"] == "tcp" and tcp["config"]["link_burst"] == 1600
    batched = run_cli("simulate", "--spec", paper7, *COMMON, "--max-batch", 8).json()
    assert batched["config"]["max_batch"] == 8 and plain["config"]["max_batch"] == 1


def test_a_sweep_range_searches_for_the_capacity(run_cli, paper7, tmp_path):
    res = run_cli("simulate", "--spec", paper7, "--requests", 3000, "--sweep", "arrival_rate=1:16", "--slo-p99", 100,
                  "--jobs", 2, "--out", tmp_path / "sweep")
    assert res.code == 0, res.err
    assert "largest load meeting p99 <= 100 ms: x" in res.out and "(searched x1 to x16)" in res.out
    data = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    cap = data["capacity"]["scale"]
    assert 1 < cap < 16 and data["search"] == [1.0, 16.0]
    above = [p["scale"] for p in data["points"] if p["scale"] > cap]
    assert min(above) - cap <= 0.01 * 16  # bracketed within the tolerance


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sweep", "arrival_rate=4:2", "--slo-p99", "50"], "a search range is LO:HI with 0 < LO < HI"),
        (["--sweep", "arrival_rate=1:4"], "expected --slo-p99 MS"),
        (["--max-batch", "0"], "--max-batch is 0; expected an integer >= 1"),
        (["--link-burst", "-5"], "--link-burst is -5.0; expected bytes >= 0"),
        (["--heartbeat", "0"], "--heartbeat is 0.0; expected a number > 0"),
        (["--latency-profile", "missing.json"], "--latency-profile missing.json: cannot read"),
        (["--faults", "missing.txt"], "fault file missing.txt: cannot read"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(run_cli, paper7, extra, message):
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, *extra)
    assert res.code == 2
    assert message in res.err and len(res.err.strip().splitlines()) == 1


def test_a_fault_on_an_unknown_node_or_a_bad_profile_is_one_line(run_cli, paper7, tmp_path):
    faults = tmp_path / "f.txt"
    faults.write_text("1 down edge7\n")
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, "--faults", faults)
    assert res.code == 2 and "--faults: no node 'edge7'" in res.err
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": {"1": {"8": 0.1}, "2": {"1": 0.1}, "3": {"1": 0.1}}}))
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, "--latency-profile", profile)
    assert res.code == 2 and "--latency-profile: stage 1 has batch-1 time None" in res.err
