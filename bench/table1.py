"""The CIS paper's Table 1 (CIFAR-10, paper-7, equal partition) over several seeds, at a scale a 2-core CPU can run.

Campaign design (issue 17): 5 seeds, 60 rounds per cell. Strategies whose weights
do not depend on the serving setting (equal, flops) are trained once per seed and
evaluated under all three settings; serving-rate, balanced-adj and auto are trained
per setting (serving-rate at 33-33-33 IS equal weight, so that cell reuses the
equal run, as the paper's identical numbers show). Every finished run writes its
numbers to bench/results/table1/runs/ at once (commit them: a campaign then
survives a new machine, the run dirs under /tmp do not), and a rerun skips the
runs whose file exists. table1.json/.md/.png are rebuilt from those files after
every run, so a partial campaign already reports what it has.

``--algorithm authors-code`` trains the same cells under Algorithm 1 as the authors' public code
runs it (cis/training/aggregation/line12.py; their balanced-adj); those run files end in ``_authors-code``
and the tables gain the algorithm as a level (``per_seed`` {algorithm: {strategy: {cell: [...]}}}).
Every comparison against equal carries its paired t-test p and the Holm-adjusted p over the
comparisons of its algorithm's table; every run file records its SGD steps.

``--large`` runs the headline cell at a larger scale instead: 80-15-5, width 0.25,
100 rounds, 20,000 images, 3 seeds, for equal, serving-rate, balanced-adj and auto
(each of those overridable, the cell with ``--settings``, e.g. ``--settings 5-15-80 --strategies
flops,serving-rate,balanced-adj``: equal's runs already hold every setting; the .md says what scale was run).

    python -m bench.table1 [--quick] [--seeds 1,2,3,4,5] [--rounds 60] [--strategies ...] [--large]
                                [--algorithm printed|authors-code]
    python -m bench.table1 --report   # rebuild table1.json/.md/.png from the run files only

CIFAR-10 comes from ../shared/data/cifar10-jpeg.zip, unzipped to /tmp/cifar10.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.args import common_args, quick, scale_of, seeds_of
from bench.campaign import claim, save_run
from bench.harness import RESULTS, ensure_cifar, write_scale
from bench.models import evaluate, train
from bench.stats import add_holm, fmt_test, paired, stats

SETTINGS = ["80-15-5", "33-33-33", "5-15-80"]
ALGORITHMS = ["printed", "authors-code"]
FIXED = ("equal", "flops", "serving-rate", "balanced-adj")  # the paper's strategies: what auto must keep up with
AUTO_SLACK = 0.5  # issue 22: auto's mean within 0.5 point of the best fixed strategy's, in every cell
AUTO_STEPS = 1.1  # ... at no more than 1.1x a fixed strategy's SGD steps
STRATEGIES = ["equal", "flops", "serving-rate", "balanced-adj", "serving-ramp", "balanced-ramp", "auto", "auto-pilots"]
EQUAL_AT_33 = ("serving-rate", "serving-ramp", "auto")  # at 33-33-33 these ARE equal weighting: its runs stand for them
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


def run_name(seed: int, strategy: str, trained_for: str, algorithm: str = "printed") -> str:
    name = f"seed{seed}_{strategy}" + ("" if strategy in SHARED else f"_{trained_for}")
    return name + ("" if algorithm == "printed" else f"_{algorithm}")


def run_record(
    run: Path,
    summary: dict,
    seed: int,
    strategy: str,
    trained_for: str,
    accuracy: dict[str, float],
    algorithm: str = "printed",
) -> dict:
    return {
        "seed": seed,
        "algorithm": algorithm,
        "strategy": strategy,
        "trained_for": trained_for,
        "cis_accuracy": accuracy,
        "exit_accuracy": summary["test"]["exit_accuracy"],
        "weights": summary["weights"],
        "sgd_steps": summary.get("sgd_steps"),
        "train_wall_seconds": summary.get("train_wall_seconds"),
        "device": summary.get("device"),
        "run_dir": str(run),
    }


def campaign(
    args,
    dataset: str,
    runs: Path,
    out: Path,
    cells: list[tuple[str, str]],
    seeds: list[int],
    on_run=lambda: None,
    overrides: dict | None = None,
) -> None:
    """Train every (strategy, trained-for setting) cell per seed; write each run's file as it finishes.
    ``overrides``: more training-config fields for every run (e.g. a fixed ``local_steps``)."""
    todo = [(seed, strategy, trained_for) for seed in seeds for strategy, trained_for in cells]
    algorithm = getattr(args, "algorithm", "printed")
    extra = dict(overrides or {}, **({} if algorithm == "printed" else {"algorithm": algorithm}))
    for k, (seed, strategy, trained_for) in enumerate(todo, 1):
        name = run_name(seed, strategy, trained_for, algorithm)
        path = out / "runs" / f"{name}.json"
        if path.is_file() or not claim(path):
            continue
        print(f"[{k}/{len(todo)}] {name}", file=sys.stderr)
        args.seed = seed
        run = runs / f"seed{seed}" / name
        summary = train(run, dataset, strategy, trained_for, args, **extra)
        settings = SETTINGS if strategy in SHARED else [trained_for]
        both = {s: evaluate(run, s) for s in settings}  # (test, validation) per setting
        record = run_record(run, summary, seed, strategy, trained_for, {s: t for s, (t, _) in both.items()}, algorithm)
        record["val_cis_accuracy"] = {s: v for s, (_, v) in both.items()}
        if overrides:
            record["overrides"] = overrides
        save_run(path, record, args.commit)
        on_run()


def run_files(out: Path, seeds: list[int]) -> list[dict]:
    """The finished runs' records of the planned seeds (a record before issue 22 is the printed algorithm's)."""
    records = [json.loads(f.read_text()) for f in sorted((out / "runs").glob("seed*.json"))]
    return [{"algorithm": "printed", **r} for r in records if r["seed"] in seeds]


def collect(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """{algorithm: {strategy: {serving: {seed: accuracy}}}} from the run files (serving-rate at 33-33-33 = equal)."""
    tables: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for r in run_files(out, seeds):
        table = tables.setdefault(r["algorithm"], {})
        for serving, acc in r["cis_accuracy"].items():
            table.setdefault(r["strategy"], {}).setdefault(serving, {})[r["seed"]] = acc
    for table in tables.values():
        if "33-33-33" in table.get("equal", {}):
            for same in [x for x in EQUAL_AT_33 if x == "serving-rate" or x in table]:  # those run elsewhere
                table.setdefault(same, {})["33-33-33"] = dict(table["equal"]["33-33-33"])
    return tables


def val_summary(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[str, dict]]]:
    """{algorithm: {strategy: {serving: mean ± sd}}} of the validation CIS accuracy: what a choice may look at."""
    got: dict[tuple, list[float]] = {}
    for r in run_files(out, seeds):
        for serving, v in (r.get("val_cis_accuracy") or {}).items():
            got.setdefault((r["algorithm"], r["strategy"], serving), []).append(v)
    table: dict[str, dict[str, dict[str, dict]]] = {}
    for (algorithm, strategy, serving), vals in got.items():
        table.setdefault(algorithm, {}).setdefault(strategy, {})[serving] = {**stats(vals)}
    return table


def collect_steps(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[str, dict]]]:
    """{algorithm: {strategy: {trained_for: {"total": mean, "root": mean, "n": runs}}}}: each strategy's SGD steps."""
    got: dict[tuple, list[dict]] = {}
    for r in run_files(out, seeds):
        if r.get("sgd_steps"):
            got.setdefault((r["algorithm"], r["strategy"], r["trained_for"]), []).append(r["sgd_steps"])
    steps: dict[str, dict[str, dict[str, dict]]] = {}
    for (algorithm, strategy, cell), runs in got.items():
        steps.setdefault(algorithm, {}).setdefault(strategy, {})[cell] = {
            "total": float(sum(x["total"] for x in runs) / len(runs)),
            "root": float(sum(x["root"] for x in runs) / len(runs)),
            "n": len(runs),
        }
    return steps


