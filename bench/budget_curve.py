"""Does the ordering of the weighting strategies move toward the paper's as the training budget grows? (issue 22)

At 80-15-5 and 5-15-80, equal, flops, serving-rate and balanced-adj are trained at three budgets
spanning more than 8x in root SGD steps, 3 seeds each: today's Table 1 scale (7,000 images, local
epochs 0.25: its runs are reused from bench/results/table1/runs), 21,000 images (2.8x the
steps) and 32,000 images at local epochs 0.5 (8.4x). Width (0.125), rounds (60) and the rest stay
as in Table 1, so only the data and the local steps grow: the budget the paper's Section 3.4 says
decides between FLOPs-like and serving-rate weights (the optimisation error shrinks with it).
A fourth budget is read, not trained, here: Table 1's larger-scale cells (``table1.py --large``, and
``--large --settings 5-15-80``): width 0.25, 100 rounds, 20,000 images, trained on a GPU and tested on
3,000 images (4.7x the root steps, along width, rounds and data instead).

Writes bench/results/budget_curve.{json,md,png}: ``budgets`` (the root's SGD steps per run at
each budget), ``per_seed`` {cell: {strategy: {budget: [CIS accuracy per seed]}}} (budget keys are
the root's SGD steps), the paired difference of each strategy against equal per budget, and a plot
of those differences against root SGD steps.

    python -m bench.budget_curve [--seeds 1,2,3] [--budgets x3,x8] [--algorithm printed|authors-code]
    python -m bench.budget_curve --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.args import common_args
from bench.harness import RESULTS, ensure_cifar, write_scale
from bench.stats import paired, stats
from bench.table1 import ALGORITHMS, PAPER_TABLE1, campaign, run_files

CELLS = ["80-15-5", "5-15-80"]
STRATEGIES = ["equal", "flops", "serving-rate", "balanced-adj"]
SHARED = ("equal", "flops")
BUDGETS: dict[str, dict] = {  # name -> the scale that differs from Table 1's (width 0.125, 60 rounds)
    "x1": {"train_subset": 7000, "local_epochs": 0.25},  # Table 1 itself
    "x3": {"train_subset": 21000, "local_epochs": 0.25},
    "x8": {"train_subset": 32000, "local_epochs": 0.5},
    "large": {"width": 0.25, "rounds": 100, "train_subset": 20000, "local_epochs": 0.25},  # table1_large's
}
READ_ONLY = ("x1", "large")  # trained by bench/table1.py (plain and --large), only read here
OUT = RESULTS / "budget_curve"


def budget_folder(name: str) -> Path:
    """Where a budget's run files live (x1: Table 1's own; large: its larger-scale cells')."""
    return {"x1": RESULTS / "table1", "large": RESULTS / "table1_large"}.get(name, OUT / name)


def collect(seeds: list[int], algorithm: str) -> tuple[dict, dict, dict]:
    """({budget: mean root SGD steps}, {cell: {strategy: {budget: {seed: accuracy}}}}, the same of the per-exit
    test accuracies (%)) of one algorithm."""
    steps, table, exits = {}, {}, {}
    for name in BUDGETS:
        records = [r for r in run_files(budget_folder(name), seeds) if r["algorithm"] == algorithm]
        records = [r for r in records if r["strategy"] in STRATEGIES]
        roots = [r["sgd_steps"]["root"] for r in records if r.get("sgd_steps")]
        if not records or not roots:
            continue
        steps[name] = sum(roots) / len(roots)
        for r in records:
            per_exit = [100 * r["exit_accuracy"][k] for k in sorted(r["exit_accuracy"], key=int)]
            for cell, acc in r["cis_accuracy"].items():
                if cell in CELLS and (r["strategy"] in SHARED or r["trained_for"] == cell):
                    table.setdefault(cell, {}).setdefault(r["strategy"], {}).setdefault(name, {})[r["seed"]] = acc
                    exits.setdefault(cell, {}).setdefault(r["strategy"], {}).setdefault(name, {})[r["seed"]] = per_exit
    return steps, table, exits


def paper_vs_equal() -> dict[str, dict[str, float]]:
    """{cell: {strategy: the paper's Table 1 mean minus equal's}} (points)."""
    eq = PAPER_TABLE1["equal"]
    return {c: {s: round(PAPER_TABLE1[s][c] - eq[c], 2) for s in STRATEGIES if s != "equal"} for c in CELLS}


def summarise(steps: dict, table: dict, seeds: list[int], exits: dict | None = None) -> dict:
    key = {name: str(round(s)) for name, s in steps.items()}  # budgets are named by their root SGD steps
    per_seed, summary, vs_equal, exit_summary = {}, {}, {}, {}
    for cell, by_strategy in (exits or {}).items():
        for strategy, by_budget in by_strategy.items():
            for name, got in by_budget.items():
                rows = [got[s] for s in seeds if s in got]
                exit_summary.setdefault(cell, {}).setdefault(strategy, {})[key[name]] = [
                    sum(col) / len(col) for col in zip(*rows)
                ]
    for cell, by_strategy in table.items():
        for strategy, by_budget in by_strategy.items():
            for name, got in by_budget.items():
                have = [s for s in seeds if s in got]
                per_seed.setdefault(cell, {}).setdefault(strategy, {})[key[name]] = [got[s] for s in have]
                summary.setdefault(cell, {}).setdefault(strategy, {})[key[name]] = {**stats([got[s] for s in have])}
                base = by_strategy.get("equal", {}).get(name, {})
                both = [s for s in have if s in base]
                if strategy != "equal" and both:
                    vs_equal.setdefault(cell, {}).setdefault(strategy, {})[key[name]] = {
                        **paired([got[s] for s in both], [base[s] for s in both]),
                        "seeds": both,
                    }
    x1 = steps.get("x1")
    return {
        "budgets": sorted(round(s) for s in steps.values()),
        "budget_scales": {key[n]: BUDGETS[n] for n in steps},
        "steps_ratio": {key[n]: s / x1 for n, s in steps.items()} if x1 else {},
        "exit_accuracy": exit_summary,
        "per_seed": per_seed,
        "summary": summary,
        "paired_vs_equal": vs_equal,
    }


