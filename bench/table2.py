"""The CIS paper's Table 2 over several seeds: highly biased partition, 80-15-5, serving-rate with p = 0 vs p = 0.2.

The paper finds that letting stronger nodes also train lower exits (p = 0.2)
gains 8 points; at reduced scale it lost points (issue 17). Two modes:

- ``--diagnose``: one seed, the paper's rule against diagnostic variants
  (the literal BatchNorm rule, coefficients capped at 1 or self-normalised per
  exit, the authors' multiply rule, more local steps for lower exits). From each
  run's metrics.jsonl it reports the total coefficient per stage body and exit
  head per round and the BatchNorm variances clamped at 0
  (table2_diagnostics.json/.md).
- the campaign (default): 5 seeds of equal p = 0, serving-rate p = 0, 0.2 and 0.4
  under the paper's rule (with the default BatchNorm rule), p = 0.2 under each
  ``--variants`` (default: the literal BatchNorm rule and the self-normalised
  coefficients), and the step-matched controls (``--controls``): p = 0 and p = 0.2
  self-normalised with as many SGD steps as the flops-steps variant, spread evenly
  (J' = J x E[steps of a flops-steps round] / (N J)). With ``--algorithm authors-code``:
  equal p = 0 and serving-rate p = 0, 0.2, 0.4 under the authors' code (run files end
  in ``_authors-code``). Each finished run writes
  bench/results/table2/runs/<run>.json at once (with its SGD steps and its
  validation CIS accuracy); table2.json/.md are rebuilt from those files after every
  run, with the algorithm as a level and every comparison's paired t-test p and
  Holm-adjusted p over its algorithm's table.

The authors' p-ablation scripts pass ``--sampled-probability-per-layer 0.4-0.8``: the
root trains exits 1/2/3 with 0.4/0.4/0.2, an edge 0.4/0.6, i.e. the paper's rule at
p = 0.4 (the paper's text says 0.2): both are in the table.

    python -m bench.table2 [--quick] [--seeds 1,2,3,4,5] [--variants bn-literal,self-normalised] [--diagnose]
                                [--algorithm printed|authors-code] [--controls]
    python -m bench.table2 --report
Same scale flags as table1.py (60 rounds, width 0.125, 7000 images, local epochs 0.25 by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.args import common_args, quick, scale_of, seeds_of
from bench.campaign import claim, save_run
from bench.harness import RESULTS, ensure_cifar, write_scale
from bench.models import train
from bench.stats import add_holm, fmt_test, paired, stats

PAPER = {"equal p=0": 36.5, "serving-rate p=0": 41.3, "serving-rate p=0.2": 49.2}  # their runs: p = 0.4 (above)
ALGORITHMS = ("printed", "authors-code")
MATCH_FLOPS_STEPS = "match flops-steps"  # a control's local_steps: as many SGD steps as the flops-steps variant
FLOPS_STEPS_P = 0.2  # the p of the flops-steps variants the controls match, whatever the control's own p
CONTROLS: dict[str, tuple[float, dict]] = {  # step-matched controls of the flops-steps variants (issue 22)
    "serving-rate p=0 steps-matched": (0.0, {"local_steps": MATCH_FLOPS_STEPS}),
    "serving-rate p=0.2 self-normalised steps-matched": (
        0.2,
        {"coefficient_rule": "self-normalised", "local_steps": MATCH_FLOPS_STEPS},
    ),
}
CONTROL_PAIRS = (  # (run, its baseline): the controls' family of comparisons, Holm-adjusted among themselves
    ("serving-rate p=0 steps-matched", "serving-rate p=0"),  # more steps alone, at p = 0
    ("serving-rate p=0.2 self-normalised steps-matched", "serving-rate p=0 steps-matched"),  # p, at the same steps
    ("serving-rate p=0.2 self-normalised+flops-steps", "serving-rate p=0.2 self-normalised steps-matched"),  # where
)
DEV_SEED = 6  # the diagnostics' development seed: variants are chosen on its validation split, outside the table
BIASED = "self-normalised"  # a variant with its own (biased) estimator: not line 12, Theorem 1 does not cover it
SETTING = dict(partition="highly-biased")
VARIANTS: dict[str, dict] = {  # at p = 0.2 under the paper's p rule (p per lower exit) unless said otherwise
    "paper": {},  # line 12 as written for the weights; BatchNorm statistics by the default rule (convex)
    "bn-literal": {"bn_rule": "literal"},  # line 12 for the statistics too (the notes' rule until issue 17)
    "capped": {"coefficient_rule": "capped"},
    "self-normalised": {"coefficient_rule": "self-normalised"},
    "authors": {"p_rule": "code", "p_mode": "multiply"},
    "flops-steps": {"lower_exit_steps": "flops"},
    "self-normalised+flops-steps": {"coefficient_rule": "self-normalised", "lower_exit_steps": "flops"},
}
DIAGNOSE = [("p=0", "serving-rate", 0.0, {})] + [
    (f"p=0.2 {name}", "serving-rate", 0.2, extra) for name, extra in VARIANTS.items()
]


def campaign_runs(
    variants: list[str], algorithm: str = "printed", controls: bool = False
) -> list[tuple[str, str, float, dict]]:
    """(run name, strategy, p, config overrides) of the multi-seed table: the paper's runs (p = 0, 0.2, 0.4),
    then, under the printed algorithm, the variants and the step-matched controls."""
    runs = [
        ("equal p=0", "equal", 0.0, {}),
        ("serving-rate p=0", "serving-rate", 0.0, {}),
        ("serving-rate p=0.2", "serving-rate", 0.2, {}),
        ("serving-rate p=0.4", "serving-rate", 0.4, {}),
    ]
    if algorithm != "printed":
        return runs
    runs += [(f"serving-rate p=0.2 {v}", "serving-rate", 0.2, VARIANTS[v]) for v in variants if v != "paper"]
    if controls:
        runs += [(name, "serving-rate", p, extra) for name, (p, extra) in CONTROLS.items()]
    return runs


def slug(name: str, algorithm: str = "printed") -> str:
    return name.replace(" ", "_").replace("=", "") + ("" if algorithm == "printed" else f"_{algorithm}")


def matched_local_steps(config) -> int:
    """J' = round(J x E[steps of a flops-steps round] / (N J)): the flops-steps variant's SGD steps per round at
    ``config``'s p and sampling matrix, spread evenly over the nodes (the expectation over the exit draws)."""
    import dataclasses

    from cis.training.local import exit_steps
    from cis.training.models.flops import exit_costs
    from cis.training.run import build_setup

    s = build_setup(dataclasses.replace(config, strategy="equal", lower_exit_steps="flops", local_steps=None))
    flops = [c["flops"] for c in exit_costs(s.model)]
    expected = sum(
        float(s.matrix[i, e - 1]) * exit_steps(s.steps, flops, c.max_exit, e)
        for i, c in enumerate(s.clients)
        for e in range(1, c.max_exit + 1)
        if s.matrix[i, e - 1] > 0
    )
    return max(1, round(expected / len(s.clients)))


