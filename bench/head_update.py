"""The released code's exit-head update, checked by training it (issue 35 item 2).

arodio/FedCIS's ``aggregate`` (trainingtopologies/custom_training_topology.py) writes each pair's head
difference into ``classifiers[e_block - 1]`` (2, 8, 16 for exits after layers 3, 9, 17) but applies
``classifiers[block]`` only for ``block in layers_per_classifier`` (3 and 9; 17 is past the last block), so
no non-root node's head update ever reaches the model; at p = 0 the root trains only exit 3, and heads 1
and 2 keep their initial weights. ``--head-update released-code`` reproduces that rule under
``--algorithm authors-code``; this script trains it at Table 1's scale and cell 80-15-5 (CIFAR-10, paper-7,
equal partition, ResNet-18 width 0.125, 60 rounds, 7,000 images) and compares each run with Table 1's
authors-code run of the same seed and strategy (``head_update`` applied: table1/runs), exit by exit.

    python -m bench.head_update [--seeds 1,2,3,4,5] [--strategies equal,serving-rate] [--commit]
    python -m bench.head_update --quick     # smoke: tiny scale, both rules trained here
    python -m bench.head_update --report

Results: bench/results/head_update.{json,md}; the findings are written from the JSON's numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import doc_marks
from bench.args import common_args, quick, scale_of, seeds_of
from bench.harness import RESULTS, ensure_cifar, write_scale
from bench.stats import paired, stats
from bench.table1 import PAPER_TABLE1, campaign, run_files

CELL = "80-15-5"
STRATEGIES = ["equal", "serving-rate"]
SHARED = ("equal",)  # trained once per seed (its name has no cell), evaluated at every setting
RULE = {"head_update": "released-code"}
NUM_CLASSES = 10


def folders(stem: str, is_quick: bool) -> dict[str, Path]:
    """Where each rule's run files live: released-code here; applied in Table 1's (a quick run trains its own)."""
    here = RESULTS / stem
    return {"released-code": here, "applied": here / "applied" if is_quick else RESULTS / "table1"}


def cells(strategies: list[str]) -> list[tuple[str, str]]:
    return [(s, "33-33-33" if s in SHARED else CELL) for s in strategies]


def collect(folder: Path, seeds: list[int], strategies: list[str]) -> dict[str, dict[int, dict]]:
    """{strategy: {seed: {"cis": CIS accuracy at CELL (%), "exits": [per-exit %], "root_steps": n}}}, authors-code."""
    out: dict[str, dict[int, dict]] = {}
    for r in run_files(folder, seeds):
        if r["algorithm"] != "authors-code" or r["strategy"] not in strategies or CELL not in r["cis_accuracy"]:
            continue
        exits = [100 * r["exit_accuracy"][k] for k in sorted(r["exit_accuracy"], key=int)]
        steps = (r.get("sgd_steps") or {}).get("root")
        out.setdefault(r["strategy"], {})[r["seed"]] = {"cis": r["cis_accuracy"][CELL], "exits": exits,
                                                        "root_steps": steps}  # fmt: skip
    return out


def compare(runs: dict[str, dict], seeds: list[int]) -> dict:
    """Per strategy: each rule's per-seed numbers and means, and released-code minus applied, paired by seed."""
    out: dict = {}
    released, applied = runs["released-code"], runs["applied"]
    for strategy in released:
        both = [s for s in seeds if s in released[strategy] and s in applied.get(strategy, {})]
        part: dict = {"seeds": both}
        for rule, got in (("released-code", released[strategy]), ("applied", applied.get(strategy, {}))):
            rows = [got[s] for s in both]
            part[rule] = {
                "cis": {**stats([r["cis"] for r in rows]), "per_seed": [r["cis"] for r in rows]},
                "exits": [round(sum(col) / len(col), 2) for col in zip(*[r["exits"] for r in rows])],
                "exits_per_seed": [[round(v, 2) for v in r["exits"]] for r in rows],
                "root_steps": [r["root_steps"] for r in rows],
            }
        if both:
            part["cis_difference"] = paired([released[strategy][s]["cis"] for s in both],
                                            [applied[strategy][s]["cis"] for s in both])  # fmt: skip
            part["exit_difference"] = [
                round(a - b, 2) for a, b in zip(part["released-code"]["exits"], part["applied"]["exits"])
            ]
        part["paper"] = PAPER_TABLE1.get(strategy, {}).get(CELL)
        out[strategy] = part
    return out


