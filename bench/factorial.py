"""Steps or data, with power: what turns serving-rate's direction against equal at 5-15-80? (issues 35, 44)

The budget curve's 840-step point changed the data (21,000 images instead of 7,000) together with the
root's SGD steps (840 instead of 300). Four conditions vary one at a time (ResNet-18 width 0.125, printed
algorithm, CIFAR-10, paper-7, equal partition, as Table 1), all trained by this script on one code and
machine (issue 44). The first, 5-seed analysis (issue 35, commit 7a97251) read A from Table 1's older runs
and D from the budget curve's x3 runs, and its B and C came from an earlier code state: retraining one of
them here (``--reproduce C:1:equal``, factorial_repro.json) did not give the same numbers (the same old
code gives today's numbers here: the machine differs, not the code), so every condition is retrained, each
in its own folder (factorial/A..E):

- A: 7,000 images, J = 5 local steps a round, 60 rounds (300 root steps);
- B: 7,000 images, J = 14 (840 root steps): steps only;
- C: 21,000 images, J = 5 (300 root steps): data only;
- D: 21,000 images, J = 14 (840 root steps): the budget curve's x3 point;
- E: 7,000 images, J = 5, 168 rounds (840 root steps): more optimisation without more drift per round.

Pre-registered before the seed 6-15 runs (issue 44): the **family** is the data, steps and interaction
contrasts at 5-15-80 on d = serving-rate - equal per seed, data ((C + D - A - B) / 2), steps
((B + D - A - C) / 2), interaction ((D - C) - (B - A)); each a one-sample t-test over the seeds 1-15 that
have all four of A-D, Holm-adjusted over these 3, alpha 0.05. Everything else is secondary and said so:
the same contrasts at 80-15-5 (seeds 1-5; Holm over their 3), E's two contrasts at 5-15-80 (optimisation
E - A, drift per round B - E; Holm over 2), and auto's regret.

Phases (what each trains; seed-major, so a partial campaign has every condition at its first seeds):

- ``core``: equal and serving-rate at 5-15-80, A-D, seeds 1-15 (the family);
- ``full``: flops and serving-rate at 80-15-5, A-D, seeds 1-5 (the secondary 80-15-5 contrasts);
- ``regret``: auto and balanced-adj at both cells, A-D, seeds 1-3 (auto's regret against every fixed
  strategy, from real auto runs; A's cells are in-sample: auto's rule was chosen on A's seeds);
- ``E``: condition E, equal and serving-rate at 5-15-80, seeds 1-15.

    python -m bench.factorial --phase core [--seeds 1,...,15] [--commit]   # train what is missing, report
    python -m bench.factorial --reproduce C:1:equal   # retrain one committed run in a scratch folder
    python -m bench.factorial --report   # also rewrites README's and docs/training.md's marked figures
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from bench import weighting
from bench.args import common_args, seeds_of
from bench.harness import RESULTS, ensure_cifar, write_scale
from bench.stats import add_holm, fmt_p, paired, paired_t_p, stats
from bench.table1 import campaign, run_files, run_name

CELLS = ["80-15-5", "5-15-80"]
FAMILY_CELL = "5-15-80"
FIXED = ("equal", "flops", "serving-rate", "balanced-adj")  # what auto's regret is taken against
STRATEGIES = ["equal", "flops", "serving-rate", "balanced-adj", "auto"]
SHARED = ("equal", "flops")  # trained once per seed ("33-33-33" in the run name), evaluated at every cell
SEEDS = list(range(1, 16))
PRIMARY = ("A", "B", "C", "D")
CONDITIONS: dict[str, dict] = {  # name -> where its runs live and its scale
    "A": {"folder": "factorial/A", "images": 7000, "root_steps": 300, "runs": "factorial_A",
          "scale": {"train_subset": 7000, "local_epochs": 0.25, "local_steps": 5}},
    "B": {"folder": "factorial/B", "images": 7000, "root_steps": 840, "runs": "factorial_B",
          "scale": {"train_subset": 7000, "local_epochs": 0.25, "local_steps": 14}},
    "C": {"folder": "factorial/C", "images": 21000, "root_steps": 300, "runs": "factorial_C",
          "scale": {"train_subset": 21000, "local_epochs": 0.25, "local_steps": 5}},
    "D": {"folder": "factorial/D", "images": 21000, "root_steps": 840, "runs": "factorial_D",
          "scale": {"train_subset": 21000, "local_epochs": 0.25, "local_steps": 14}},
    "E": {"folder": "factorial/E", "images": 7000, "root_steps": 840, "runs": "factorial_E",
          "scale": {"train_subset": 7000, "local_epochs": 0.25, "local_steps": 5, "rounds": 168}},
}  # fmt: skip
PHASES: dict[str, dict] = {  # name -> conditions, seeds, (strategy, trained-for) cells
    "core": {"conditions": PRIMARY, "seeds": SEEDS, "cells": [("equal", "33-33-33"), ("serving-rate", "5-15-80")]},
    "full": {"conditions": PRIMARY, "seeds": [1, 2, 3, 4, 5],
             "cells": [("equal", "33-33-33"), ("flops", "33-33-33"), ("serving-rate", "80-15-5")]},
    "regret": {"conditions": PRIMARY, "seeds": [1, 2, 3],
               "cells": [(s, c) for s in ("auto", "balanced-adj") for c in CELLS]},
    "E": {"conditions": ("E",), "seeds": SEEDS, "cells": [("equal", "33-33-33"), ("serving-rate", "5-15-80")]},
}  # fmt: skip
EFFECTS = {  # contrast weights on (A, B, C, D) of the per-seed d = serving-rate - equal
    "data": {"A": -0.5, "B": -0.5, "C": 0.5, "D": 0.5},
    "steps": {"A": -0.5, "B": 0.5, "C": -0.5, "D": 0.5},
    "interaction": {"A": 1.0, "B": -1.0, "C": -1.0, "D": 1.0},
}
E_EFFECTS = {  # secondary: E against A (more steps at J = 5) and B against E (the same steps, more J a round)
    "optimisation": {"E": 1.0, "A": -1.0},
    "drift": {"B": 1.0, "E": -1.0},
}
IN_SAMPLE = ("A",)  # auto's rule (cis/training/aggregation/weights.py auto_choice) was chosen on A's seeds
STEM = "factorial"


def folder(condition: str) -> Path:
    return RESULTS / CONDITIONS[condition]["folder"]


def train_condition(args, dataset: str, name: str, cells: list[tuple[str, str]], seed: int, out: Path) -> None:
    """Train the missing ``cells`` of one condition and seed; run files go to ``out``/runs."""
    c = CONDITIONS[name]
    scale = {"width": args.width, "rounds": 60, **c["scale"], "val_size": args.val_size}
    out.mkdir(parents=True, exist_ok=True)
    write_scale(out, scale, [seed])
    args.train_subset, args.local_epochs, args.rounds = scale["train_subset"], scale["local_epochs"], scale["rounds"]
    steps = {"local_steps": c["scale"]["local_steps"]} if "local_steps" in c["scale"] else None
    runs = Path(args.runs or "/tmp/cis-bench") / c["runs"]
    campaign(args, dataset, runs, out, cells, [seed], overrides=steps)


def train_missing(args, phase: str, seeds: list[int]) -> None:
    dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    plan = PHASES[phase]
    for seed in [s for s in seeds if s in plan["seeds"]]:  # seed-major
        for name in plan["conditions"]:
            train_condition(args, dataset, name, plan["cells"], seed, folder(name))


def reproduce(args, what: str) -> dict:
    """Retrain one committed run (``CONDITION:SEED:STRATEGY[:CELL]``) in a scratch folder on today's code and
    compare its accuracies with the committed file's: are that condition's earlier runs today's numbers?"""
    name, seed, strategy, *cell = what.split(":")
    trained_for = cell[0] if cell else "33-33-33"
    run = run_name(int(seed), strategy, trained_for)
    committed = json.loads((folder(name) / "runs" / f"{run}.json").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="factorial-repro-"))
    args.runs, args.commit = str(scratch / "runs-dirs"), False
    train_condition(args, f"cifar10:{ensure_cifar(Path(args.data))}", name, [(strategy, trained_for)], int(seed),
                    scratch)  # fmt: skip
    fresh = json.loads((scratch / "runs" / f"{run}.json").read_text())
    result = {
        "run": f"{name}/{run}",
        "committed": {k: committed[k] for k in ("cis_accuracy", "exit_accuracy")},
        "today": {k: fresh[k] for k in ("cis_accuracy", "exit_accuracy")},
    }
    result["identical"] = result["committed"] == result["today"]
    (RESULTS / f"{STEM}_repro.json").write_text(json.dumps(result, indent=1))
    return result


