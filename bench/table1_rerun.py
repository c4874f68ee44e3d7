"""Table 1's runs trained again (same config, same seed) on the machine at hand: how far a rerun lands.

A run is deterministic on one machine (tests/test_train_cli.py), but another machine's kernels round
differently and 60 rounds of SGD carry the difference into a different model. Table 1's printed runs of
equal, flops, serving-rate and balanced-adj come from issue 17's machine; later strategies (auto, the ramps,
authors-code) were trained on later ones. This benchmark retrains the named strategies' runs (default:
equal, the baseline every comparison is paired on) into bench/results/table1_rerun/runs/ and reports,
per serving setting, the rerun minus the stored run, paired on the seed. A mean far from zero is a machine
effect that a cross-machine comparison (auto or authors-code against issue 17's runs) carries.

    python -m bench.table1_rerun [--seeds 1,2,3,4,5] [--strategies equal,flops] [--commit]
    python -m bench.table1_rerun --report
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from bench.args import common_args, scale_of, seeds_of
from bench.harness import RESULTS, ensure_cifar, machine, write_results, write_scale
from bench.stats import add_holm, fmt_test, paired, stats
from bench.table1 import SETTINGS, SHARED, campaign, load_scale, run_files, run_name

STORED, OUT = RESULTS / "table1", RESULTS / "table1_rerun"


def records(folder: Path, seeds: list[int]) -> dict[str, dict]:
    """Table 1's run files of ``folder`` (:func:`table1.run_files`) by run name."""
    return {run_name(r["seed"], r["strategy"], r["trained_for"], r["algorithm"]): r for r in run_files(folder, seeds)}


def compare(seeds: list[int]) -> dict:
    """{strategy: {setting: {stored, rerun, rerun_minus_stored}}} over the seeds both have; where the stored
    table has the same strategy's authors-code run of a seed (trained on the rerun's machine), also
    ``rerun_minus_authors_code``: the printed algorithm against the authors' on one machine, paired on the seed."""
    stored, rerun = records(STORED, seeds), records(OUT, seeds)
    result: dict[str, dict] = {}
    authors: dict[tuple, dict[int, float]] = {}
    for name, r in rerun.items():
        if name not in stored:
            continue
        theirs = stored.get(run_name(r["seed"], r["strategy"], r["trained_for"], "authors-code"))
        for setting, acc in r["cis_accuracy"].items():
            cell = result.setdefault(r["strategy"], {}).setdefault(setting, {"seeds": [], "stored": [], "rerun": []})
            cell["seeds"].append(r["seed"])
            cell["stored"].append(stored[name]["cis_accuracy"][setting])
            cell["rerun"].append(acc)
            if theirs and setting in theirs["cis_accuracy"]:
                authors.setdefault((r["strategy"], setting), {})[r["seed"]] = theirs["cis_accuracy"][setting]
    flat, flat_authors = {}, {}
    for strategy, cells in result.items():
        for setting, c in cells.items():
            c["stored_stats"], c["rerun_stats"] = stats(c["stored"]), stats(c["rerun"])
            c["rerun_minus_stored"] = flat[f"{strategy} {setting}"] = paired(c["rerun"], c["stored"])
            theirs_by_seed = authors.get((strategy, setting), {})
            if both := [k for k, s in enumerate(c["seeds"]) if s in theirs_by_seed]:
                c["rerun_minus_authors_code"] = flat_authors[f"{strategy} {setting}"] = {
                    **paired([c["rerun"][k] for k in both], [theirs_by_seed[c["seeds"][k]] for k in both]),
                    "seeds": [c["seeds"][k] for k in both],
                }
    add_holm(flat)
    add_holm(flat_authors)
    return result


def report(seeds: list[int]) -> None:
    result = compare(seeds)
    lines = [
        "# Table 1's runs retrained on another machine (same config, same seed)\n",
        f"Seeds {','.join(map(str, seeds))}; stored runs: bench/results/table1/runs (issue 17's machine); "
        f"reruns: bench/results/table1_rerun/runs ({platform.machine()}, {machine()['cpus']} CPUs). "
        "CIS accuracy (%) mean ± sd; rerun - stored paired on the seed (signs per seed), t-test p / Holm.\n",
        "| strategy | setting | stored | rerun | rerun - stored | rerun - authors-code (same machine) |",
        "|---|---|---|---|---|---|",
    ]
    for strategy, cells in result.items():
        for setting in [s for s in SETTINGS if s in cells]:
            c = cells[setting]
            theirs = fmt_test(c["rerun_minus_authors_code"]) if "rerun_minus_authors_code" in c else "–"
            lines.append(
                f"| {strategy} | {setting} | {c['stored_stats']['mean']:.1f} ± {c['stored_stats']['sd']:.1f} | "
                f"{c['rerun_stats']['mean']:.1f} ± {c['rerun_stats']['sd']:.1f} | {fmt_test(c['rerun_minus_stored'])} "
                f"| {theirs} |"
            )
    write_results("table1_rerun", {"seeds": seeds, "by_strategy": result, "machine": machine()}, lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--strategies", default="equal", help=f"comma-separated, of {', '.join(SHARED)} (default equal)")
    args = ap.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    if any(s not in SHARED for s in strategies):
        sys.exit(f"--strategies: {strategies}; expected some of {', '.join(SHARED)} (scored in every cell)")
    seeds = seeds_of(args)
    if not args.report:
        scale = load_scale(STORED)
        if scale is None or {k: v for k, v in scale[0].items() if k != "seeds"} != scale_of(args):
            sys.exit(f"the flags' scale {scale_of(args)} is not Table 1's ({STORED / 'scale.json'})")
        missing = [run_name(s, x, "33-33-33") for s in seeds for x in strategies]
        missing = [m for m in missing if not (STORED / "runs" / f"{m}.json").is_file()]
        if missing:
            sys.exit(f"no stored run to compare with: {', '.join(missing)} (bench/results/table1/runs)")
        OUT.mkdir(parents=True, exist_ok=True)
        write_scale(OUT, scale_of(args), seeds)
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        runs = Path(args.runs or "/tmp/cis-bench/table1_rerun")
        campaign(args, dataset, runs, OUT, [(s, "33-33-33") for s in strategies], seeds, on_run=lambda: report(seeds))
    report(seeds)
    print((RESULTS / "table1_rerun.md").read_text())


if __name__ == "__main__":
    main()
