"""The CIS paper's Table 1 (CIFAR-10, paper-7, equal partition) over several seeds, at a scale a 2-core CPU can run.

Campaign design (issue 17): 5 seeds, 60 rounds per cell. Strategies whose weights
do not depend on the serving setting (equal, flops) are trained once per seed and
evaluated under all three settings; serving-rate, balanced-adj and auto are trained
per setting (serving-rate at 33-33-33 IS equal weight, so that cell reuses the
equal run, as the paper's identical numbers show). Every finished run writes its
numbers to benchmarks/results/table1/runs/ at once (commit them: a campaign then
survives a new machine, the run dirs under /tmp do not), and a rerun skips the
runs whose file exists. table1.json/.md/.png are rebuilt from those files after
every run, so a partial campaign already reports what it has.

``--large`` runs the headline cell at a larger scale instead: 80-15-5, width 0.25,
100 rounds, 20,000 images, 3 seeds, for equal, serving-rate, balanced-adj and auto
(each of those overridable; the .md says what scale was run).

    python benchmarks/table1.py [--quick] [--seeds 1,2,3,4,5] [--rounds 60] [--strategies ...] [--large]
    python benchmarks/table1.py --report   # rebuild table1.json/.md/.png from the run files only

CIFAR-10 comes from ../shared/data/cifar10-jpeg.zip, unzipped to /tmp/cifar10.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import (
    RESULTS,
    claim,
    common_args,
    ensure_cifar,
    evaluate,
    paired,
    quick,
    save_run,
    scale_of,
    seeds_of,
    stats,
    train,
)

SETTINGS = ["80-15-5", "33-33-33", "5-15-80"]
STRATEGIES = ["equal", "flops", "serving-rate", "balanced-adj", "auto"]
SHARED = ("equal", "flops")  # weights independent of the serving setting: trained once per seed
LARGE = {
    "serving": "80-15-5",
    "width": 0.25,
    "rounds": 100,
    "train_subset": 20000,
    "seeds": [1, 2, 3],
    "strategies": ["equal", "serving-rate", "balanced-adj", "auto"],
}
PAPER_TABLE1 = {  # CIFAR-10, equal partition, mean of 3 seeds (paper Table 1)
    "equal": {"80-15-5": 49.9, "33-33-33": 74.9, "5-15-80": 85.1},
    "flops": {"80-15-5": 32.1, "33-33-33": 67.3, "5-15-80": 86.3},
    "serving-rate": {"80-15-5": 54.2, "33-33-33": 74.9, "5-15-80": 86.7},
    "balanced-adj": {"80-15-5": 53.4, "33-33-33": 74.9, "5-15-80": 87.6},
}


def run_record(
    run: Path, summary: dict, seed: int, strategy: str, trained_for: str, accuracy: dict[str, float]
) -> dict:
    return {
        "seed": seed,
        "strategy": strategy,
        "trained_for": trained_for,
        "cis_accuracy": accuracy,
        "exit_accuracy": summary["test"]["exit_accuracy"],
        "weights": summary["weights"],
        "train_wall_seconds": summary.get("train_wall_seconds"),
        "device": summary.get("device"),
        "run_dir": str(run),
    }


def campaign(
    args, dataset: str, runs: Path, out: Path, cells: list[tuple[str, str]], seeds: list[int], on_run=lambda: None
) -> None:
    """Train every (strategy, trained-for setting) cell per seed; write each run's file as it finishes."""
    todo = [(seed, strategy, trained_for) for seed in seeds for strategy, trained_for in cells]
    for k, (seed, strategy, trained_for) in enumerate(todo, 1):
        name = f"seed{seed}_{strategy}" + ("" if strategy in SHARED else f"_{trained_for}")
        path = out / "runs" / f"{name}.json"
        if path.is_file() or not claim(path):
            continue
        print(f"[{k}/{len(todo)}] {name}", file=sys.stderr)
        args.seed = seed
        run = runs / f"seed{seed}" / name
        summary = train(run, dataset, strategy, trained_for, args)
        settings = SETTINGS if strategy in SHARED else [trained_for]
        accuracy = {s: (evaluate(run, s) if s != trained_for else 100 * summary["cis_accuracy"]) for s in settings}
        save_run(path, run_record(run, summary, seed, strategy, trained_for, accuracy), args.commit)
        on_run()