def collect(seeds: list[int]) -> tuple[dict, dict, dict]:
    """({condition: {cell: {strategy: {seed: CIS accuracy}}}}, the same of per-exit accuracies (%),
    {condition: {strategy: mean root SGD steps}}) from the run files (printed algorithm only; auto only from
    its own runs, trained for the cell)."""
    acc: dict = {}
    exits: dict = {}
    steps: dict = {}
    for name in CONDITIONS:
        for r in run_files(folder(name), seeds):
            if r["algorithm"] != "printed" or r["strategy"] not in STRATEGIES:
                continue
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


def ci95(values: list[float]) -> list[float] | None:
    """The t-based 95 % confidence interval of the mean (None below 2 values)."""
    if len(values) < 2:
        return None
    from scipy.stats import t as student_t

    a = np.asarray(values, dtype=float)
    half = float(student_t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)))
    return [round(float(a.mean()) - half, 2), round(float(a.mean()) + half, 2)]


def contrasts(acc: dict, cell: str, weights: dict[str, dict[str, float]], seeds: list[int]) -> dict:
    """Each contrast of ``weights`` on d = serving-rate - equal per seed at ``cell``, over the seeds that have
    every condition it names, with a one-sample t-test and its 95 % CI (Holm is added by the caller)."""
    d: dict[str, dict[int, float]] = {}
    for name in {n for w in weights.values() for n in w}:
        by = acc.get(name, {}).get(cell, {})
        sr, eq = by.get("serving-rate", {}), by.get("equal", {})
        d[name] = {s: sr[s] - eq[s] for s in seeds if s in sr and s in eq}
    out: dict = {}
    for effect, w in weights.items():
        complete = [s for s in seeds if all(s in d[n] for n in w)]
        values = [sum(wk * d[n][s] for n, wk in w.items()) for s in complete]
        if values:
            out[effect] = {
                **stats(values),
                "per_seed": [round(v, 2) for v in values],
                "signs": "".join("+" if v > 0 else "-" if v < 0 else "0" for v in values),
                "t_test_p": paired_t_p(np.asarray(values)),
                "ci95": ci95(values),
                "seeds": complete,
            }
    add_holm(out)
    return out


