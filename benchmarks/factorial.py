"""Steps or data: what turns serving-rate's direction against equal at 5-15-80? A 2x2 factorial (issue 35).

The budget curve's 840-step point changed the data (21,000 images instead of 7,000) together with the
root's SGD steps (840 instead of 300), so it cannot tell which of the two moved serving-rate from below
equal to above it at 5-15-80. The four conditions vary one at a time (ResNet-18 width 0.125, 60 rounds,
printed algorithm, CIFAR-10, paper-7, equal partition, as Table 1):

- A: 7,000 images, J = 5 local steps a round (300 root steps): Table 1's runs, read from table1/runs;
- B: 7,000 images, J = 14 (840 root steps): steps only (``local_steps`` fixed, so the steps match D's exactly);
- C: 21,000 images, J = 5 (300 root steps): data only;
- D: 21,000 images, J = 14 (840 root steps): the budget curve's x3 runs (budget_curve/x3/runs), seeds 4-5 added.

Strategies equal, flops (trained once per seed, evaluated at every cell) and serving-rate (per cell), at
80-15-5 and 5-15-80, seeds 1-5; ``auto`` at 80-15-5 (where it is the serving ramp) for B, C, D at seeds 1-3,
so auto's regret is judged over every condition (at 5-15-80 auto IS flops: its runs are flops's).

The analysis (``--report``) pairs runs by seed inside each condition: each strategy's difference against
equal per condition, then on d = serving-rate - equal per seed the main effect of data ((C + D - A - B) / 2),
of steps ((B + D - A - C) / 2) and their interaction ((D - C) - (B - A)), each a one-sample t-test over the
seeds that have all four conditions, Holm-adjusted over the family of these 6 tests (3 effects x 2 cells).
The findings section is written from those numbers only.

    python benchmarks/factorial.py [--seeds 1,2,3,4,5] [--commit]     # train what is missing, then report
    python benchmarks/factorial.py --report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from _args import common_args, seeds_of
from _results import RESULTS, ensure_cifar, write_scale
from _stats import add_holm, fmt_p, paired, paired_t_p, stats
from table1 import campaign, run_files

CELLS = ["80-15-5", "5-15-80"]
STRATEGIES = ["equal", "flops", "serving-rate"]
SHARED = ("equal", "flops")
AUTO_CELL = "80-15-5"  # auto is the serving ramp here; at 5-15-80 it is flops (training/aggregation/weights.py)
AUTO_SEEDS = [1, 2, 3]
CONDITIONS: dict[str, dict] = {  # name -> where its runs live, its scale, and what this script may train
    "A": {"folder": "table1", "images": 7000, "root_steps": 300, "trainable": False,
          "scale": {"train_subset": 7000, "local_epochs": 0.25}},
    "B": {"folder": "factorial/B", "images": 7000, "root_steps": 840, "trainable": True,
          "scale": {"train_subset": 7000, "local_epochs": 0.25, "local_steps": 14}},
    "C": {"folder": "factorial/C", "images": 21000, "root_steps": 300, "trainable": True,
          "scale": {"train_subset": 21000, "local_epochs": 0.25, "local_steps": 5}},
    "D": {"folder": "budget_curve/x3", "images": 21000, "root_steps": 840, "trainable": True,
          "scale": {"train_subset": 21000, "local_epochs": 0.25}},
}  # fmt: skip
EFFECTS = {  # contrast weights on (A, B, C, D) of the per-seed d = serving-rate - equal
    "data": (-0.5, -0.5, 0.5, 0.5),
    "steps": (-0.5, 0.5, -0.5, 0.5),
    "interaction": (1.0, -1.0, -1.0, 1.0),
}
STEM = "factorial"


def folder(condition: str) -> Path:
    return RESULTS / CONDITIONS[condition]["folder"]


def cells_to_train(seed: int) -> list[tuple[str, str]]:
    cells = [(s, "33-33-33") for s in SHARED] + [("serving-rate", x) for x in CELLS]
    return cells + ([("auto", AUTO_CELL)] if seed in AUTO_SEEDS else [])


def train_missing(args, seeds: list[int]) -> None:
    dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    for seed in seeds:  # seed-major: a partial campaign has every condition at its first seeds
        for name, c in CONDITIONS.items():
            if not c["trainable"]:
                continue
            out = folder(name)
            out.mkdir(parents=True, exist_ok=True)
            scale = {"width": args.width, "rounds": args.rounds, **c["scale"], "val_size": args.val_size}
            write_scale(out, scale, [seed])
            args.train_subset, args.local_epochs = c["scale"]["train_subset"], c["scale"]["local_epochs"]
            steps = {"local_steps": c["scale"]["local_steps"]} if "local_steps" in c["scale"] else None
            runs = Path(args.runs or "/tmp/cis-bench") / ("budget_curve_x3" if name == "D" else f"factorial_{name}")
            campaign(args, dataset, runs, out, cells_to_train(seed), [seed], overrides=steps)


def collect(seeds: list[int]) -> tuple[dict, dict, dict]:
    """({condition: {cell: {strategy: {seed: CIS accuracy}}}}, the same of per-exit accuracies (%),
    {condition: {strategy: mean root SGD steps}}) from the run files (printed algorithm only)."""
    acc: dict = {}
    exits: dict = {}
    steps: dict = {}
    for name in CONDITIONS:
        for r in run_files(folder(name), seeds):
            if r["algorithm"] != "printed" or r["strategy"] not in (*STRATEGIES, "auto"):
                continue
            if r["strategy"] == "auto" and (r["seed"] not in AUTO_SEEDS or r["trained_for"] != AUTO_CELL):
                continue  # at 5-15-80 auto is flops's code path: its runs are flops's (same machine, same numbers)
            if r.get("sgd_steps"):
                steps.setdefault(name, {}).setdefault(r["strategy"], []).append(r["sgd_steps"]["root"])
            for cell, value in r["cis_accuracy"].items():
                if cell in CELLS and (r["strategy"] in SHARED or r["trained_for"] == cell):
                    acc.setdefault(name, {}).setdefault(cell, {}).setdefault(r["strategy"], {})[r["seed"]] = value
                    per_exit = [100 * r["exit_accuracy"][k] for k in sorted(r["exit_accuracy"], key=int)]
                    exits.setdefault(name, {}).setdefault(cell, {}).setdefault(r["strategy"], {})[r["seed"]] = per_exit
    mean_steps = {n: {s: sum(v) / len(v) for s, v in by.items()} for n, by in steps.items()}
    return acc, exits, mean_steps


def per_condition(acc: dict, exits: dict, seeds: list[int]) -> tuple[dict, dict, dict]:
    """Per condition and cell: each strategy's mean ± sd, its mean per-exit accuracies, and its paired
    difference against equal (the seeds both have)."""
    summary: dict = {}
    exit_summary: dict = {}
    vs_equal: dict = {}
    for name, by_cell in acc.items():
        for cell, by_strategy in by_cell.items():
            base = by_strategy.get("equal", {})
            for strategy, got in by_strategy.items():
                have = [s for s in seeds if s in got]
                summary.setdefault(name, {}).setdefault(cell, {})[strategy] = {**stats([got[s] for s in have]),
                                                                               "seeds": have}  # fmt: skip
                rows = [exits[name][cell][strategy][s] for s in have]
                exit_summary.setdefault(name, {}).setdefault(cell, {})[strategy] = [
                    round(sum(col) / len(col), 2) for col in zip(*rows)
                ]
                both = [s for s in have if s in base]
                if strategy != "equal" and both:
                    vs_equal.setdefault(name, {}).setdefault(cell, {})[strategy] = {
                        **paired([got[s] for s in both], [base[s] for s in both]),
                        "seeds": both,
                    }
    return summary, exit_summary, vs_equal


def effects(acc: dict, seeds: list[int]) -> dict:
    """Per cell, the data, steps and interaction contrasts on d = serving-rate - equal, paired by seed,
    Holm-adjusted over all of them (one family)."""
    out: dict = {}
    for cell in CELLS:
        d = {}
        for name in CONDITIONS:
            by = acc.get(name, {}).get(cell, {})
            sr, eq = by.get("serving-rate", {}), by.get("equal", {})
            d[name] = {s: sr[s] - eq[s] for s in seeds if s in sr and s in eq}
        complete = [s for s in seeds if all(s in d[n] for n in CONDITIONS)]
        for effect, w in EFFECTS.items():
            values = [sum(wk * d[n][s] for wk, n in zip(w, CONDITIONS)) for s in complete]
            if not values:
                continue
            out.setdefault(cell, {})[effect] = {
                **stats(values),
                "per_seed": [round(v, 2) for v in values],
                "signs": "".join("+" if v > 0 else "-" if v < 0 else "0" for v in values),
                "t_test_p": paired_t_p(np.asarray(values)),
                "seeds": complete,
            }
    add_holm({f"{cell} {e}": c for cell, by in out.items() for e, c in by.items()})
    return out


def auto_regret(acc: dict) -> dict:
    """Per condition and cell: the best fixed strategy's mean minus auto's, both over auto's seeds (auto at
    5-15-80 is flops), so a strategy with more seeds is not compared on a different sample."""
    out: dict = {}
    for name, by_cell in acc.items():
        for cell, by_strategy in by_cell.items():
            auto = by_strategy.get("auto" if cell == AUTO_CELL else "flops", {})
            seeds = sorted(s for s in auto if all(s in by_strategy.get(f, {}) for f in STRATEGIES))
            if not seeds:
                continue
            fixed = {f: float(np.mean([by_strategy[f][s] for s in seeds])) for f in STRATEGIES}
            auto_mean = float(np.mean([auto[s] for s in seeds]))
            best = max(fixed, key=fixed.__getitem__)
            out.setdefault(name, {})[cell] = {
                "auto_is": "serving-ramp" if cell == AUTO_CELL else "flops",
                "auto_mean": auto_mean,
                "auto_seeds": seeds,
                "best_fixed": best,
                "best_mean": fixed[best],
                "regret": fixed[best] - auto_mean,
            }
    return out


def findings(result: dict) -> list[str]:
    """The findings, every number read from ``result``: which of data and steps moves serving-rate - equal."""
    lines = ["## Findings (written by benchmarks/factorial.py from factorial.json)\n"]
    for cell in CELLS:
        e = result["effects"].get(cell)
        if not e:
            lines.append(f"- {cell}: not every condition has runs yet.")
            continue
        moved = [k for k in ("data", "steps") if (e[k].get("holm_p") or 1.0) < 0.05]
        parts = ", ".join(
            f"{k} {c['mean']:+.2f} ± {c['sd']:.2f} ({c['signs']}, Holm p {fmt_p(c['holm_p'])})"
            for k, c in ((k, e[k]) for k in EFFECTS)
        )
        if len(e["data"]["seeds"]) < 2:
            verdict = "one seed so far, no test: nothing can be said yet about what moves"
        elif moved:
            verdict = " and ".join(moved) + (" moves" if len(moved) == 1 else " move")
        else:
            bigger = max(("data", "steps"), key=lambda k: abs(e[k]["mean"]))
            verdict = f"neither effect is significant after Holm ({bigger} has the larger mean); nothing moves"
        seeds = ",".join(map(str, e["data"]["seeds"]))
        lines.append(f"- {cell}: {verdict} serving-rate minus equal (seeds {seeds}): {parts}.")
    for name, by_cell in result["auto_regret"].items():
        for cell, r in by_cell.items():
            lines.append(
                f"- auto regret, {name} {cell}: {r['regret']:+.2f} (auto = {r['auto_is']} {r['auto_mean']:.2f}; "
                f"best fixed {r['best_fixed']} {r['best_mean']:.2f}; seeds {','.join(map(str, r['auto_seeds']))})."
            )
    return lines


def report(seeds: list[int]) -> dict:
    acc, exits, steps = collect(seeds)
    summary, exit_summary, vs_equal = per_condition(acc, exits, seeds)
    result = {
        "seeds": seeds,
        "cells": CELLS,
        "conditions": {n: {k: c[k] for k in ("folder", "images", "root_steps")} for n, c in CONDITIONS.items()},
        "summary": summary,
        "exit_accuracy": exit_summary,
        "paired_vs_equal": vs_equal,
        "effects": effects(acc, seeds),
        "root_sgd_steps": steps,
    }
    result["auto_regret"] = auto_regret(acc)
    text = findings(result)
    result["findings"] = "\n".join(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{STEM}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{STEM}.md").write_text(markdown(result) + "\n\n" + result["findings"] + "\n")
    return result


def markdown(result: dict) -> str:
    lines = [
        "# Steps or data: a 2x2 factorial at 80-15-5 and 5-15-80 (CIFAR-10, paper-7, printed algorithm)\n",
        "ResNet-18 width 0.125, 60 rounds. Conditions: "
        + "; ".join(f"{n}: {c['images']:,} images, {c['root_steps']} root SGD steps" for n, c in CONDITIONS.items())
        + ". CIS accuracy (%) mean ± sd over seeds; in brackets the paired difference against equal (mean ± sd, "
        "the sign per seed).\n",
    ]
    for cell in CELLS:
        lines += [f"\n## {cell}\n", "| strategy | " + " | ".join(CONDITIONS) + " |", "|---|" + "---|" * len(CONDITIONS)]
        for strategy in (*STRATEGIES, "auto"):
            row = []
            for n in CONDITIONS:
                c = result["summary"].get(n, {}).get(cell, {}).get(strategy)
                d = result["paired_vs_equal"].get(n, {}).get(cell, {}).get(strategy)
                text = f"{c['mean']:.2f} ± {c['sd']:.2f} (n {c['n']})" if c else "–"
                row.append(text + (f" [{d['mean']:+.2f} ± {d['sd']:.2f} {d['signs']}]" if d else ""))
            lines.append(f"| {strategy} | " + " | ".join(row) + " |")
        lines += ["", "Per-exit test accuracy (%), mean over seeds, exits 1/2/3:\n",
                  "| strategy | " + " | ".join(CONDITIONS) + " |", "|---|" + "---|" * len(CONDITIONS)]  # fmt: skip
        for strategy in (*STRATEGIES, "auto"):
            row = [
                " / ".join(f"{v:.1f}" for v in result["exit_accuracy"].get(n, {}).get(cell, {}).get(strategy, []))
                or "–"
                for n in CONDITIONS
            ]
            lines.append(f"| {strategy} | " + " | ".join(row) + " |")
        e = result["effects"].get(cell, {})
        if e:
            lines += ["", "Effects on serving-rate - equal (per seed, then a one-sample t-test; Holm over 6):\n",
                      "| effect | mean ± sd | per seed | p | Holm p |", "|---|---|---|---|---|"]  # fmt: skip
            for k, c in e.items():
                p, h = fmt_p(c["t_test_p"], 4), fmt_p(c.get("holm_p"), 4)
                lines.append(f"| {k} | {c['mean']:+.2f} ± {c['sd']:.2f} | {c['per_seed']} | {p} | {h} |")
    lines += ["", "## Root SGD steps per run (mean over run files)\n", "| condition | " + " | ".join(
        (*STRATEGIES, "auto")) + " |", "|---|" + "---|" * 4]  # fmt: skip
    for n in CONDITIONS:
        by = result["root_sgd_steps"].get(n, {})
        lines.append(f"| {n} | " + " | ".join(f"{by[s]:.0f}" if s in by else "–" for s in (*STRATEGIES, "auto")) + " |")
    lines += ["", "## auto's regret (best fixed strategy's mean - auto's)\n",
              "| condition | cell | auto is | auto | best fixed | regret |", "|---|---|---|---|---|---|"]  # fmt: skip
    for n, by in result["auto_regret"].items():
        for cell, r in by.items():
            lines.append(
                f"| {n} | {cell} | {r['auto_is']} | {r['auto_mean']:.2f} (seeds {','.join(map(str, r['auto_seeds']))})"
                f" | {r['best_fixed']} {r['best_mean']:.2f} | {r['regret']:+.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    args = ap.parse_args()
    seeds = seeds_of(args)
    if not args.report:
        train_missing(args, seeds)
    report(seeds)
    print((RESULTS / f"{STEM}.md").read_text())


if __name__ == "__main__":
    main()