def findings(result: dict) -> list[str]:
    """What the runs say, every number from ``result``."""
    lines = ["## Findings (written by bench/head_update.py from head_update.json)\n"]
    for strategy, c in result["strategies"].items():
        if not c["seeds"]:
            lines.append(f"- {strategy}: no seed has both rules' runs yet.")
            continue
        r, a = c["released-code"], c["applied"]
        exits = " / ".join(f"{x:.1f}" for x in r["exits"])
        applied_exits = " / ".join(f"{x:.1f}" for x in a["exits"])
        paper = "" if c["paper"] is None else f"; the paper's Table 1 reports {c['paper']:.1f}"
        lines.append(
            f"- {strategy} at {CELL}, seeds {','.join(map(str, c['seeds']))}: under the released rule exits 1/2/3 "
            f"score {exits} % (chance {result['chance']:.1f} %) against {applied_exits} % with every head update "
            f"applied; CIS accuracy {r['cis']['mean']:.2f} against {a['cis']['mean']:.2f} "
            f"({c['cis_difference']['mean']:+.2f}, {c['cis_difference']['signs']}){paper}."
        )
    return lines


def figures(result: dict) -> dict[str, str]:
    """The figures README and docs quote between ``<!--head_update NAME-->`` markers (bench/doc_marks.py): per
    strategy, how many paired seeds and the released rule's CIS accuracy minus the applied one's, with its signs."""
    out: dict[str, str] = {}
    for strategy, c in result["strategies"].items():
        key, d = strategy.replace("-", "_"), c.get("cis_difference")
        out[f"{key}_seeds"] = str(len(c["seeds"]))
        out[f"{key}_difference"] = "not run yet" if d is None else f"{d['mean']:+.2f} ({d['signs']})"
    return out


def markdown(result: dict) -> str:
    s = result["scale"]
    lines = [
        "# The released code's exit-head rule, trained (issue 35 item 2)\n",
        f"CIFAR-10, paper-7, equal partition, algorithm authors-code, cell {CELL}; ResNet-18 width {s.get('width')}, "
        f"{s.get('rounds')} rounds, {s.get('train_subset')} images, local epochs {s.get('local_epochs')}. "
        "released-code: `--head-update released-code` (no non-root head update applied, as arodio/FedCIS's "
        "aggregate runs); applied: the default (Table 1's authors-code runs; with --quick, trained beside them). "
        "Test accuracy (%).\n",
        "| strategy | rule | seeds | CIS accuracy | exit 1 | exit 2 | exit 3 | root SGD steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for strategy, c in result["strategies"].items():
        for rule in ("released-code", "applied"):
            r = c.get(rule)
            if not c["seeds"] or not r:
                continue
            ex = " | ".join(f"{x:.1f}" for x in r["exits"])
            steps = " / ".join(str(x) for x in r["root_steps"])
            cis = f"{r['cis']['mean']:.2f} ± {r['cis']['sd']:.2f}"
            lines.append(f"| {strategy} | {rule} | {','.join(map(str, c['seeds']))} | {cis} | {ex} | {steps} |")
    return "\n".join(lines)


def report(stem: str, is_quick: bool, seeds: list[int], strategies: list[str]) -> dict:
    where = folders(stem, is_quick)
    scale = json.loads((where["released-code"] / "scale.json").read_text()) if (
        where["released-code"] / "scale.json").is_file() else {}  # fmt: skip
    runs = {rule: collect(folder, seeds, strategies) for rule, folder in where.items()}
    if not any(runs["applied"].values()):  # Table 1's run files left git: a report without them compares nothing
        raise SystemExit(f"head_update: no applied run under {where['applied']} for seeds {seeds}; restore Table 1's "
                         "run files first (python -m bench.runs unpack ARCHIVE)")
    result = {
        "cell": CELL,
        "seeds": seeds,
        "scale": {k: v for k, v in scale.items() if k != "seeds"},
        "chance": 100 / NUM_CLASSES,
        "folders": {rule: str(f.relative_to(RESULTS)) for rule, f in where.items()},
        "strategies": compare(runs, seeds),
    }
    result["findings"] = "\n".join(findings(result))
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{stem}.md").write_text(markdown(result) + "\n\n" + result["findings"] + "\n")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.set_defaults(seeds="1,2,3,4,5")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default equal,serving-rate)")
    args = ap.parse_args()
    quick(args)
    stem = "head_update_quick" if args.quick else "head_update"
    seeds, strategies = seeds_of(args), [s for s in args.strategies.split(",") if s]
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        raise SystemExit(f"--strategies: unknown {unknown}; expected some of {STRATEGIES}")
    args.algorithm = "authors-code"
    if not args.report:
        dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
        base = Path(args.runs or f"/tmp/cis-bench/{stem}")
        todo = {"released-code": RULE, **({"applied": {}} if args.quick else {})}
        for rule, overrides in todo.items():
            out = folders(stem, args.quick)[rule]
            out.mkdir(parents=True, exist_ok=True)
            write_scale(out, scale_of(args), seeds)
            campaign(args, dataset, base / rule, out, cells(strategies), seeds, overrides=overrides or None)
    result = report(stem, args.quick, seeds, strategies)
    if not args.quick:
        print(f"README.md and docs/: {doc_marks.fill('head_update', figures(result))} head_update figures")
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