def effects(acc: dict, seeds: list[int]) -> dict:
    """The pre-registered family (FAMILY_CELL, Holm over its 3) and the secondary contrasts, each its own
    Holm family: the same 3 at the other cell, E's 2 at FAMILY_CELL."""
    other = [c for c in CELLS if c != FAMILY_CELL][0]
    return {
        "family": {"cell": FAMILY_CELL, "tests": contrasts(acc, FAMILY_CELL, EFFECTS, seeds)},
        "secondary": {
            other: contrasts(acc, other, EFFECTS, seeds),
            f"E {FAMILY_CELL}": contrasts(acc, FAMILY_CELL, E_EFFECTS, seeds),
        },
    }


def auto_regret(acc: dict) -> dict:
    """Per condition and cell: every fixed strategy's mean and auto's, over the seeds where auto (its own runs)
    and all of FIXED have runs; regret = the best fixed mean - auto's; in_sample where auto's rule was chosen."""
    out: dict = {}
    for name, by_cell in acc.items():
        for cell, by_strategy in by_cell.items():
            auto = by_strategy.get("auto", {})
            seeds = sorted(s for s in auto if all(s in by_strategy.get(f, {}) for f in FIXED))
            if not seeds:
                continue
            fixed = {f: float(np.mean([by_strategy[f][s] for s in seeds])) for f in FIXED}
            best = max(fixed, key=fixed.__getitem__)
            auto_mean = float(np.mean([auto[s] for s in seeds]))
            out.setdefault(name, {})[cell] = {
                "auto_mean": auto_mean,
                "fixed_means": fixed,
                "seeds": seeds,
                "best_fixed": best,
                "best_mean": fixed[best],
                "regret": fixed[best] - auto_mean,
                "in_sample": name in IN_SAMPLE,
            }
    return out


