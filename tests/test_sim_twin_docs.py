"""docs/simulator.md's "how close" figures are the benchmarks' json, not hand-copied numbers (issue 36): the blocks
that bench/twin_hard.py and twin_spans.py write into the doc match what they write from the json now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["twin_hard", "twin_spans"])
def test_the_docs_figures_are_the_results_json(name):
    import importlib

    from bench.doc_marks import read_doc_block

    module = importlib.import_module(f"bench.{name}")
    result = json.loads((REPO / "bench" / "results" / f"{name}.json").read_text())
    block = read_doc_block(REPO / "docs" / "simulator.md", name)
    assert block is not None, f"docs/simulator.md has no {name} block"
    assert block == module.how_close(result).strip("\n")


def test_a_doc_block_is_replaced_between_its_markers(tmp_path):
    from bench.doc_marks import doc_block, read_doc_block, write_doc_block

    begin, end = doc_block("bench")
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{begin}\nold figures\n{end}\nafter\n")
    assert write_doc_block(doc, "bench", "new figures")
    assert doc.read_text() == f"before\n{begin}\nnew figures\n{end}\nafter\n"
    assert read_doc_block(doc, "bench") == "new figures"
    assert not write_doc_block(doc, "other", "x") and read_doc_block(doc, "other") is None


def test_update_lists_only_the_runs_whose_figures_are_kept():
    """twin_hard --update: a run whose every regime was run again drops out of the result's list of runs."""
    from bench.twin_hard import merged

    def run(command, regimes):
        return {"command": command, "machine": {}, "regimes": regimes}

    old = {"runs": [run("a", ["bottleneck", "capacity"]), run("b", ["links"]), run("c", ["capacity", "partition"])]}
    new = {"runs": [run("d", ["bottleneck", "capacity"])]}
    assert [r["command"] for r in merged(old, new)["runs"]] == ["b", "c", "d"]


def test_twin_spans_update_keeps_the_other_cases_with_the_run_that_made_them():
    """twin_spans --update: the cases just run replace their own; the others keep their command and machine."""
    from bench.twin_spans import merged, runs_text

    machine = {"cpus": 2, "platform": "Linux", "load_avg": [0.5, 0.5, 0.5]}
    old = {"command": "a", "machine": machine, "cases": {"loopback": {"points": []}, "colocated": {"points": [1]}}}
    new = {"command": "b", "machine": machine, "cases": {"colocated": {"points": [2], "run": {"command": "b",
                                                                                              "machine": machine}}}}
    out = merged(old, new)
    assert out["cases"]["colocated"]["points"] == [2]
    assert out["cases"]["loopback"]["run"]["command"] == "a"
    assert runs_text(out).startswith("loopback: `a`") and "colocated: `b`" in runs_text(out)


def test_twin_hard_json_has_each_regime_of_issue_23_at_the_top():
    """Issue 23: twin_hard.json holds, per regime (bottleneck, links, partition, capacity), the measured and
    simulated figures; finish() writes each under its own key."""
    from bench.twin_hard import finish

    result = json.loads((REPO / "bench" / "results" / "twin_hard.json").read_text())
    for regime in ("bottleneck", "links", "partition", "capacity"):
        assert regime in result and regime in result["targets_met"], regime
    assert result["capacity"] == result["bottleneck"]["capacity"]
    assert result["links"]["fp32"] == result["testbed"]["fp32"]["links"]
    again = finish({k: v for k, v in result.items() if k not in ("links", "partition", "capacity")})
    assert again["partition"] == result["partition"]
