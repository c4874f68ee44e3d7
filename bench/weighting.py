"""When inference-aware weighting pays (issue 44 item 4): the figures README.md and docs/training.md show
between their ``<!--weighting NAME-->`` markers, each read from the paper tables' JSON.

Sources: Table 1 (printed algorithm, 300 root SGD steps, 5 seeds: table1.json), the budget curve (the same
cells at 840 and 1,400 root steps: budget_curve.json) and the steps-or-data factorial (factorial.json).
Every difference is paired on the seed against equal weighting: ``mean ± sd (signs)``.

    python -m bench.weighting        # rewrite the marked figures (bench.factorial --report also does)
"""

from __future__ import annotations

import json

from bench import doc_marks
from bench.harness import RESULTS
from bench.stats import fmt_p

SERVING = {"front": "80-15-5", "flat": "33-33-33", "back": "5-15-80"}  # who serves most: exit 1, none, the last
STRATEGIES = ("serving-rate", "balanced-adj", "flops", "auto")
BUDGETS = ("840", "1400")  # the budget curve's larger points (root SGD steps); 300 is Table 1 itself


def diff(c: dict | None) -> str:
    """A paired difference against equal, as the docs show it."""
    if not c:
        return "not run"
    if c["n"] == 1:
        return f"{c['mean']:+.1f} (one seed)"
    return f"{c['mean']:+.1f} ± {c['sd']:.1f} ({c['signs']})"


def key(*parts: str) -> str:
    return "_".join(p.replace("-", "_") for p in parts)


def table1_figures(t: dict) -> dict[str, str]:
    f: dict[str, str] = {"table1_seeds": str(len(t["seeds"]))}
    paired = t["paired_vs_equal"]["printed"]
    for where, cell in SERVING.items():
        for s in STRATEGIES:
            f[key(where, s)] = diff(paired.get(s, {}).get(cell))
        goal = t["auto_goal"].get(cell, {})
        if goal:
            f[key(where, "auto_vs_best")] = (f"{goal['auto_mean']:.1f} against {goal['best_fixed']}'s "
                                             f"{goal['best_mean']:.1f}")  # fmt: skip
    return f


def budget_figures(b: dict) -> dict[str, str]:
    f = {}
    for where in ("front", "back"):
        by = b["paired_vs_equal"][SERVING[where]]
        for s in ("serving-rate", "flops", "balanced-adj"):
            for budget in BUDGETS:
                f[key(where, s, budget)] = diff(by.get(s, {}).get(budget))
    return f


def family_sentence(tests: dict) -> str:
    """The pre-registered family in one sentence: each effect, and which survive Holm (a non-rejection said as
    one)."""
    if not tests:
        return "no runs yet"
    parts = []
    for name, c in tests.items():
        ci = f", 95 % CI [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]" if c.get("ci95") else ""
        parts.append(f"{name} {c['mean']:+.2f}{ci}, Holm p {fmt_p(c.get('holm_p'))}")
    significant = [n for n, c in tests.items() if (c.get("holm_p") or 1.0) < 0.05]
    n = min(len(c["seeds"]) for c in tests.values())
    if n < 2:
        verdict = "no test before a second seed"
    elif significant:
        verdict = f"significant after Holm: {', '.join(significant)}"
    else:
        verdict = "none significant after Holm: the seeds cannot yet tell these effects from zero"
    return f"{'; '.join(parts)} ({n} seed{'s' if n != 1 else ''}; {verdict})"


def factorial_figures(r: dict) -> dict[str, str]:
    family = r.get("effects", {}).get("family", {})
    f = {"factorial_family": family_sentence(family.get("tests", {}))}
    cell = family.get("cell", SERVING["back"])
    for name, c in r.get("conditions", {}).items():
        f[key("factorial", name, "images")] = f"{c['images']:,}"
        f[key("factorial", name, "steps")] = f"{c['root_steps']:,}"
        f[key("factorial", name)] = diff(r.get("paired_vs_equal", {}).get(name, {}).get(cell, {}).get("serving-rate"))
    regret = [f"{name} {cell_}: {x['regret']:+.2f} against {x['best_fixed']} ("
              f"{'in-sample, ' if x['in_sample'] else ''}{len(x['seeds'])} seed{'s' * (len(x['seeds']) > 1)})"
              for name, by in r.get("auto_regret", {}).items() for cell_, x in by.items()]  # fmt: skip
    f["factorial_auto_regret"] = "; ".join(regret) or "not run yet"
    return f


def figures() -> dict[str, str]:
    """Every marked figure, from the committed JSON."""
    read = {n: json.loads((RESULTS / f"{n}.json").read_text()) for n in ("table1", "budget_curve", "factorial")}
    return {**table1_figures(read["table1"]), **budget_figures(read["budget_curve"]),
            **factorial_figures(read["factorial"])}  # fmt: skip


def fill_docs() -> int:
    return doc_marks.fill("weighting", figures())


if __name__ == "__main__":
    print(f"README.md and docs/: {fill_docs()} weighting figures")
