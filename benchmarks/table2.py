"""The CIS paper's Table 2 over several seeds: highly biased partition, 80-15-5, serving-rate with p = 0 vs p = 0.2.

The paper finds that letting stronger nodes also train lower exits (p = 0.2)
gains 8 points; at reduced scale it lost points (issue 17). Two modes:

- ``--diagnose``: one seed, the paper's rule against diagnostic variants
  (the literal BatchNorm rule, coefficients capped at 1 or self-normalised per
  exit, the authors' multiply rule, more local steps for lower exits). From each
  run's metrics.jsonl it reports the total coefficient per stage body and exit
  head per round and the BatchNorm variances clamped at 0
  (table2_diagnostics.json/.md).
- the campaign (default): 5 seeds of equal p = 0, serving-rate p = 0,
  serving-rate p = 0.2 under the paper's rule (with the default BatchNorm rule),
  and p = 0.2 under each ``--variants`` (default: the literal BatchNorm rule and
  the self-normalised coefficients). Each finished
  run writes benchmarks/results/table2/runs/<run>.json at once; table2.json/.md
  are rebuilt from those files after every run.

    python benchmarks/table2.py [--quick] [--seeds 1,2,3,4,5] [--variants bn-literal,self-normalised] [--diagnose]
    python benchmarks/table2.py --report
Same scale flags as table1.py (60 rounds, width 0.125, 7000 images, local epochs 0.25 by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from _common import (
    RESULTS,
    claim,
    common_args,
    ensure_cifar,
    paired,
    quick,
    save_run,
    scale_of,
    seeds_of,
    stats,
    train,
)

PAPER = {"equal p=0": 36.5, "serving-rate p=0": 41.3, "serving-rate p=0.2": 49.2}
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


def campaign_runs(variants: list[str]) -> list[tuple[str, str, float, dict]]:
    """(run name, strategy, p, config overrides) of the multi-seed table: the paper's three runs, then the variants."""
    runs = [
        ("equal p=0", "equal", 0.0, {}),
        ("serving-rate p=0", "serving-rate", 0.0, {}),
        ("serving-rate p=0.2", "serving-rate", 0.2, {}),
    ]
    return runs + [(f"serving-rate p=0.2 {v}", "serving-rate", 0.2, VARIANTS[v]) for v in variants if v != "paper"]


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("=", "")


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
    args, dataset: str, runs: Path, out: Path, seed: int, name: str, strategy: str, p: float, extra: dict
) -> dict:
    path = out / "runs" / f"seed{seed}_{slug(name)}.json"
    if path.is_file():
        return json.loads(path.read_text())
    if not claim(path):  # another campaign process trains it
        return {}
    print(f"seed {seed}: {name}", file=sys.stderr)
    args.seed = seed
    run = runs / f"seed{seed}" / slug(name)
    summary = train(run, dataset, strategy, "80-15-5", args, p=p, **SETTING, **extra)
    record = {
        "seed": seed,
        "run": name,
        "strategy": strategy,
        "p": p,
        "overrides": extra,
        "cis_accuracy": 100 * summary["cis_accuracy"],
        "exit_accuracy": summary["test"]["exit_accuracy"],
        "served_share_per_exit": summary["test"].get("served_share_per_exit"),
        "train_wall_seconds": summary.get("train_wall_seconds"),
        "device": summary.get("device"),
        "aggregation": aggregation_trace(run),
    }
    save_run(path, record, args.commit)
    return record


def collect(out: Path, seeds: list[int]) -> dict[str, dict[int, dict]]:
    table: dict[str, dict[int, dict]] = {}
    for f in sorted((out / "runs").glob("seed*.json")):
        r = json.loads(f.read_text())
        if r["seed"] in seeds:
            table.setdefault(r["run"], {})[r["seed"]] = r
    return table


def report(out: Path, stem: str, names: list[str]) -> dict:
    scale = json.loads((out / "scale.json").read_text()) if (out / "scale.json").is_file() else {"seeds": []}
    seeds = scale.pop("seeds")
    table = collect(out, seeds)
    per_seed, summary, vs = {}, {}, {}
    for name in [n for n in names if n in table] + sorted(set(table) - set(names)):
        have = [s for s in seeds if s in table[name]]
        accs = [table[name][s]["cis_accuracy"] for s in have]
        per_seed[name] = accs
        summary[name] = {
            **stats(accs),
            "seeds": have,
            "exit_accuracy": {
                e: stats([table[name][s]["exit_accuracy"][e] * 100 for s in have])["mean"] for e in ("1", "2", "3")
            },
            "bn_clamped_total": sum(table[name][s]["aggregation"]["bn_clamped_total"] for s in have),
            "head_max": np.max([table[name][s]["aggregation"]["head_max"] for s in have], axis=0).tolist(),
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
    done = sorted({s for runs in table.values() for s in runs})
    result = {
        "scale": scale,
        "seeds": done,  # the seeds with finished runs; per_seed lists follow this order (summary: each run's own)
        "seeds_planned": seeds,
        "per_seed": per_seed,
        "summary": summary,
        "paired": vs,
        "paper": PAPER,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Table 2 over seeds (CIFAR-10, paper-7, highly biased partition, 80-15-5)\n",
        f"Scale: {scale}; seeds {','.join(map(str, seeds))} planned, runs finished for seeds "
        f"{','.join(map(str, done)) or 'none'}. "
        "CIS accuracy on the test split (%), mean ± sd over the seeds finished; "
        "exit accuracies are means over the seeds.\n",
        "| run | CIS accuracy | paper | vs serving-rate p=0 (signs) | exit 1 | exit 2 | exit 3 | BN vars clamped "
        "| max head coef (1/2/3) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in summary.items():
        d = vs.get(name, {}).get("serving-rate p=0")
        diff = f"{d['mean']:+.1f} ± {d['sd']:.1f} ({d['signs']})" if d else "–"
        paper = f"{PAPER[name]:.1f}" if name in PAPER else "–"
        ex = c["exit_accuracy"]
        lines.append(
            f"| {name} | {c['mean']:.1f} ± {c['sd']:.1f} | {paper} | {diff} | {ex['1']:.1f} | {ex['2']:.1f} | "
            f"{ex['3']:.1f} | {c['bn_clamped_total']} | {'/'.join(f'{h:.2f}' for h in c['head_max'])} |"
        )
    findings = RESULTS / f"{stem}_findings.md"
    (RESULTS / f"{stem}.md").write_text(
        "\n".join(lines) + "\n\n" + (findings.read_text() if findings.is_file() else "")
    )
    return result


def diagnose_report(out: Path, seed: int) -> None:
    found = {r["run"]: r for r in (json.loads(f.read_text()) for f in (out / "runs").glob(f"seed{seed}_*.json"))}
    rows = {name: found[name] for name, *_ in DIAGNOSE if name in found}
    (RESULTS / f"{out.name}.json").write_text(json.dumps({"seed": seed, "runs": rows}, indent=1))
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
    findings = RESULTS / f"{out.name}_findings.md"
    (RESULTS / f"{out.name}.md").write_text(
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
    names = [r[0] for r in campaign_runs(variants)]
    if not args.report:
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        runs = Path(args.runs or f"/tmp/cis-bench/{stem}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "scale.json").write_text(
            json.dumps(
                {**scale_of(args), "partition": "highly-biased", "serving": "80-15-5", "seeds": seeds_of(args)},
                indent=1,
            )
        )
        for seed in seeds_of(args):
            for name, strategy, p, extra in campaign_runs(variants):
                one_run(args, dataset, runs, out, seed, name, strategy, p, extra)
                report(out, stem, names)
    report(out, stem, names)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
