"""``cis simulate`` end to end: summary, --json, --out files, --sweep and user errors."""

from __future__ import annotations

import csv
import json

import pytest


def test_summary_json_and_output_files(run_cli, paper7, tmp_path):
    out = tmp_path / "run"
    human = run_cli("simulate", "--spec", paper7, "--requests", 2000, "--seed", 3, "--out", out)
    assert human.code == 0, human.err
    assert "latency ms" in human.out and "device0" in human.out and "edge0->cloud" in human.out

    res = run_cli("simulate", "--spec", paper7, "--requests", 2000, "--seed", 3, "--json")
    assert res.code == 0, res.err
    data = res.json()
    assert data["requests"] == {"arrived": 2000, "served": 2000, "dropped": 0}
    assert set(data["exits"]) == {"1", "2", "3"} and set(data["latency"]) >= {"mean_s", "p50_s", "p95_s", "p99_s"}
    assert data["config"]["seed"] == 3
    saved = json.loads((out / "result.json").read_text())
    assert saved["latency"] == data["latency"]  # same seed, same run

    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2000 and rows[0]["outcome"] == "served" and rows[0]["entry"].startswith("device")
    with open(out / "nodes.csv") as f:
        assert [r["node"] for r in csv.DictReader(f)] == [
            "cloud",
            "edge0",
            "edge1",
            "device0",
            "device1",
            "device2",
            "device3",
        ]
    assert (out / "latency_cdf.png").stat().st_size > 0 and (out / "utilisation.png").stat().st_size > 0


def test_flags_reach_the_model(run_cli, paper7):
    res = run_cli(
        "simulate", "--spec", paper7, "--duration", 20, "--arrivals", "deterministic", "--service", "deterministic",
        "--service-mean", 0.1, "--workers", 2, "--queue-limit", 3, "--share", "device0=1", "--burst", 5, "--json",
    )
    assert res.code == 0, res.err
    data = res.json()
    assert data["nodes"]["device0"]["workers"] == 2 and data["nodes"]["device0"]["queue_limit"] == 3
    assert data["nodes"]["device0"]["forwarded_rate"] == 0.0
    assert data["requests"]["arrived"] == 2000  # 4 devices x 25/s x 20 s, evenly spaced
    assert data["nodes"]["device1"]["dropped"] > 0  # 25/s on two workers of 100 ms each (load 1.25), 3 waiting at most


def test_sweep_prints_a_capacity_table(run_cli, paper7, tmp_path):
    res = run_cli(
        "simulate", "--spec", paper7, "--requests", 1500, "--sweep", "arrival_rate=1,16",
        "--slo-p99", 100, "--jobs", 2, "--out", tmp_path / "sweep",
    )
    assert res.code == 0, res.err
    assert "largest load meeting p99 <= 100 ms: x1 (100.0 req/s)" in res.out
    data = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    low, high = data["points"]
    assert low["meets_slo"] and not high["meets_slo"] and high["p99_s"] > low["p99_s"]
    assert (tmp_path / "sweep" / "sweep.csv").read_text().startswith("scale,total_rate")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--requests", "0"], "--requests is 0; expected an integer >= 1"),
        (["--requests", "10", "--arrivals", "trace:missing.txt"], "trace missing.txt: cannot read"),
        (["--requests", "10", "--share", "device0"], "--share 'device0': expected NODE=FRACTION"),
        (["--requests", "10", "--sweep", "rate=1,2"], "expected arrival_rate=LIST"),
        (["--requests", "10", "--slo-p99", "50"], "--slo-p99 and --jobs apply to --sweep"),
        (["--requests", "10", "--bundle", "nowhere"], "nowhere: no manifest.json"),
        (["--requests", "10", "--visit-cost", "soon"], "--visit-cost 'soon': not a number of seconds and not a file"),
        (["--requests", "10", "--visit-cost", "-0.001"], "hop_rtt is -0.001; expected seconds >= 0 (--visit-cost)"),
        # what argparse checks is one line too, not its usage text first (cis.cli.main.OneLineParser)
        (["--requests", "10", "--service", "foo"], "cis simulate: error: argument --service: invalid choice: 'foo'"),
        (["--requests", "abc"], "argument --requests: invalid int value: 'abc' (see cis simulate --help)"),
        ([], "one of the arguments --requests --duration is required"),
        (["--requests", "10", "--bogus", "3"], "cis simulate: error: unrecognized arguments: --bogus 3"),
        (["--requests", "10", "--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(run_cli, paper7, extra, message):
    res = run_cli("simulate", "--spec", paper7, *extra)
    assert res.code == 2
    assert message in res.err and len(res.err.strip().splitlines()) == 1


def test_bad_spec_and_bad_trace_lines(run_cli, paper7, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cis]\nexits = 2\n")
    res = run_cli("simulate", "--spec", bad, "--requests", 10)
    assert res.code == 2 and "no [[nodes]]" in res.err
    trace = tmp_path / "trace.txt"
    trace.write_text("device0,0.1\ndevice0,soon\n")
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, "--arrivals", f"trace:{trace}")
    assert res.code == 2 and "line 2: 'device0,soon'" in res.err


def test_loopback_visit_cost_adds_its_time_per_node_visit(run_cli, paper7, tmp_path):
    costs = tmp_path / "costs.txt"
    costs.write_text("# seconds per node visit\n0.002\n0.004\n")
    common = (
        "simulate",
        "--spec",
        paper7,
        "--requests",
        3000,
        "--seed",
        1,
        "--service",
        "deterministic",
        "--service-mean",
        0.001,
        "--json",
    )
    plain = run_cli(*common, "--loopback").json()
    costly = run_cli(*common, "--loopback", "--visit-cost", costs).json()
    # every request visits at least one node, each visit draws 2 or 4 ms (mean 3 ms)
    extra = costly["latency"]["mean_s"] - plain["latency"]["mean_s"]
    visits = sum(
        int(e) * v["share"] for e, v in plain["exits"].items()
    )  # paper-7: exit e is served on the e-th node visited
    assert extra == pytest.approx(0.003 * visits, rel=0.15)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.001\nfast\n")
    res = run_cli(*common, "--visit-cost", bad)
    assert res.code == 2 and f"{bad}:2: 'fast' is not a number" in res.err
