"""The campaign reports read run files as documented: the larger-scale Table 1 cells are every setting their runs
were trained for (equal's shared run holds them all), and the budget curve reads those cells as its ``large``
budget without training it (bench/table1.py, bench/budget_curve.py; issue 22)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import budget_curve, table1

SEEDS = [1, 2, 3]


def write_run(folder: Path, seed: int, strategy: str, trained_for: str, accuracy: dict[str, float]) -> None:
    name = table1.run_name(seed, strategy, trained_for)
    record = {"seed": seed, "strategy": strategy, "trained_for": trained_for, "cis_accuracy": accuracy,
              "exit_accuracy": {"1": 0.3, "2": 0.4, "3": 0.5 + seed / 100},
              "sgd_steps": {"total": 9800, "root": 1400}, "device": "cuda:0 (test)"}  # fmt: skip
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "runs" / f"{name}.json").write_text(json.dumps(record))


@pytest.fixture
def large(tmp_path: Path) -> Path:
    out = tmp_path / "table1_large"
    for seed in SEEDS:
        write_run(out, seed, "equal", "80-15-5", {"80-15-5": 50.0, "33-33-33": 60.0, "5-15-80": 67.0 + seed / 10})
        write_run(out, seed, "serving-rate", "80-15-5", {"80-15-5": 53.0})
        write_run(out, seed, "flops", "5-15-80", {"80-15-5": 47.0, "33-33-33": 60.0, "5-15-80": 68.0 + seed / 10})
        write_run(out, seed, "serving-rate", "5-15-80", {"5-15-80": 66.0 + seed / 10})
    (out / "scale.json").write_text(json.dumps({"width": 0.25, "rounds": 100, "train_subset": 20000, "seeds": SEEDS}))
    return out


def test_large_cells_are_the_settings_trained_for(large: Path) -> None:
    part, line = table1.large_cell(large, table1.load_scale(large))
    assert part["cells"] == ["80-15-5", "5-15-80"]  # not 33-33-33: nothing was trained for it
    assert part["per_seed"]["equal"]["5-15-80"] == pytest.approx([67.1, 67.2, 67.3])  # the shared run's
    assert part["paired_vs_equal"]["flops"]["5-15-80"]["mean"] == pytest.approx(1.0)
    assert part["paired_vs_equal"]["serving-rate"]["5-15-80"]["mean"] == pytest.approx(-1.0)
    assert part["paired_vs_equal"]["serving-rate"]["80-15-5"]["signs"] == "+++"
    assert "80-15-5 and 5-15-80" in line and "5-15-80: equal 67.2" in line


def test_budget_curve_reads_the_large_cells_as_a_budget(large: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folders = {"large": large}
    monkeypatch.setattr(budget_curve, "budget_folder", lambda name: folders.get(name, large.parent / name))
    steps, table, exits = budget_curve.collect(SEEDS, "printed")
    assert steps == {"large": 1400}
    assert table["5-15-80"]["flops"]["large"] == pytest.approx({1: 68.1, 2: 68.2, 3: 68.3})
    assert table["80-15-5"]["serving-rate"]["large"][1] == 53.0  # each per-setting run in the cell it was trained for
    assert table["5-15-80"]["serving-rate"]["large"][1] == pytest.approx(66.1)
    part = budget_curve.summarise(steps, table, SEEDS, exits)
    assert part["budgets"] == [1400] and part["budget_scales"]["1400"]["width"] == 0.25
    # per-exit accuracies (%) averaged over the seeds, per cell: a shared run's hold for every cell
    assert part["exit_accuracy"]["5-15-80"]["flops"]["1400"] == pytest.approx([30.0, 40.0, 52.0])
    assert part["exit_accuracy"]["80-15-5"]["flops"]["1400"] == pytest.approx([30.0, 40.0, 52.0])
    assert part["steps_ratio"] == {}  # no x1 budget here to divide by


def test_budget_curve_states_the_papers_differences() -> None:
    got = budget_curve.paper_vs_equal()
    assert got["80-15-5"]["serving-rate"] == pytest.approx(4.3) and got["80-15-5"]["flops"] == pytest.approx(-17.8)
    assert got["5-15-80"]["balanced-adj"] == pytest.approx(2.5)


def test_table1_reports_exit_accuracies_and_auto_against_the_best(large: Path) -> None:
    exits = table1.collect_exits(large, SEEDS)["printed"]
    assert exits["equal"]["80-15-5"] == pytest.approx([30.0, 40.0, 52.0])
    summary = {"auto": {"x": {"mean": 50.0}}, "flops": {"x": {"mean": 51.0, "sd": 0.5}}}
    table = {"auto": {"x": {1: 50.0, 2: 49.0}}, "flops": {"x": {1: 51.0, 2: 51.0}}}
    goal = table1.auto_goal(summary, ["x"], table=table)["x"]
    assert goal["best_fixed"] == "flops" and goal["auto_minus_best"]["mean"] == pytest.approx(-1.5)
    assert goal["auto_minus_best"]["signs"] == "--" and goal["auto_minus_best"]["seeds"] == [1, 2]


def test_budget_curve_refuses_to_train_a_read_only_budget(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["budget_curve.py", "--budgets", "large", "--data", "/nonexistent"])
    monkeypatch.setattr(budget_curve, "ensure_cifar", lambda path: path)
    with pytest.raises(SystemExit) as exc:
        budget_curve.main()
    assert "x1 and large come from table1.py" in str(exc.value)
