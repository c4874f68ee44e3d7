"""The CIS paper's Table 2: highly biased partition, 80-15-5, serving-rate with p = 0 vs p = 0.2.

Also equal weight at p = 0. Reduced scale as in table1.py (same flags).
The paper's text defines p_ie = p for e < E_i (--p-rule paper, default); the
notes say the authors' code (p/(E_i-1) per lower exit) produced the published
table: --p-rule code runs that.

    python benchmarks/table2.py [--quick] [--p-rule paper|code]
Writes benchmarks/results/table2.json and table2.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import RESULTS, common_args, ensure_cifar, quick, train  # noqa: E402

PAPER = {"equal p=0": 36.5, "serving-rate p=0": 41.3, "serving-rate p=0.2": 49.2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--p-rule", default="paper", choices=("paper", "code"))
    ap.add_argument("--p-mode", default="divide", choices=("divide", "multiply"), help="divide by p_ie (paper) or multiply (authors' code)")
    args = ap.parse_args()
    quick(args)
    dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    runs = Path(args.runs or f"/tmp/cis-bench/table2{'-quick' if args.quick else ''}")
    start = time.perf_counter()
    cells = {}
    for name, strategy, p in (("equal p=0", "equal", 0.0), ("serving-rate p=0", "serving-rate", 0.0), ("serving-rate p=0.2", "serving-rate", 0.2)):
        summary = train(runs / name.replace(" ", "_"), dataset, strategy, "80-15-5", args, partition="highly-biased", p=p, p_rule=args.p_rule, p_mode=args.p_mode)
        cells[name] = {"cis_accuracy": 100 * summary["cis_accuracy"], "exit_accuracy": summary["test"]["exit_accuracy"]}
    elapsed = time.perf_counter() - start
    scale = {k: getattr(args, k) for k in ("width", "rounds", "train_subset", "local_epochs", "seed", "p_rule", "p_mode")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    variant = "" if (args.p_rule, args.p_mode) == ("paper", "divide") else f"_{args.p_rule}-{args.p_mode}"
    stem = ("table2_quick" if args.quick else "table2") + variant
    (RESULTS / f"{stem}.json").write_text(json.dumps({"scale": scale, "cells": cells, "paper": PAPER, "seconds": elapsed}, indent=2))
    lines = [f"# Table 2 at reduced scale (CIFAR-10, highly biased partition, 80-15-5)\n", f"Scale: {scale}; {elapsed / 60:.1f} min.\n",
             "| run | CIS accuracy ours | paper |", "|---|---|---|"]
    lines += [f"| {k} | {v['cis_accuracy']:.1f} | {PAPER[k]:.1f} |" for k, v in cells.items()]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