def collect(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[int, float]]]:
    """{strategy: {serving: {seed: accuracy}}} from the run files (serving-rate at 33-33-33 = equal)."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    for f in sorted((out / "runs").glob("seed*.json")):
        r = json.loads(f.read_text())
        if r["seed"] not in seeds:
            continue
        for serving, acc in r["cis_accuracy"].items():
            table.setdefault(r["strategy"], {}).setdefault(serving, {})[r["seed"]] = acc
    if "33-33-33" in table.get("equal", {}):
        table.setdefault("serving-rate", {})["33-33-33"] = dict(table["equal"]["33-33-33"])
    return table


def summarise(table: dict, seeds: list[int], settings: list[str]) -> dict:
    """per_seed lists (seed order), mean +- sd, and the paired difference against equal on the seeds both have."""
    per_seed, summary, vs_equal = {}, {}, {}
    for strategy in [s for s in STRATEGIES if s in table]:
        for serving in [s for s in settings if s in table[strategy]]:
            got = table[strategy][serving]
            have = [s for s in seeds if s in got]
            per_seed.setdefault(strategy, {})[serving] = [got[s] for s in have]
            summary.setdefault(strategy, {})[serving] = {**stats([got[s] for s in have]), "seeds": have}
            base = table.get("equal", {}).get(serving, {})
            both = [s for s in have if s in base]
            if strategy != "equal" and both:
                vs_equal.setdefault(strategy, {})[serving] = {
                    **paired([got[s] for s in both], [base[s] for s in both]),
                    "seeds": both,
                }
    return {"per_seed": per_seed, "summary": summary, "paired_vs_equal": vs_equal}


def auto_goal(summary: dict, settings: list[str]) -> dict:
    """Issue 17's goal for auto per cell: mean >= best fixed strategy's mean - its sd."""
    out = {}
    for serving in settings:
        if serving not in summary.get("auto", {}):
            continue
        fixed = {s: summary[s][serving] for s in summary if s != "auto" and serving in summary[s]}
        if not fixed:
            continue
        best = max(fixed, key=lambda s: fixed[s]["mean"])
        bar = fixed[best]["mean"] - fixed[best]["sd"]
        got = summary["auto"][serving]["mean"]
        out[serving] = {
            "auto_mean": got,
            "best_fixed": best,
            "best_mean": fixed[best]["mean"],
            "best_sd": fixed[best]["sd"],
            "bar": bar,
            "met": bool(got >= bar),
        }
    return out


def auto_choices(out: Path) -> dict[str, dict[str, int]]:
    """How often auto chose each candidate, per serving setting."""
    counts: dict[str, dict[str, int]] = {}
    for f in sorted((out / "runs").glob("seed*_auto_*.json")):
        r = json.loads(f.read_text())
        chosen = r["weights"].get("chosen", "?")
        counts.setdefault(r["trained_for"], {}).setdefault(chosen, 0)
        counts[r["trained_for"]][chosen] += 1
    return counts


def fmt(cell: dict | None) -> str:
    return f"{cell['mean']:.1f} ± {cell['sd']:.1f}" if cell else "–"


def write_report(stem: str, result: dict, settings: list[str], title: str, note: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    s = result["summary"]
    lines = [
        f"# {title}\n",
        note + "\n",
        "CIS accuracy on the test split (%), mean ± sd over seeds; paper: Table 1 (3 seeds).\n",
        "| strategy | " + " | ".join(f"{x} ours | {x} paper" for x in settings) + " |",
        "|---|" + "---|---|" * len(settings),
    ]
    for strategy in [x for x in STRATEGIES if x in s]:
        row = [
            f"{fmt(s[strategy].get(x))} | {PAPER_TABLE1.get(strategy, {}).get(x, float('nan')):.1f}" for x in settings
        ]
        lines.append(f"| {strategy} | " + " | ".join(row).replace("nan", "–") + " |")
    lines += [
        "",
        "Paired difference against equal (same seed): mean ± sd, and the sign per seed.\n",
        "| strategy | " + " | ".join(settings) + " |",
        "|---|" + "---|" * len(settings),
    ]
    for strategy, cells in result["paired_vs_equal"].items():
        row = [(f"{c['mean']:+.1f} ± {c['sd']:.1f} ({c['signs']})" if (c := cells.get(x)) else "–") for x in settings]
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    if result.get("auto_goal"):
        lines += [
            "",
            "auto against its goal (mean >= best fixed strategy's mean - that strategy's sd):\n",
            "| serving | auto | best fixed | bar | met | auto chose |",
            "|---|---|---|---|---|---|",
        ]
        for x, g in result["auto_goal"].items():
            chose = ", ".join(f"{k} {v}x" for k, v in result.get("auto_choices", {}).get(x, {}).items()) or "–"
            lines.append(
                f"| {x} | {g['auto_mean']:.1f} | {g['best_fixed']} {g['best_mean']:.1f} ± {g['best_sd']:.1f} | "
                f"{g['bar']:.1f} | {'yes' if g['met'] else 'NO'} | {chose} |"
            )
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n" + result.get("findings", ""))
    plot(stem, result, settings)


def plot(stem: str, result: dict, settings: list[str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    s = result["summary"]
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [x for x in STRATEGIES if x in s]
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i, x in enumerate(settings) if x in s[name]]
        ys = [s[name][x]["mean"] for x in settings if x in s[name]]
        err = [s[name][x]["sd"] for x in settings if x in s[name]]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=name)
    ax.set_xticks(range(len(settings)), settings)
    ax.set_xlabel("serving setting"), ax.set_ylabel("CIS accuracy (%), mean ± sd")
    lo = min((v["mean"] - v["sd"] for c in s.values() for v in c.values()), default=0)
    ax.set_ylim(max(0, lo - 5), None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)


def devices(out: Path) -> list[str]:
    """The devices the run files of ``out`` say they were trained on."""
    return sorted({json.loads(f.read_text()).get("device") or "?" for f in (out / "runs").glob("seed*.json")})


def load_scale(out: Path) -> tuple[dict, list[int]] | None:
    """The scale and seeds a campaign folder was run with (written when it started)."""
    if not (out / "scale.json").is_file():
        return None
    scale = json.loads((out / "scale.json").read_text())
    return scale, scale.pop("seeds")


def report(out: Path, large_out: Path, stem: str) -> dict:
    scale, seeds = load_scale(out) or ({}, [])
    table = collect(out, seeds)
    done = sorted({seed for cells in table.values() for accs in cells.values() for seed in accs})
    result = {
        "scale": scale,
        "seeds": done,  # the seeds with finished runs; per_seed lists follow this order
        "seeds_planned": seeds,
        "paper": PAPER_TABLE1,
        **summarise(table, seeds, SETTINGS),
    }
    result["auto_goal"] = auto_goal(result["summary"], SETTINGS)
    result["auto_choices"] = auto_choices(out)
    note = (
        f"Reduced scale: ResNet-18 width {scale.get('width')}, {scale.get('rounds')} rounds, "
        f"{scale.get('train_subset')} training images, local epochs {scale.get('local_epochs')}, "
        f"seeds {','.join(map(str, seeds))} planned, runs finished for seeds {','.join(map(str, done)) or 'none'}. "
        "Paper: full ResNet-18, 100 rounds, 45k images, 3 seeds."
    )
    if (large := load_scale(large_out)) is not None:
        lscale, lseeds = large
        cell = [LARGE["serving"]]
        ltable = collect(large_out, lseeds)
        ldone = sorted({seed for cells in ltable.values() for accs in cells.values() for seed in accs})
        result["large"] = {"scale": lscale, "seeds": ldone, "seeds_planned": lseeds, **summarise(ltable, lseeds, cell)}
        result["large"]["auto_goal"] = auto_goal(result["large"]["summary"], cell)
        note += (
            f"\n\nLarger scale, {LARGE['serving']} only: width {lscale['width']}, {lscale['rounds']} rounds, "
            f"{lscale['train_subset']} images, seeds {','.join(map(str, lseeds))}, trained on "
            f"{', '.join(devices(large_out)) or 'an unrecorded device'}: "
            + ", ".join(f"{k} {fmt(v.get(LARGE['serving']))}" for k, v in result["large"]["summary"].items())
        )
        if pv := result["large"]["paired_vs_equal"]:
            note += "; against equal: " + ", ".join(
                f"{k} {c['mean']:+.1f} ({c['signs']})" for k, v in pv.items() for c in [v[LARGE["serving"]]]
            )
    findings = RESULTS / f"{stem}_findings.md"
    result["findings"] = findings.read_text() if findings.is_file() else ""
    write_report(stem, result, SETTINGS, "Table 1 over seeds (CIFAR-10, paper-7, equal partition)", note)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default all five)")
    ap.add_argument(
        "--large",
        action="store_true",
        help="the 80-15-5 cell at a larger scale (width 0.25, 100 rounds, "
        "20k images, seeds 1,2,3, equal/serving-rate/balanced-adj/auto; the flags override each)",
    )
    args = ap.parse_args()
    quick(args)
    stem = "table1_quick" if args.quick else "table1"
    out, large_out = RESULTS / stem, RESULTS / f"{stem}_large"
    if args.large:
        given = {a.split("=")[0] for a in sys.argv[1:]}
        for key in ("width", "rounds", "train_subset", "seeds", "strategies"):
            if "--" + key.replace("_", "-") not in given:
                value = LARGE[key]
                setattr(args, key, ",".join(map(str, value)) if isinstance(value, list) else value)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        sys.exit(f"--strategies: unknown {unknown}; expected some of {STRATEGIES}")
    if not args.report:
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        target = large_out if args.large else out
        runs = Path(args.runs or f"/tmp/cis-bench/{target.name}")
        target.mkdir(parents=True, exist_ok=True)
        (target / "scale.json").write_text(json.dumps({**scale_of(args), "seeds": seeds_of(args)}, indent=1))
        if args.large:
            cells = [(s, LARGE["serving"]) for s in strategies]
        else:
            cells = [(s, "33-33-33") for s in strategies if s in SHARED]
            cells += [
                (s, x)
                for x in SETTINGS
                for s in strategies
                if s not in SHARED and not (s == "serving-rate" and x == "33-33-33")
            ]
        campaign(args, dataset, runs, target, cells, seeds_of(args), on_run=lambda: report(out, large_out, stem))
    report(out, large_out, stem)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