def verdict(c: dict) -> str:
    """One test in plain words: a rejection, or a non-rejection said as one."""
    ci = c.get("ci95")
    interval = f", 95 % CI [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
    numbers = (f"{c['mean']:+.2f} ± {c['sd']:.2f} ({c['signs']}, p {fmt_p(c['t_test_p'])}, "
               f"Holm p {fmt_p(c.get('holm_p'))}{interval})")  # fmt: skip
    if c["t_test_p"] is None:
        return f"{numbers}: one seed, no test"
    if (c.get("holm_p") or 1.0) < 0.05:
        return f"{numbers}: significant after Holm"
    return f"{numbers}: not significant; the seeds cannot tell this effect from zero (a non-rejection, not 'no effect')"


REPRO_MACHINE = "factorial_repro_machine.json"  # one committed run retrained on another machine (--reproduce)


def machine_noise() -> dict | None:
    """The committed run retrained on another machine: its run, cell and accuracy before and after (None: none)."""
    path = RESULTS / REPRO_MACHINE
    if not path.is_file():
        return None
    r, cell = json.loads(path.read_text()), "5-15-80"
    return {"run": r["run"], "cell": cell, "committed": r["committed"]["cis_accuracy"][cell],
            "retrained": r["today"]["cis_accuracy"][cell], "identical": r["identical"]}  # fmt: skip