def final_val_cis(run: Path) -> float | None:
    """The validation CIS accuracy (%) of a run's last round (metrics.jsonl)."""
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    vals = [ln["val_cis_accuracy"] for ln in lines if "val_cis_accuracy" in ln]
    return 100 * vals[-1] if vals else None


def aggregation_trace(run: Path) -> dict:
    """Per-round totals from metrics.jsonl: coefficient per stage body / exit head, BN variances clamped."""
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    agg = [ln["aggregation"] for ln in lines if "aggregation" in ln]
    stage = np.array([a["coefficients"]["stage"] for a in agg])
    head = np.array([a["coefficients"]["head"] for a in agg])
    val = {ln["round"]: ln["val_exit_accuracy"] for ln in lines if "val_exit_accuracy" in ln}
    return {
        "stage_mean": stage.mean(0).tolist(),
        "stage_max": stage.max(0).tolist(),
        "head_mean": head.mean(0).tolist(),
        "head_max": head.max(0).tolist(),
        "head_sd": head.std(0).tolist(),
        "rounds_head_over_1": (head > 1).sum(0).tolist(),
        "bn_clamped_total": int(sum(a.get("bn_clamped", 0) for a in agg)),
        "rounds_with_clamping": int(sum(1 for a in agg if a.get("bn_clamped", 0) > 0)),
        "val_exit_accuracy": val,
        "train_loss_last": lines[-1]["loss"] if lines else {},
    }


