"""The simulator's and bench's files and numbers as the docs describe them: the heartbeat rule of cis serve, the
requests.csv cell rules, bench's requests.csv in cis rates --measured, one p99, readable reports, --out, spans."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.faults import Fault
from cis.core.records import latency_summary, percentile_all, write_requests
from cis.core.spec import CisSpec, Link, Node, dumps_spec, validate
from cis.runtime.load_transports import Answer
from cis.runtime.loadgen import LoadResult
from cis.runtime.measure import measure
from cis.sim import SimConfig, simulate
from cis.sim.config import check_config
from cis.sim.links import Uplink

DOCS = Path(__file__).resolve().parents[1] / "docs"


def leaf_root(**leaf) -> CisSpec:
    return validate(CisSpec((
        Node("root", 2, address="tcp://127.0.0.1:6100"),
        Node("leaf", 1, parent="root", arrival_rate=20.0, max_transfer_rate=1e9, link=Link(1e9, 0.001),
             **leaf),
    ), 2))


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- 1. the heartbeat


@pytest.mark.parametrize("heartbeat, timeout", [(0.2, 1.0), (2.0, 10.0), (0.5, 2.5)])
def test_the_heartbeat_timeout_defaults_to_cis_serves_rule(heartbeat, timeout):
    config = check_config(SimConfig(requests=10, heartbeat=heartbeat), leaf_root(), False)
    assert config.heartbeat_timeout == timeout
    assert check_config(SimConfig(requests=10, heartbeat=2.0, heartbeat_timeout=3.0), leaf_root(),
                        False).heartbeat_timeout == 3.0


def test_a_slow_heartbeat_does_not_call_a_healthy_parent_down():
    """The outage comes after the arrivals: no forward may be served degraded. With the heartbeat timeout
    stuck at 1 s, a parent pinged every 2 s was called down between two pongs."""
    config = SimConfig(duration=20.0, heartbeat=2.0, shares={"leaf": 0.9}, faults=(Fault(25.0, "down", "leaf"),))
    result = simulate(leaf_root(), config)  # about 2 forwards a second: their replies leave gaps over 1 s
    assert result.summary["nodes"]["leaf"]["forwarded_rate"] > 1.0
    assert result.summary["nodes"]["leaf"]["degraded"] == 0 and result.summary["degraded_share"] == 0.0
    assert result.summary["config"]["heartbeat_timeout"] == 10.0


def test_a_parent_is_down_once_the_first_unanswered_ping_is_timeout_old():
    """The runtime's rule (cis.runtime.upstream.Upstream.is_up): silence counts from the first ping after the
    last answer, not from that answer, and up to when the child last listened."""
    link = Uplink.make(math.inf, 0.0, heartbeat=0.5)
    link.go_down(10.25)  # the pong of 10.0 came; the ping of 10.5 is the first unanswered
    assert link.up_at(12.49, -math.inf, 2.0)
    assert not link.up_at(12.5, -math.inf, 2.0)
    assert link.up_at(10.2, -math.inf, 2.0)
    assert Uplink.make(math.inf, 0.0).up_at(1e6, -math.inf, 1.0)  # no outage: always up


# ---------------------------------------------------------------- 2. the flags table


def test_the_docs_write_threshold_minus_inf_as_argparse_takes_it(run_cli, tmp_path):
    text = (DOCS / "simulator.md").read_text()
    assert "--threshold=-inf" in text and "`--threshold -inf`" not in text
    assert "transfer caps still apply" in text
    spec = tmp_path / "s.toml"
    spec.write_text(dumps_spec(leaf_root()))
    assert run_cli("simulate", "--spec", spec, "--requests", "5", "--threshold", "-inf").code == 2


# ---------------------------------------------------------------- 3. requests.csv flags


def test_flags_are_an_integer_for_a_served_request_and_empty_without_an_answer(tmp_path):
    path = tmp_path / "r.csv"
    write_requests(path, {"id": [0, 1, 2, 3], "outcome": ["served", "served", "dropped", "error"],
                          "flags": [0, None, 0, None]})
    write_requests(tmp_path / "s.csv", {"id": [0], "outcome": ["served"], "flags": [2]})
    assert [r["flags"] for r in csv_rows(path)] == ["0", "0", "", ""]
    assert csv_rows(tmp_path / "s.csv")[0]["flags"] == "2"


def test_the_simulators_requests_csv_writes_0_for_no_flags(run_cli, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(dumps_spec(leaf_root()))
    assert run_cli("simulate", "--spec", spec, "--requests", "50", "--out", tmp_path / "o").code == 0
    flags = {r["flags"] for r in csv_rows(tmp_path / "o" / "requests.csv") if r["outcome"] == "served"}
    assert "" not in flags and "0" in flags


# ---------------------------------------------------------------- 4. bench's requests.csv in cis rates


def test_rates_measured_maps_bench_addresses_to_the_specs_nodes(tmp_path):
    spec = leaf_root(replicas=2, addresses=("tcp://127.0.0.1:6101", "tcp://127.0.0.1:6102"))
    path = tmp_path / "requests.csv"
    entries = ["tcp://127.0.0.1:6101", "tcp://127.0.0.1:6102", "tcp://127.0.0.1:6100", "leaf"]
    write_requests(path, {"id": [0, 1, 2, 3], "entry": entries, "node": ["leaf", "root", "root", "leaf"],
                          "exit": [1, 2, 2, 1], "outcome": ["served"] * 4, "arrive_s": [0.0, 1.0, 2.0, 3.0]})
    m = measure(str(path), spec)
    assert m.nodes["leaf"].arrived == 3 and m.nodes["root"].arrived == 1
    assert m.nodes["leaf"].forwarded == 1 and m.nodes["root"].served == 2
    write_requests(path, {"id": [0, 1], "entry": ["tcp://127.0.0.1:6199"] * 2, "node": ["root"] * 2,
                          "exit": [2, 2], "outcome": ["served"] * 2, "arrive_s": [0.0, 1.0]})
    with pytest.raises(CisError, match=r"row 2: entry 'tcp://127.0.0.1:6199' is not a node of spec") as err:
        measure(str(path), spec)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- 5. cis report


def test_report_of_a_sim_folder_prints_no_python_dict(run_cli, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(dumps_spec(leaf_root()))
    assert run_cli("simulate", "--spec", spec, "--requests", "40", "--out", tmp_path / "sim").code == 0
    r = run_cli("report", tmp_path / "sim", "--out", tmp_path / "rep.md")
    assert r.code == 0, r.err
    md = (tmp_path / "rep.md").read_text()
    for text in (r.out, md):
        assert "{" not in text and "40 arrived, 40 served, 0 dropped" in text


# ---------------------------------------------------------------- 6. simulate --out


def test_simulate_checks_out_before_the_run(run_cli, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(dumps_spec(leaf_root()))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # --threshold without --bundle fails inside the run: --out is refused first
    r = run_cli("simulate", "--spec", spec, "--requests", "5", "--threshold", "0.5", "--out", blocker)
    assert r.code == 2 and "--out" in r.err and "a file; expected a folder" in r.err


def test_simulate_out_keeps_no_earlier_runs_spans(run_cli, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(dumps_spec(leaf_root()))
    out = tmp_path / "o"
    assert run_cli("simulate", "--spec", spec, "--requests", "30", "--spans", "--out", out).code == 0
    assert (out / "spans.jsonl").is_file()
    assert run_cli("simulate", "--spec", spec, "--requests", "10", "--out", out).code == 0
    assert not (out / "spans.jsonl").exists()
    assert json.loads((out / "result.json").read_text())["requests"]["arrived"] == 10


# ---------------------------------------------------------------- 7. one p99


def test_bench_p99_all_is_the_latency_p99_when_every_request_was_answered():
    n = 1977
    latency = np.random.default_rng(0).exponential(0.002, n)
    result = LoadResult("zmq", "poisson", 100.0, ["a"], ["a"] * n, np.arange(n) * 0.01, np.arange(n) * 0.01,
                        latency, [None] * n, [Answer(0, 1, "leaf")] * n, 20.0)
    s = result.summary()
    assert s["p99_all_s"] == s["latency"]["p99_s"]


def test_percentile_all_counts_an_unanswered_request_as_latest():
    x = np.linspace(0.001, 0.1, 1000)
    assert percentile_all(x, 99) == latency_summary(x)["p99_s"]
    assert percentile_all(np.concatenate([x, [math.inf] * 2]), 99) < math.inf  # 2 of 1002: the p99 is answered
    assert percentile_all(np.concatenate([x, [math.inf] * 20]), 99) == math.inf
    assert math.isnan(percentile_all([], 99))


# ---------------------------------------------------------------- 8. spans' batch


def test_every_span_of_a_visit_names_its_batch_as_the_runtime_does():
    result = simulate(leaf_root(), SimConfig(requests=200, shares={"leaf": 0.5}, spans=True, max_batch=4))
    spans = result.spans
    assert spans is not None
    batch_of = {(r, v): b for r, v, k, b in zip(spans["req"], spans["node"], spans["kind"], spans["batch"])
                if k == 1}  # compute
    assert len(batch_of) > 200
    for r, v, b in zip(spans["req"], spans["node"], spans["batch"]):
        assert b == batch_of[(r, v)] >= 1
