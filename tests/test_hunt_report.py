"""The report/simulate hunt's items (helper-58): `cis report --out` refuses every file the report reads, a bad
file the report reads is one line, a run dir without metrics says so, `simulate --out` leaves one mode's files,
the --latency-profile file's keys and values are checked by name, an empty --out is refused, the --burst
default (docs/demo.md, README.md, docs/simulator.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cis.core.policy.transfer_cap import DEFAULT_BURST_SECONDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture
def sim(run_cli, paper7, tmp_path):
    out = tmp_path / "sim"
    res = run_cli("simulate", "--spec", paper7, "--requests", 200, "--out", out)
    assert res.code == 0, res.err
    return out


def one_line(res, *parts: str) -> None:
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, (res.code, res.err)
    for part in parts:
        assert part in res.err, res.err


# ---------------------------------------------------------------- 1. --out onto a file the report reads


def test_report_out_onto_the_simulations_requests_csv_is_refused(run_cli, sim):
    before = (sim / "requests.csv").read_text()
    res = run_cli("report", sim, "--out", sim / "requests.csv")
    one_line(res, "a file the report of", "expected a new file")
    assert (sim / "requests.csv").read_text() == before
    one_line(run_cli("report", sim, "--out", sim / "result.json"), "a file the report of")
    assert run_cli("report", sim, "--out", sim / "report.md").code == 0  # a new file is fine


# ---------------------------------------------------------------- 2. bad files the report reads


def _rewrite_csv(path: Path, line: int, column: str, value: str) -> None:
    rows = path.read_text().splitlines()
    header = rows[0].split(",")
    cells = rows[line - 1].split(",")
    cells[header.index(column)] = value
    rows[line - 1] = ",".join(cells)
    path.write_text("\n".join(rows) + "\n")


def test_a_bad_cell_in_requests_csv_is_one_line(run_cli, sim, tmp_path):
    _rewrite_csv(sim / "requests.csv", 3, "exit", "abc")
    one_line(run_cli("report", sim, "--out", tmp_path / "r.md"), "requests.csv: line 3: exit is 'abc'",
             "expected an integer")
    _rewrite_csv(sim / "requests.csv", 3, "exit", "1")
    _rewrite_csv(sim / "requests.csv", 4, "latency_s", "soon")
    one_line(run_cli("report", sim, "--out", tmp_path / "r.md"), "line 4: latency_s is 'soon'", "expected seconds")


def test_a_requests_csv_without_its_header_is_one_line(run_cli, sim, tmp_path):
    rows = (sim / "requests.csv").read_text().splitlines()
    (sim / "requests.csv").write_text("\n".join(rows[1:]) + "\n")
    one_line(run_cli("report", sim, "--out", tmp_path / "r.md"), "requests.csv: line 1 has no column",
             "expected the header row id,entry,node,exit")


@pytest.mark.parametrize(
    "content, message",
    [([1, 2], "result.json: the file is [1, 2]; expected a JSON object"),
     ({"x": 1}, "result.json: no requests, exits, nodes; expected the result.json of cis simulate --out"),
     ({"requests": {}, "exits": [1], "nodes": {}}, "result.json: exits is [1]; expected a JSON object")],
)
def test_a_bad_sim_result_json_is_one_line(run_cli, sim, content, message):
    (sim / "result.json").write_text(json.dumps(content))
    one_line(run_cli("report", sim), message)


def _run_dir(tmp_path: Path, **files) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    good = {"config.json": {"dataset": "digits", "strategy": "uniform", "rounds": 2},
            "metrics.jsonl": [{"round": 1, "loss": {"1": 0.5}, "seconds": 1.0}],
            "summary.json": {"test": {"exit_accuracy": {"1": 0.9}, "cis_accuracy": 0.9}}}
    for name, value in {**good, **files}.items():
        text = "\n".join(json.dumps(r) for r in value) if name.endswith(".jsonl") else json.dumps(value)
        (run / name).write_text(text + "\n")
    return run


@pytest.mark.parametrize(
    "files, message",
    [({"metrics.jsonl": [{"round": 1, "loss": 5}]}, "metrics.jsonl: line 1: loss is 5; expected a JSON object"),
     ({"metrics.jsonl": [{"round": 1, "seconds": "x"}]}, "metrics.jsonl: line 1: seconds is \"x\"; expected a number"),
     ({"config.json": [1, 2]}, "config.json: the file is [1, 2]; expected a JSON object"),
     ({"summary.json": {"test": [1]}}, "summary.json: test is [1]; expected a JSON object")],
)
def test_a_bad_file_of_a_run_dir_is_one_line(run_cli, tmp_path, files, message):
    one_line(run_cli("report", _run_dir(tmp_path, **files)), message)


def test_a_good_run_dir_still_reports(run_cli, tmp_path):
    res = run_cli("report", _run_dir(tmp_path))
    assert res.code == 0 and "digits" in res.out and "1/2 rounds" in res.out, res.err


# ---------------------------------------------------------------- 9a. a run dir without metrics.jsonl


def test_a_run_dir_with_only_a_checkpoint_says_what_is_missing(run_cli, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.json").write_text(json.dumps({"dataset": "digits", "method": "cis"}))
    res = run_cli("report", run)
    assert res.code == 0, res.err
    assert "None" not in res.out, res.out
    assert "digits" in res.out and "no rounds recorded (no metrics.jsonl)" in res.out
    assert "strategy unknown (no config.json)" in res.out
    assert run_cli("report", run, "--out", tmp_path / "r.md").code == 0
    assert "None" not in (tmp_path / "r.md").read_text()


# ---------------------------------------------------------------- 4. one mode's files in simulate --out


def test_a_sweep_removes_a_single_runs_files_and_back(run_cli, paper7, sim):
    res = run_cli("simulate", "--spec", paper7, "--requests", 100, "--sweep", "arrival_rate=0.5,1", "--out", sim)
    assert res.code == 0, res.err
    left = sorted(p.name for p in sim.iterdir())
    assert left == ["sweep.csv", "sweep.json"], left
    res = run_cli("simulate", "--spec", paper7, "--requests", 100, "--out", sim)
    assert res.code == 0, res.err
    names = {p.name for p in sim.iterdir()}
    assert not names & {"sweep.csv", "sweep.json"} and "result.json" in names
    text = " ".join((DOCS / "simulator.md").read_text().split())
    assert "an earlier `--sweep`'s `sweep.json` and `sweep.csv`, is removed" in text


# ---------------------------------------------------------------- 7. the --latency-profile file


def _profile(tmp_path: Path, stages: dict | None = None, **extra) -> Path:
    path = tmp_path / "latency.json"
    stages = stages or {"1": {"1": 0.001}, "2": {"1": 0.002}, "3": {"1": 0.003}}
    path.write_text(json.dumps({"stages": stages, **extra}))
    return path


@pytest.mark.parametrize(
    "stages, extra, message",
    [(None, {"idle_slowdwn": [[0, 0]]}, "unknown key 'idle_slowdwn'; expected some of stages, idle_slowdown"),
     (None, {"bogus": 1}, "unknown key 'bogus'"),
     ({"1": {"0": 0.001}, "2": {"1": 0.002}, "3": {"1": 0.003}}, {}, "stage 1 has batch 0 in"),
     ({"1": {"1": 0.001, "4": -1}, "2": {"1": 0.002}, "3": {"1": 0.003}}, {}, "stage 1 has batch-4 time -1.0 in"),
     ({"1": {"1": 0.001}, "2": {"1": float("nan")}, "3": {"1": 0.003}}, {}, "stage 2 has batch-1 time nan in"),
     ({"1": {"1": 0.001}, "3": {"1": 0.003}}, {}, "stage 2 has batch-1 time None in"),
     (None, {"spread": [1.0, 0.0]}, "spread has 0.0; expected multipliers > 0"),
     (None, {"idle_slowdown": [[0, -1]]}, "idle_slowdown point [0.0, -1.0]"),
     (None, {"interference": -0.5}, "interference is -0.5; expected a number >= 0"),
     (None, {"message_work": -1}, "message_work is -1.0; expected seconds >= 0")],
)
def test_the_latency_profile_file_is_checked_key_by_key_and_named(run_cli, paper7, tmp_path, stages, extra,
                                                                   message):
    profile = _profile(tmp_path, stages, **extra)
    res = run_cli("simulate", "--spec", paper7, "--requests", 10, "--latency-profile", profile)
    one_line(res, message, str(profile))


def test_a_latency_profile_that_is_no_object_is_one_line(run_cli, paper7, tmp_path):
    profile = tmp_path / "latency.json"
    profile.write_text("[1, 2]")
    one_line(run_cli("simulate", "--spec", paper7, "--requests", 10, "--latency-profile", profile),
             f"--latency-profile {profile}: cannot read")


# ---------------------------------------------------------------- 10a. an empty --out


def test_an_empty_out_path_is_refused(run_cli, paper7, sim):
    one_line(run_cli("simulate", "--spec", paper7, "--requests", 10, "--out", ""), "--out is an empty path")
    one_line(run_cli("report", sim, "--out", ""), "--out is an empty path")


# ---------------------------------------------------------------- 12b. the --burst default


def test_the_burst_default_in_the_docs_and_help_is_the_transfer_caps(run_cli):
    text = " ".join((DOCS / "simulator.md").read_text().split())
    assert f"| `--burst SECONDS` | {DEFAULT_BURST_SECONDS:g} (the transfer cap's default" in text
    res = run_cli("simulate", "--help")
    assert f"(default: {DEFAULT_BURST_SECONDS:g}, the transfer cap's" in " ".join(res.out.split())