def report(seeds: list[int]) -> dict:
    result = {"seeds": seeds, "cells": CELLS, "strategies": STRATEGIES}
    parts = {}
    for algorithm in ALGORITHMS:
        steps, table, exits = collect(seeds, algorithm)
        if steps:
            parts[algorithm] = summarise(steps, table, seeds, exits)
    result.update(parts.get("printed", {}))  # the printed algorithm's at the top level (the keys)
    result["paper_vs_equal"] = paper_vs_equal()
    result["by_algorithm"] = parts
    findings = RESULTS / "budget_curve_findings.md"
    result["findings"] = findings.read_text() if findings.is_file() else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "budget_curve.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Strategy ordering against the training budget (CIFAR-10, paper-7, equal partition)\n",
        f"Seeds {','.join(map(str, seeds))}; ResNet-18 width 0.125, 60 rounds, except where budget_scales says "
        "otherwise; budgets differ in training images and local epochs, and the larger-scale cells' (width 0.25, "
        "100 rounds, 20,000 images, on a GPU, 3,000 test images) also in width and rounds. A budget is named by the "
        "root's SGD steps per run. CIS accuracy (%) mean ± sd; paired difference against equal (same seed) "
        "mean ± sd (signs).\n",
    ]
    for algorithm, part in parts.items():
        lines += [f"\n## Algorithm: {algorithm}\n"]
        for cell in CELLS:
            budgets = [str(b) for b in part["budgets"]]
            lines += [f"\n### {cell}\n", "| strategy | " + " | ".join(f"{b} steps" for b in budgets) + " |"]
            lines.append("|---|" + "---|" * len(budgets))
            for strategy in STRATEGIES:
                cells = []
                for b in budgets:
                    c = part["summary"].get(cell, {}).get(strategy, {}).get(b)
                    d = part["paired_vs_equal"].get(cell, {}).get(strategy, {}).get(b)
                    text = f"{c['mean']:.1f} ± {c['sd']:.1f}" if c else "–"
                    if d:
                        text += f" ({d['mean']:+.1f} ± {d['sd']:.1f} {d['signs']})"
                    cells.append(text)
                lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    (RESULTS / "budget_curve.md").write_text("\n".join(lines) + "\n\n" + result["findings"])
    plot(parts)
    return result


def plot(parts: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    rows = list(parts)
    if not rows:
        return
    fig, axes = plt.subplots(len(rows), len(CELLS), figsize=(6 * len(CELLS), 4 * len(rows)), squeeze=False)
    for r, algorithm in enumerate(rows):
        for c, cell in enumerate(CELLS):
            ax = axes[r][c]
            for strategy, by_budget in parts[algorithm]["paired_vs_equal"].get(cell, {}).items():
                xs = sorted(by_budget, key=float)
                ax.errorbar(
                    [float(x) for x in xs],
                    [by_budget[x]["mean"] for x in xs],
                    yerr=[by_budget[x]["sd"] for x in xs],
                    marker="o",
                    capsize=3,
                    label=strategy,
                )
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xscale("log")
            ax.set_title(f"{cell} ({algorithm})")
            ax.set_xlabel("root SGD steps per run")
            ax.set_ylabel("CIS accuracy - equal's (points)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "budget_curve.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--budgets", default="x3,x8", help="budgets to train, of x3, x8 (x1 and large are Table 1's)")
    ap.add_argument("--algorithm", choices=ALGORITHMS, default="printed")
    ap.set_defaults(seeds="1,2,3")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.report:
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        cells = [(s, "33-33-33") for s in SHARED] + [(s, x) for x in CELLS for s in STRATEGIES if s not in SHARED]
        for name in [b for b in args.budgets.split(",") if b]:
            if name not in BUDGETS or name in READ_ONLY:
                trainable = ", ".join(b for b in BUDGETS if b not in READ_ONLY)
                sys.exit(f"--budgets: {name!r}; expected some of {trainable} (x1 and large come from table1.py)")
            args.train_subset, args.local_epochs = BUDGETS[name]["train_subset"], BUDGETS[name]["local_epochs"]
            out = budget_folder(name)
            out.mkdir(parents=True, exist_ok=True)
            scale = {"width": args.width, "rounds": args.rounds, **BUDGETS[name], "val_size": args.val_size}
            write_scale(out, scale, seeds)
            runs = Path(args.runs or f"/tmp/cis-bench/budget_curve_{name}")
            campaign(args, dataset, runs, out, cells, seeds, on_run=lambda: report(seeds))
    report(seeds)
    print((RESULTS / "budget_curve.md").read_text())


if __name__ == "__main__":
    main()