def findings(result: dict) -> list[str]:
    """The findings, every number read from ``result``, a non-rejection said as one."""
    lines = ["## Findings (written by bench/factorial.py from factorial.json)\n"]
    fam = result["effects"]["family"]
    lines.append(f"Pre-registered family at {fam['cell']} (d = serving-rate - equal per seed; Holm over 3):\n")
    lines += [f"- {k} (seeds {len(c['seeds'])}): {verdict(c)}." for k, c in fam["tests"].items()] or ["- no runs yet."]
    lines.append("\nSecondary (each its own Holm family; exploratory):\n")
    for where, tests in result["effects"]["secondary"].items():
        lines += [f"- {where} {k} (seeds {len(c['seeds'])}): {verdict(c)}." for k, c in tests.items()]
    lines.append("\nAgainst equal at each cell (paired by seed):\n")
    for name, by_cell in result["paired_vs_equal"].items():
        for cell, by in by_cell.items():
            for strategy, c in by.items():
                lines.append(f"- {name} {cell} {strategy} - equal (seeds {len(c['seeds'])}): "
                             f"{c['mean']:+.2f} ± {c['sd']:.2f} ({c['signs']}, p {fmt_p(c['t_test_p'])}).")  # fmt: skip
    lines.append("\nauto's regret (best fixed strategy's mean - auto's; its own runs):\n")
    for name, by_cell in result["auto_regret"].items():
        for cell, r in by_cell.items():
            where = " (in-sample: the rule was chosen on these seeds)" if r["in_sample"] else ""
            seeds = ",".join(map(str, r["seeds"]))
            lines.append(f"- {name} {cell}{where}: {r['regret']:+.2f} (auto {r['auto_mean']:.2f}; best fixed "
                         f"{r['best_fixed']} {r['best_mean']:.2f}; seeds {seeds}).")  # fmt: skip
    m = result.get("machine_noise")
    if m and not m["identical"]:
        lines.append(f"\nRuns are deterministic on one machine, but the same seed trains to other numbers on another "
                     f"CPU kind ({REPRO_MACHINE}: {m['run']} at {m['cell']}, {m['committed']:.2f} committed, "
                     f"{m['retrained']:.2f} retrained). The runs span several sessions and machines, so a seed's runs "
                     "made in different sessions differ by that noise as well; run files record their CPU from "
                     "2026-11-30 on.")  # fmt: skip
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
        "auto_regret": auto_regret(acc),
        "machine_noise": machine_noise(),
    }
    result["findings"] = "\n".join(findings(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{STEM}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{STEM}.md").write_text(markdown(result) + "\n\n" + result["findings"] + "\n")
    return result


def cell_table(result: dict, cell: str) -> list[str]:
    """One cell's strategies x conditions: mean ± sd (n) [paired difference against equal], then per-exit means."""
    names = list(CONDITIONS)
    lines = [f"\n## {cell}\n", "| strategy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for strategy in STRATEGIES:
        row = []
        for n in names:
            c = result["summary"].get(n, {}).get(cell, {}).get(strategy)
            d = result["paired_vs_equal"].get(n, {}).get(cell, {}).get(strategy)
            text = f"{c['mean']:.2f} ± {c['sd']:.2f} (n {c['n']})" if c else "–"
            row.append(text + (f" [{d['mean']:+.2f} ± {d['sd']:.2f} {d['signs']}]" if d else ""))
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    lines += ["", "Per-exit test accuracy (%), mean over seeds, exits 1/2/3:\n",
              "| strategy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]  # fmt: skip
    for strategy in STRATEGIES:
        row = [" / ".join(f"{v:.1f}" for v in result["exit_accuracy"].get(n, {}).get(cell, {}).get(strategy, []))
               or "–" for n in names]  # fmt: skip
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    return lines


def effect_table(title: str, tests: dict) -> list[str]:
    lines = ["", title + "\n", "| effect | mean ± sd | 95 % CI | per seed | p | Holm p |", "|---|---|---|---|---|---|"]
    for k, c in tests.items():
        ci = f"[{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]" if c.get("ci95") else "–"
        p, h = fmt_p(c["t_test_p"], 4), fmt_p(c.get("holm_p"), 4)
        lines.append(f"| {k} | {c['mean']:+.2f} ± {c['sd']:.2f} | {ci} | {c['per_seed']} | {p} | {h} |")
    return lines


def markdown(result: dict) -> str:
    lines = [
        "# Steps or data: a 2x2 factorial (+ E) at 80-15-5 and 5-15-80 (CIFAR-10, paper-7, printed algorithm)\n",
        "ResNet-18 width 0.125, one code and machine for every condition. Conditions: "
        + "; ".join(f"{n}: {c['images']:,} images, {c['root_steps']} root SGD steps" for n, c in CONDITIONS.items())
        + ". CIS accuracy (%) mean ± sd over seeds; in brackets the paired difference against equal (mean ± sd, "
        "the sign per seed).\n",
    ]
    for cell in CELLS:
        lines += cell_table(result, cell)
    fam = result["effects"]["family"]
    lines += effect_table(f"## The pre-registered family at {fam['cell']} (d = serving-rate - equal; Holm over 3)",
                          fam["tests"])  # fmt: skip
    for where, tests in result["effects"]["secondary"].items():
        lines += effect_table(f"## Secondary: {where} (its own Holm family)", tests)
    lines += ["", "## Root SGD steps per run (mean over run files)\n",
              "| condition | " + " | ".join(STRATEGIES) + " |", "|---|" + "---|" * len(STRATEGIES)]  # fmt: skip
    for n in CONDITIONS:
        by = result["root_sgd_steps"].get(n, {})
        lines.append(f"| {n} | " + " | ".join(f"{by[s]:.0f}" if s in by else "–" for s in STRATEGIES) + " |")
    lines += ["", "## auto's regret (best fixed strategy's mean - auto's, auto's own runs)\n",
              "| condition | cell | in-sample | auto | " + " | ".join(FIXED) + " | regret |",
              "|---|---|---|---|" + "---|" * len(FIXED) + "---|"]  # fmt: skip
    for n, by in result["auto_regret"].items():
        for cell, r in by.items():
            fixed = " | ".join(f"{r['fixed_means'][f]:.2f}" for f in FIXED)
            lines.append(f"| {n} | {cell} | {'yes' if r['in_sample'] else 'no'} | {r['auto_mean']:.2f} "
                         f"(seeds {','.join(map(str, r['seeds']))}) | {fixed} | {r['regret']:+.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.set_defaults(seeds=",".join(map(str, SEEDS)))
    ap.add_argument("--phase", choices=list(PHASES), default="core", help="what to train (default core)")
    ap.add_argument("--reproduce", metavar="COND:SEED:STRATEGY[:CELL]", help="retrain one committed run to compare")
    args = ap.parse_args()
    seeds = seeds_of(args)
    if args.reproduce:
        print(json.dumps(reproduce(args, args.reproduce), indent=1))
        return
    if not args.report:
        train_missing(args, args.phase, seeds)
    report(seeds)
    print((RESULTS / f"{STEM}.md").read_text())
    print(f"README.md and docs/: {weighting.fill_docs()} weighting figures rewritten")


if __name__ == "__main__":
    main()