def one_run(
    args,
    dataset: str,
    runs: Path,
    out: Path,
    seed: int,
    name: str,
    strategy: str,
    p: float,
    extra: dict,
    algorithm: str = "printed",
) -> dict:
    path = out / "runs" / f"seed{seed}_{slug(name, algorithm)}.json"
    if path.is_file():
        return json.loads(path.read_text())
    if not claim(path):  # another campaign process trains it
        return {}
    print(f"seed {seed}: {name} ({algorithm})", file=sys.stderr)
    args.seed = seed
    run = runs / f"seed{seed}" / slug(name, algorithm)
    extra = dict(extra, **({} if algorithm == "printed" else {"algorithm": algorithm}))
    if extra.get("local_steps") == MATCH_FLOPS_STEPS:
        from cis.training.config import make_config

        variant = dict(dataset=dataset, strategy=strategy, serving="80-15-5", p=FLOPS_STEPS_P, seed=seed, **SETTING)
        variant.update(rounds=args.rounds, width=args.width, train_subset=args.train_subset, val_size=args.val_size)
        extra["local_steps"] = matched_local_steps(make_config(overrides=dict(variant, local_epochs=args.local_epochs)))
    summary = train(run, dataset, strategy, "80-15-5", args, p=p, **SETTING, **extra)
    record = {
        "seed": seed,
        "run": name,
        "algorithm": algorithm,
        "strategy": strategy,
        "p": p,
        "overrides": extra,
        "cis_accuracy": 100 * summary["cis_accuracy"],
        "val_cis_accuracy": final_val_cis(run),
        "sgd_steps": summary.get("sgd_steps"),
        "exit_accuracy": summary["test"]["exit_accuracy"],
        "served_share_per_exit": summary["test"].get("served_share_per_exit"),
        "train_wall_seconds": summary.get("train_wall_seconds"),
        "device": summary.get("device"),
        "aggregation": aggregation_trace(run),
    }
    save_run(path, record, args.commit)
    return record


def collect(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[int, dict]]]:
    """{algorithm: {run name: {seed: record}}} (a record before issue 22 is the printed algorithm's)."""
    table: dict[str, dict[str, dict[int, dict]]] = {}
    for f in sorted((out / "runs").glob("seed*.json")):
        r = json.loads(f.read_text())
        if r["seed"] in seeds:
            table.setdefault(r.get("algorithm", "printed"), {}).setdefault(r["run"], {})[r["seed"]] = r
    return table


def summarise(table: dict[str, dict[int, dict]], seeds: list[int], names: list[str]) -> dict:
    """per_seed, summary and the paired comparisons (against serving-rate p=0 and equal p=0) of one algorithm."""
    per_seed, summary, vs = {}, {}, {}
    for name in [n for n in names if n in table] + sorted(set(table) - set(names)):
        have = [s for s in seeds if s in table[name]]
        runs = [table[name][s] for s in have]
        per_seed[name] = [r["cis_accuracy"] for r in runs]
        steps = [r["sgd_steps"]["total"] for r in runs if r.get("sgd_steps")]
        roots = [r["sgd_steps"]["root"] for r in runs if r.get("sgd_steps")]
        vals = [r["val_cis_accuracy"] for r in runs if r.get("val_cis_accuracy") is not None]
        summary[name] = {
            **stats(per_seed[name]),
            "seeds": have,
            "exit_accuracy": {e: stats([r["exit_accuracy"][e] * 100 for r in runs])["mean"] for e in ("1", "2", "3")},
            "sgd_steps": float(np.mean(steps)) if steps else None,
            "root_sgd_steps": float(np.mean(roots)) if roots else None,
            "val_cis_accuracy": float(np.mean(vals)) if len(vals) == len(runs) else None,
            "estimator": "its own (biased)" if BIASED in name else "line 12",
            "bn_clamped_total": sum(r["aggregation"]["bn_clamped_total"] for r in runs),
            "head_max": np.max([r["aggregation"]["head_max"] for r in runs], axis=0).tolist(),
        }
        for base in ("serving-rate p=0", "equal p=0"):
            if name != base and base in table:
                both = [s for s in have if s in table[base]]
                if both:
                    vs.setdefault(name, {})[base] = {
                        **paired(
                            [table[name][s]["cis_accuracy"] for s in both],
                            [table[base][s]["cis_accuracy"] for s in both],
                        ),
                        "seeds": both,
                    }
    add_holm({f"{n} vs {b}": c for n, bases in vs.items() for b, c in bases.items()})
    return {"per_seed": per_seed, "summary": summary, "paired": vs, "controls": controls(table, seeds)}