def collect_exits(out: Path, seeds: list[int]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{algorithm: {strategy: {trained_for: [mean test accuracy (%) of exit 1, 2, ...]}}} over the run files (an
    exit's accuracy does not depend on the serving setting: equal's and flops's hold for every cell)."""
    got: dict[tuple, list[list[float]]] = {}
    for r in run_files(out, seeds):
        exits = [100 * r["exit_accuracy"][k] for k in sorted(r["exit_accuracy"], key=int)]
        got.setdefault((r["algorithm"], r["strategy"], r["trained_for"]), []).append(exits)
    table: dict[str, dict[str, dict[str, list[float]]]] = {}
    for (algorithm, strategy, cell), rows in got.items():
        table.setdefault(algorithm, {}).setdefault(strategy, {})[cell] = [sum(c) / len(c) for c in zip(*rows)]
    return table


def summarise(table: dict, seeds: list[int], settings: list[str]) -> dict:
    """per_seed lists (seed order), mean +- sd, and the paired difference against equal on the seeds both have,
    with its paired t-test p and the Holm-adjusted p over the table's comparisons."""
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
    same = {(k, "33-33-33") for k in EQUAL_AT_33}  # these ARE equal weighting: not a comparison
    add_holm({f"{k} {x}": c for k, cells in vs_equal.items() for x, c in cells.items() if (k, x) not in same})
    return {"per_seed": per_seed, "summary": summary, "paired_vs_equal": vs_equal}


def printed_minus_authors(tables: dict, seeds: list[int], settings: list[str]) -> dict:
    """{strategy: {serving: the printed algorithm's run minus the authors-code run, paired on the seed}} for the
    strategies both algorithms ran (the runs were trained on different machines: table1_rerun says how far that
    alone moves a run)."""
    printed, authors = tables.get("printed", {}), tables.get("authors-code", {})
    out: dict = {}
    for strategy in [s for s in STRATEGIES if s in printed and s in authors]:
        for serving in settings:
            a, b = printed[strategy].get(serving, {}), authors[strategy].get(serving, {})
            if both := [s for s in seeds if s in a and s in b]:
                out.setdefault(strategy, {})[serving] = {
                    **paired([a[s] for s in both], [b[s] for s in both]),
                    "seeds": both,
                }
    return out


def by_algorithm(tables: dict, seeds: list[int], settings: list[str]) -> dict:
    """:func:`summarise` per algorithm: {"per_seed": {algorithm: ...}, "summary": {algorithm: ...}, ...}."""
    parts = {a: summarise(tables[a], seeds, settings) for a in ALGORITHMS if a in tables}
    return {key: {a: part[key] for a, part in parts.items()} for key in ("per_seed", "summary", "paired_vs_equal")}


def auto_goal(summary: dict, settings: list[str], steps: dict | None = None, table: dict | None = None) -> dict:
    """Issue 22's goal for auto per cell: mean >= best fixed strategy's mean - 0.5, at <= 1.1x its SGD steps;
    with the per-seed ``table``, also auto minus the best fixed strategy paired on the seed."""
    out = {}
    for serving in settings:
        if serving not in summary.get("auto", {}):
            continue
        fixed = {s: summary[s][serving] for s in FIXED if s in summary and serving in summary[s]}
        if not fixed:
            continue
        best = max(fixed, key=lambda s: fixed[s]["mean"])
        bar = fixed[best]["mean"] - AUTO_SLACK
        got = summary["auto"][serving]["mean"]
        ratio = steps_ratio(steps or {}, serving)
        out[serving] = {
            "auto_mean": got,
            "best_fixed": best,
            "best_mean": fixed[best]["mean"],
            "best_sd": fixed[best]["sd"],
            "bar": bar,
            "steps_ratio": ratio,
            "met": bool(got >= bar and (ratio is None or ratio <= AUTO_STEPS)),
            "margin": got - bar,  # auto's mean above (+) or below (-) the bar
        }
        a, b = (table or {}).get("auto", {}).get(serving, {}), (table or {}).get(best, {}).get(serving, {})
        if both := [s for s in sorted(a) if s in b]:
            out[serving]["auto_minus_best"] = {**paired([a[s] for s in both], [b[s] for s in both]), "seeds": both}
    return out


def steps_ratio(steps: dict, serving: str) -> float | None:
    """auto's mean total SGD steps in a cell over the fixed strategies' (the same for all of them at p = 0)."""
    auto = steps.get("auto", {}).get(serving)
    fixed = [c["total"] for s, cells in steps.items() if s in FIXED for x, c in cells.items()]
    return auto["total"] / (sum(fixed) / len(fixed)) if auto and fixed else None


def auto_choices(out: Path) -> dict[str, dict[str, int]]:
    """How often issue 17's pilots (auto-pilots) chose each candidate, per serving setting (printed algorithm)."""
    counts: dict[str, dict[str, int]] = {}
    for f in sorted((out / "runs").glob("seed*_auto-pilots_*.json")):
        r = json.loads(f.read_text())
        if r.get("algorithm", "printed") != "printed":
            continue
        chosen = r["weights"].get("chosen", "?")
        counts.setdefault(r["trained_for"], {}).setdefault(chosen, 0)
        counts[r["trained_for"]][chosen] += 1
    return counts


def fmt(cell: dict | None) -> str:
    return f"{cell['mean']:.1f} ± {cell['sd']:.1f}" if cell else "–"


def accuracy_rows(summary: dict, settings: list[str], paper: bool) -> list[str]:
    head = " | ".join(f"{x} ours | {x} paper" if paper else x for x in settings)
    lines = [f"| strategy | {head} |", "|---|" + ("---|---|" if paper else "---|") * len(settings)]
    for strategy in [x for x in STRATEGIES if x in summary]:
        cells = [
            fmt(summary[strategy].get(x))
            + (f" | {PAPER_TABLE1.get(strategy, {}).get(x, float('nan')):.1f}".replace("nan", "–") if paper else "")
            for x in settings
        ]
        lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    return lines


def comparison_rows(vs_equal: dict, settings: list[str]) -> list[str]:
    lines = ["| strategy | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for strategy, cells in vs_equal.items():
        row = [(fmt_test(c) if (c := cells.get(x)) and "holm_p" in c else "= equal" if c else "–") for x in settings]
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    return lines


def steps_rows(steps: dict, settings: list[str]) -> list[str]:
    lines = ["| algorithm | strategy | trained for | SGD steps per run (all nodes) | root's |", "|---|---|---|---|---|"]
    for algorithm, by_strategy in steps.items():
        for strategy in [x for x in STRATEGIES if x in by_strategy]:
            for cell, c in sorted(by_strategy[strategy].items()):
                lines.append(f"| {algorithm} | {strategy} | {cell} | {c['total']:,.0f} | {c['root']:,.0f} |")
    return lines


def write_report(stem: str, result: dict, settings: list[str], title: str, note: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {title}\n", note + "\n"]
    for algorithm, summary in result["summary"].items():
        lines += [
            f"\n## Algorithm: {algorithm}\n",
            "CIS accuracy on the test split (%), mean ± sd over seeds; paper: Table 1 (3 seeds).\n",
            *accuracy_rows(summary, settings, paper=True),
            "",
            "Paired difference against equal (same seed): mean ± sd, the sign per seed, the paired t-test's p and "
            "its Holm-adjusted p over this table's comparisons.\n",
            *comparison_rows(result["paired_vs_equal"][algorithm], settings),
        ]
    if result.get("auto_goal"):
        lines += [
            "",
            f"auto against its goal (mean >= best fixed strategy's mean - {AUTO_SLACK}, at <= {AUTO_STEPS}x "
            "its SGD steps, pilots included):\n",
            "| serving | auto | best fixed | bar | steps ratio | met | issue 17's pilots chose |",
            "|---|---|---|---|---|---|---|",
        ]
        for x, g in result["auto_goal"].items():
            chose = ", ".join(f"{k} {v}x" for k, v in result.get("auto_choices", {}).get(x, {}).items()) or "–"
            ratio = "–" if g["steps_ratio"] is None else f"{g['steps_ratio']:.2f}"
            lines.append(
                f"| {x} | {g['auto_mean']:.1f} | {g['best_fixed']} {g['best_mean']:.1f} ± {g['best_sd']:.1f} | "
                f"{g['bar']:.1f} | {ratio} | {'yes' if g['met'] else 'NO'} | {chose} |"
            )
    for algorithm, summary in result.get("val_summary", {}).items():
        lines += ["", f"Validation CIS accuracy (%), runs that record it ({algorithm}):\n"]
        lines += accuracy_rows(summary, settings, paper=False)
    if result.get("sgd_steps"):
        lines += ["", "SGD steps per run (mean over the run files that record them):\n"]
        lines += steps_rows(result["sgd_steps"], settings)
    if plot(stem, result, settings):
        lines += ["", f"![CIS accuracy per serving setting and strategy, mean and sd over the seeds]({stem}.png)"]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n" + result.get("findings", ""))


def plot(stem: str, result: dict, settings: list[str]) -> bool:
    """``RESULTS/stem.png``: bars of each strategy's mean per setting with the sd as error bars; False where
    nothing is drawn (no matplotlib, no finished run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    algorithms = list(result["summary"])
    if not algorithms:  # no run finished yet (a --large campaign's first minutes): nothing to draw
        return False
    fig, axes = plt.subplots(1, len(algorithms), figsize=(7 * len(algorithms), 4), squeeze=False)
    for ax, algorithm in zip(axes[0], algorithms):
        s = result["summary"][algorithm]
        names = [x for x in STRATEGIES if x in s]
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            xs = [i + (k - (len(names) - 1) / 2) * width for i, x in enumerate(settings) if x in s[name]]
            ys = [s[name][x]["mean"] for x in settings if x in s[name]]
            err = [s[name][x]["sd"] for x in settings if x in s[name]]
            ax.bar(xs, ys, width, yerr=err, capsize=3, label=name)
        ax.set_xticks(range(len(settings)), settings)
        ax.set_title(f"algorithm: {algorithm}")
        ax.set_xlabel("serving setting"), ax.set_ylabel("CIS accuracy (%), mean ± sd")
        lo = min((v["mean"] - v["sd"] for c in s.values() for v in c.values()), default=0)
        ax.set_ylim(max(0, lo - 5), None)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    plt.close(fig)
    return True


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
    tables = collect(out, seeds)
    done = sorted({seed for t in tables.values() for cells in t.values() for accs in cells.values() for seed in accs})
    steps = collect_steps(out, seeds)
    result = {
        "scale": scale,
        "seeds": done,  # the seeds with finished runs; per_seed lists follow this order
        "seeds_planned": seeds,
        "algorithms": [a for a in ALGORITHMS if a in tables],
        "paper": PAPER_TABLE1,
        **by_algorithm(tables, seeds, SETTINGS),
        "sgd_steps": steps,
    }
    result["printed_minus_authors_code"] = printed_minus_authors(tables, seeds, SETTINGS)
    result["exit_accuracy"] = collect_exits(out, seeds)
    result["val_summary"] = val_summary(out, seeds)
    result["auto_goal"] = auto_goal(
        result["summary"].get("printed", {}), SETTINGS, steps.get("printed"), tables.get("printed")
    )
    result["auto_choices"] = auto_choices(out)
    note = (
        f"Reduced scale: ResNet-18 width {scale.get('width')}, {scale.get('rounds')} rounds, "
        f"{scale.get('train_subset')} training images, local epochs {scale.get('local_epochs')}, "
        f"seeds {','.join(map(str, seeds))} planned, runs finished for seeds {','.join(map(str, done)) or 'none'}. "
        "Paper: full ResNet-18, 100 rounds, 45k images, 3 seeds. Algorithms: printed (Algorithm 1 as the paper "
        "prints it) and authors-code (as arodio/FedCIS runs it; docs/training.md)."
    )
    if (large := load_scale(large_out)) is not None:
        result["large"], line = large_cell(large_out, large)
        note += line
    findings = RESULTS / f"{stem}_findings.md"
    result["findings"] = findings.read_text() if findings.is_file() else ""
    write_report(stem, result, SETTINGS, "Table 1 over seeds (CIFAR-10, paper-7, equal partition)", note)
    return result


def large_cell(large_out: Path, large: tuple[dict, list[int]]) -> tuple[dict, str]:
    """The larger-scale cells (printed algorithm): every serving setting its runs were trained for (80-15-5 first,
    then 5-15-80 where ``--large --settings 5-15-80`` ran), and the sentence the report says about them."""
    lscale, lseeds = large
    trained = {r["trained_for"] for r in run_files(large_out, lseeds)}
    cells = [x for x in SETTINGS if x in trained]
    ltable = collect(large_out, lseeds).get("printed", {})
    ldone = sorted({seed for cells_ in ltable.values() for accs in cells_.values() for seed in accs})
    part = {"scale": lscale, "cells": cells, "seeds": ldone, "seeds_planned": lseeds,
            **summarise(ltable, lseeds, cells)}  # fmt: skip
    part["exit_accuracy"] = collect_exits(large_out, lseeds).get("printed", {})
    part["auto_goal"] = auto_goal(part["summary"], cells, table=ltable)
    line = (
        f"\n\nLarger scale, {' and '.join(cells)} (printed algorithm): width {lscale['width']}, "
        f"{lscale['rounds']} rounds, {lscale['train_subset']} images, seeds {','.join(map(str, lseeds))}, trained on "
        f"{', '.join(devices(large_out)) or 'an unrecorded device'}."
    )
    for x in cells:
        line += f" {x}: " + ", ".join(f"{k} {fmt(v[x])}" for k, v in part["summary"].items() if x in v)
        if against := [(k, v[x]) for k, v in part["paired_vs_equal"].items() if x in v]:
            line += "; against equal: " + ", ".join(f"{k} {c['mean']:+.1f} ({c['signs']})" for k, c in against)
        line += "."
    return part, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default all five)")
    ap.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="printed",
        help="Algorithm 1 as printed (default) or as the authors' code runs it (run files end in _authors-code)",
    )
    ap.add_argument(
        "--dev",
        action="store_true",
        help="development seeds (default 6,7) into table1_dev, for choosing on the validation split; never in the "
        "table",
    )
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated serving settings to train")
    ap.add_argument(
        "--large",
        action="store_true",
        help="the 80-15-5 cell at a larger scale (width 0.25, 100 rounds, "
        "20k images, seeds 1,2,3, equal/serving-rate/balanced-adj/auto; the flags override each, --settings the cell)",
    )
    args = ap.parse_args()
    quick(args)
    stem = "table1_quick" if args.quick else "table1_dev" if args.dev else "table1"
    if args.dev and "--seeds" not in {a.split("=")[0] for a in sys.argv[1:]}:
        args.seeds = "6,7"
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
        write_scale(target, scale_of(args), seeds_of(args))
        if args.large:  # one cell: 80-15-5 unless --settings names others
            large_settings = args.settings.split(",") if "--settings" in given else [LARGE["serving"]]
            cells = [(s, x) for x in large_settings for s in strategies]
        else:
            cells = [(s, "33-33-33") for s in strategies if s in SHARED]
            cells += [
                (s, x)
                for x in [x for x in SETTINGS if x in args.settings.split(",")]
                for s in strategies
                if s not in SHARED and not (s in EQUAL_AT_33 and x == "33-33-33")
            ]
        campaign(args, dataset, runs, target, cells, seeds_of(args), on_run=lambda: report(out, large_out, stem))
    report(out, large_out, stem)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
