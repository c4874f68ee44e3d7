"""Add ``sgd_steps`` to the paper tables' run files written before runs recorded their SGD steps (issue 22).

Each run is rebuilt from its table's scale.json and its own record (seed, strategy, serving, p and
overrides) and its exit draws are replayed (``_models.replayed_sgd_steps``); nothing is trained. The
steps do not depend on the aggregation weights, so the replay builds every run with equal weights
(no gradient-variance measurement). Files that already hold ``sgd_steps`` are left alone.

    python -m bench.backfill_steps [--data /tmp/cifar10] [--commit]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.campaign import save_run
from bench.harness import RESULTS, ensure_cifar
from bench.models import replayed_sgd_steps

FOLDERS = ("table1", "table1_large", "table2", "table2_diagnostics")


def run_config(folder: str, scale: dict, record: dict, dataset: str):
    from cis.training.config import make_config

    overrides = dict(
        dataset=dataset,
        strategy="equal",
        rounds=scale["rounds"],
        width=scale["width"],
        seed=record["seed"],
        train_subset=scale["train_subset"],
        val_size=scale["val_size"],
        local_epochs=scale["local_epochs"],
        threads=scale.get("threads"),
    )
    if folder.startswith("table1"):
        overrides["serving"] = record["trained_for"]
    else:
        overrides.update(serving="80-15-5", partition="highly-biased", p=record["p"], **record.get("overrides", {}))
    return make_config(overrides=overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/cifar10")
    ap.add_argument("--commit", action="store_true", help="git-commit each updated run file")
    args = ap.parse_args()
    dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    for folder in FOLDERS:
        out = RESULTS / folder
        scale_file = out / "scale.json" if (out / "scale.json").is_file() else RESULTS / "table2" / "scale.json"
        scale = json.loads(scale_file.read_text())
        for f in sorted((out / "runs").glob("seed*.json")):
            record = json.loads(f.read_text())
            if record.get("sgd_steps"):
                continue
            weights = record.get("weights", {})
            auto = dict(auto_candidates=len(weights.get("candidates", {})) or 1,
                        pilot_rounds=int(weights.get("pilot_rounds", 0)))
            record["sgd_steps"] = replayed_sgd_steps(run_config(folder, scale, record, dataset), **auto)
            save_run(f, record, args.commit)
            print(f"{folder}/{f.stem}: {record['sgd_steps']['total']} steps, root {record['sgd_steps']['root']}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