def controls(table: dict[str, dict[int, dict]], seeds: list[int]) -> dict[str, dict]:
    """The step-matched controls' comparisons (:data:`CONTROL_PAIRS`, where both runs have seeds), paired on the
    seed, Holm-adjusted over this family alone: {"run vs baseline": paired difference}."""
    out = {}
    for name, base in CONTROL_PAIRS:
        both = [s for s in seeds if s in table.get(name, {}) and s in table.get(base, {})]
        if both:
            runs, bases = ([table[n][s]["cis_accuracy"] for s in both] for n in (name, base))
            out[f"{name} vs {base}"] = {**paired(runs, bases), "seeds": both}
    add_holm(out)
    return out


def markdown_rows(part: dict) -> list[str]:
    lines = [
        "| run | CIS accuracy | paper | vs serving-rate p=0 | vs equal p=0 | exit 1 | exit 2 | exit 3 | SGD steps "
        "| val CIS | max head coef (1/2/3) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in part["summary"].items():
        comps = part["paired"].get(name, {})
        d_sr, d_eq = (fmt_test(comps[b]) if b in comps else "–" for b in ("serving-rate p=0", "equal p=0"))
        paper = f"{PAPER[name]:.1f}" if name in PAPER else "–"
        ex = c["exit_accuracy"]
        label = name + (" (variant: its own biased estimator)" if c["estimator"] != "line 12" else "")
        steps = f"{c['sgd_steps']:,.0f}" if c["sgd_steps"] else "–"
        val = f"{c['val_cis_accuracy']:.1f}" if c["val_cis_accuracy"] is not None else "–"
        lines.append(
            f"| {label} | {c['mean']:.1f} ± {c['sd']:.1f} | {paper} | {d_sr} | {d_eq} | {ex['1']:.1f} | "
            f"{ex['2']:.1f} | {ex['3']:.1f} | {steps} | {val} | {'/'.join(f'{h:.2f}' for h in c['head_max'])} |"
        )
    return lines


def report(out: Path, stem: str, names: list[str]) -> dict:
    scale = json.loads((out / "scale.json").read_text()) if (out / "scale.json").is_file() else {"seeds": []}
    seeds = scale.pop("seeds")
    tables = collect(out, seeds)
    parts = {a: summarise(tables[a], seeds, names) for a in ALGORITHMS if a in tables}
    done = sorted({s for t in tables.values() for runs in t.values() for s in runs})
    result = {
        "scale": scale,
        "seeds": done,  # the seeds with finished runs; per_seed lists follow each run's own seeds (summary)
        "seeds_planned": seeds,
        "algorithms": list(parts),
        "per_seed": {a: part["per_seed"] for a, part in parts.items()},
        "summary": {a: part["summary"] for a, part in parts.items()},
        "paired": {a: part["paired"] for a, part in parts.items()},
        "controls": {a: part["controls"] for a, part in parts.items() if part["controls"]},
        "paper": PAPER,
    }
    diag = RESULTS / f"{stem}_diagnostics_seed{DEV_SEED}.json"
    if diag.is_file():
        result["val_choice"] = diagnostics_val_choice(json.loads(diag.read_text()))
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Table 2 over seeds (CIFAR-10, paper-7, highly biased partition, 80-15-5)\n",
        f"Scale: {scale}; seeds {','.join(map(str, seeds))} planned, runs finished for seeds "
        f"{','.join(map(str, done)) or 'none'}. CIS accuracy on the test split (%), mean ± sd over the seeds "
        "finished; exit accuracies are means over the seeds. Each comparison: paired difference mean ± sd (sign per "
        "seed), paired t-test p / Holm-adjusted p over its algorithm's table. SGD steps: all nodes, per run. "
        "The paper's p = 0.2 row was run by the authors' scripts at the paper's rule with p = 0.4.\n",
    ]
    for algorithm, part in parts.items():
        lines += [f"\n## Algorithm: {algorithm}\n", *markdown_rows(part)]
        if part["controls"]:
            lines += ["", "Step-matched controls (paired on the seed; Holm over these comparisons alone):\n",
                      "| comparison | difference |", "|---|---|"]  # fmt: skip
            lines += [f"| {k} | {fmt_test(c)} |" for k, c in part["controls"].items()]
    if result.get("val_choice"):
        v = result["val_choice"]
        lines += [
            "",
            f"Variant chosen on the validation split (seed {v['seed']}, a seed outside the table): **{v['chosen']}** "
            f"({', '.join(f'{n} {x:.1f}' for n, x in v['val_cis_accuracy'].items())}).",
        ]
    if plot(stem, result):
        lines += ["", f"![CIS accuracy per run, mean and sd over the seeds, the paper's value marked]({stem}.png)"]
    findings = RESULTS / f"{stem}_findings.md"
    (RESULTS / f"{stem}.md").write_text(
        "\n".join(lines) + "\n\n" + (findings.read_text() if findings.is_file() else "")
    )
    return result


