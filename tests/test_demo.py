"""`cis demo` end to end in its reduced mode, and `cis report` on every kind of folder.

One quick demo (4 rounds, 200 test requests; ~20 s on the 2-core machine) is
shared by the tests of this module.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from cis.cli.main import main
from cis.cli.reports.compare import agreement, max_gap, value_gap
from cis.core.records import latency_summary

pytest.importorskip("torch")
pytest.importorskip("simpy")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "d"
    proc = subprocess.run(
        [sys.executable, "-m", "cis.cli.main", "demo", "--quick", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads(proc.stdout), proc.stderr


@pytest.mark.slow
def test_three_views_agree(demo):
    out, report, stderr = demo
    c = report["comparison"]
    shares = c["served_share"]
    for view in ("offline", "runtime", "sim"):
        assert abs(sum(shares[view].values()) - 1) < 1e-9
    for e in shares["calculus"]:  # served shares within 3 points between offline, runtime and simulator
        vals = [shares[v][e] for v in ("offline", "runtime", "sim")]
        assert max(vals) - min(vals) <= 0.03, (e, vals)
    acc = [c["accuracy"][v] for v in ("offline", "runtime", "sim")]
    assert max(acc) - min(acc) <= 0.03, acc
    assert c["agreement"]["ok"]
    # the simulator on the bundle's own (validation) profile serves the shares the thresholds were calibrated for
    assert c["agreement"]["calculus_gap_bundle_profile"] <= 0.05
    rt = report["runtime"]
    assert rt["errors"] == {} and rt["answered"] == c["settings"]["requests"] == 200
    assert (
        c["calibration"]["answered"] == c["calibration"]["requests"] > 0
    )  # the load that priced a node visit for the simulator
    for phase in ("train", "export", "serve", "replay", "stop", "simulate", "report"):
        assert f"] {phase}:" in stderr
    assert report["timings_s"]["total"] < 180


def test_report_files(demo):
    out, report, _ = demo
    md = (out / "report.md").read_text()
    for name in ("training_curves", "served_shares", "latency_cdf", "latency_profile"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000
        assert f"plots/{name}.png" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["comparison"]["served_share"] == report["comparison"]["served_share"]
    for sub in ("run/metrics.jsonl", "bundle/manifest.json", "runtime/requests.csv", "sim/result.json", "spec.toml"):
        assert (out / sub).is_file()
    assert "## Training" in md and "## Bundle" in md and "## Simulator" in md


@pytest.mark.parametrize(
    "sub,kind,section",
    [
        ("run", "run", "## Training"),
        ("bundle", "bundle", "## Bundle"),
        ("sim", "sim", "## Simulator"),
        ("", "demo", "## The three views"),
    ],
)
def test_report_each_kind(demo, tmp_path, capsys, sub, kind, section):
    out, _, _ = demo
    path = out / sub if sub else out
    md = tmp_path / "r.md"
    assert main(["report", str(path), "--out", str(md), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == kind
    assert section in md.read_text()
    assert list((tmp_path / "plots").glob("*.png"))
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.strip()


def test_report_refuses_other_folders(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a folder cis report knows" in capsys.readouterr().err


def test_demo_refuses_a_foreign_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "holds no earlier demo" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_comparison_math():
    views = {"a": {"1": 0.6, "2": 0.4}, "b": {"1": 0.55, "2": 0.45}, "c": {"1": 0.62, "2": 0.38}}
    assert max_gap(views) == pytest.approx(0.07)
    assert max_gap(views, ("a", "b")) == pytest.approx(0.05)
    assert max_gap({"a": {"1": 0.5}, "b": {"1": None}}) == math.inf
    assert value_gap({"offline": 0.9, "runtime": 0.92, "sim": None}, ("offline", "runtime")) == pytest.approx(0.02)
    lat = latency_summary(np.array([0.001, 0.002, 0.003]))
    assert lat["p50_s"] == pytest.approx(0.002) and lat["mean_s"] == pytest.approx(0.002) and lat["count"] == 3
    c = {
        "served_share": {
            "calculus": {"1": 0.6},
            "offline": {"1": 0.58},
            "runtime": {"1": 0.58},
            "sim": {"1": 0.59},
            "sim_bundle_profile": {"1": 0.6},
        },
        "accuracy": {"offline": 0.9, "runtime": 0.9, "sim": 0.95},
    }
    a = agreement(c)
    assert a["share_max_gap"] == pytest.approx(0.01) and a["calculus_gap"] == pytest.approx(0.02)
    assert not a["ok"]  # accuracy 5 points apart


def test_visit_costs_spread_the_latency_beyond_the_stages_over_the_nodes_visited():
    from cis.core.topologies import make_spec
    from cis.runtime.client import Result, ServerError
    from cis.sim.calibration import visit_costs

    spec = make_spec("paper-7", "60-30-10")
    leaf = spec.leaves[0].id
    path = [n.id for n in spec.path_to_root(leaf)]  # device, edge, cloud: exits 1, 2, 3
    stage_s = {1: 0.001, 2: 0.002, 3: 0.004}

    def answer(node: str, exit: int, latency: float) -> Result:
        return Result(
            np.zeros(1, np.int64),
            np.ones(1, np.float32),
            np.array([exit], np.int32),
            np.zeros(1, np.uint8),
            [node],
            latency,
        )

    results = [
        answer(path[0], 1, 0.003),  # 1 visit, stage 1: (3 - 1) ms
        answer(path[2], 3, 0.013),  # 3 visits, stages 1-3 (7 ms): 6 ms / 3
        answer(path[1], 2, 0.0005),  # faster than its stages: clipped at 0
        Result(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1, np.uint8), [""], 0.5, ServerError("timeout", "late")),
        None,
    ]
    costs = visit_costs(spec, stage_s, [leaf] * 5, results)
    assert costs == pytest.approx([0.002, 0.002, 0.0])