def plot(stem: str, result: dict) -> bool:
    """``RESULTS/stem.png``: each algorithm's runs as bars of the mean CIS accuracy with the sd over the seeds as
    error bars, the paper's value as a marker where it has one; False without matplotlib or runs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    parts = {a: s for a, s in result["summary"].items() if s}
    if not parts:
        return False
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 0.5 * max(map(len, parts.values())) + 1.5),
                             squeeze=False)  # fmt: skip
    for ax, (algorithm, rows) in zip(axes[0], parts.items()):
        names = list(rows)[::-1]  # the table's first row on top
        ys = range(len(names))
        ax.barh(ys, [rows[n]["mean"] for n in names], xerr=[rows[n]["sd"] for n in names], capsize=3)
        paper = [(y, result["paper"][n]) for y, n in zip(ys, names) if n in result["paper"]]
        if paper:
            ax.plot([v for _, v in paper], [y for y, _ in paper], "k*", label="paper")
            ax.legend(fontsize=8)
        ax.set_yticks(list(ys), names, fontsize=8)
        ax.set_title(f"algorithm: {algorithm}")
        ax.set_xlabel("CIS accuracy (%), mean ± sd over the seeds")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    plt.close(fig)
    return True


def diagnostics_val_choice(diag: dict) -> dict | None:
    """The p = 0.2 variant with the best validation CIS accuracy in the diagnostics' seed (never test)."""
    scored = {
        n: r["val_cis_accuracy"]
        for n, r in diag.get("runs", {}).items()
        if n.startswith("p=0.2") and r.get("val_cis_accuracy") is not None
    }
    if not scored:
        return None
    best = max(scored, key=scored.get)
    return {"seed": diag["seed"], "chosen": best, "val_cis_accuracy": scored}


def diagnostics_stem(out: Path, seed: int) -> str:
    """table2_diagnostics (issue 17's seed 1) or table2_diagnostics_seedN (a development seed, chosen on validation)."""
    return out.name if seed == 1 else f"{out.name}_seed{seed}"


def diagnose_report(out: Path, seed: int) -> None:
    found = {r["run"]: r for r in (json.loads(f.read_text()) for f in (out / "runs").glob(f"seed{seed}_*.json"))}
    rows = {name: found[name] for name, *_ in DIAGNOSE if name in found}
    stem = diagnostics_stem(out, seed)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"seed": seed, "runs": rows}, indent=1))
    lines = [
        "# Table 2 diagnostics: why p = 0.2 hurts at reduced scale\n",
        f"Seed {seed}; serving-rate weights at 80-15-5, highly biased partition; p = 0.2 under the paper's rule unless "
        "said. Coefficients are per-round totals of c_ie: head k sums the pairs that trained exit k, stage k the pairs "
        "with exit >= k (line 12 at p = 0 gives head k a total of Lambda~_k every round).\n",
        "| run | CIS acc | exit 1/2/3 acc | head 1 coef mean (sd, max) | head 2 mean (max) | head 3 mean (max) | "
        "stage 1 mean (max) | rounds head1 > 1 | BN vars clamped (rounds) | last val exit 1/2/3 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        a = r["aggregation"]
        ex = "/".join(f"{100 * r['exit_accuracy'][e]:.1f}" for e in ("1", "2", "3"))
        last = a["val_exit_accuracy"][max(a["val_exit_accuracy"], key=int)] if a["val_exit_accuracy"] else {}
        val = "/".join(f"{100 * last[e]:.1f}" for e in ("1", "2", "3")) if last else "–"
        lines.append(
            f"| {name} | {r['cis_accuracy']:.1f} | {ex} | "
            f"{a['head_mean'][0]:.2f} ({a['head_sd'][0]:.2f}, {a['head_max'][0]:.2f}) | "
            f"{a['head_mean'][1]:.2f} ({a['head_max'][1]:.2f}) | {a['head_mean'][2]:.2f} ({a['head_max'][2]:.2f}) | "
            f"{a['stage_mean'][0]:.2f} ({a['stage_max'][0]:.2f}) | {a['rounds_head_over_1'][0]} | "
            f"{a['bn_clamped_total']} ({a['rounds_with_clamping']}) | {val} |"
        )
    findings = RESULTS / f"{stem}_findings.md"
    (RESULTS / f"{stem}.md").write_text(
        "\n".join(lines) + "\n\n" + (findings.read_text() if findings.is_file() else "")
    )
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument(
        "--variants",
        default="bn-literal,self-normalised",
        help=f"p = 0.2 variants besides the paper's rule, comma-separated, of: {', '.join(VARIANTS)}",
    )
    ap.add_argument(
        "--diagnose", action="store_true", help="one seed (the first of --seeds), every variant, with traces"
    )
    ap.add_argument("--algorithm", choices=ALGORITHMS, default="printed", help="Algorithm 1 as printed or the authors'")
    ap.add_argument(
        "--controls", action="store_true", help="also the step-matched controls of the flops-steps variants (printed)"
    )
    args = ap.parse_args()
    quick(args)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        sys.exit(f"--variants: unknown {unknown}; expected some of {', '.join(VARIANTS)}")
    stem = "table2_quick" if args.quick else "table2"
    if args.diagnose:
        out, seed = RESULTS / f"{stem}_diagnostics", seeds_of(args)[0]
        if not args.report:
            dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
            runs = Path(args.runs or f"/tmp/cis-bench/{stem}_diagnostics")
            for name, strategy, p, extra in DIAGNOSE:
                one_run(args, dataset, runs, out, seed, name, strategy, p, extra)
                diagnose_report(out, seed)
        diagnose_report(out, seed)
        return
    out = RESULTS / stem
    names = [r[0] for r in campaign_runs(variants, "printed", controls=True)]
    if not args.report:
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        runs = Path(args.runs or f"/tmp/cis-bench/{stem}")
        out.mkdir(parents=True, exist_ok=True)
        write_scale(out, {**scale_of(args), "partition": "highly-biased", "serving": "80-15-5"}, seeds_of(args))
        for seed in seeds_of(args):
            for name, strategy, p, extra in campaign_runs(variants, args.algorithm, args.controls):
                one_run(args, dataset, runs, out, seed, name, strategy, p, extra, args.algorithm)
                report(out, stem, names)
    report(out, stem, names)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
