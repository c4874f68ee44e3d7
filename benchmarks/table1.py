"""The CIS paper's Table 1 (CIFAR-10, paper-7, equal partition) at a scale a 2-core CPU can run.

Strategies equal / flops are trained once and evaluated under every serving
setting; serving-rate and balanced-adj depend on the setting and are trained per
setting (serving-rate at 33-33-33 IS equal weight, so that cell reuses the
equal run, as the paper's identical numbers show). Reduced scale (say so in
any report): a narrow ResNet-18 (--width), fewer rounds, a subset of the
training images, one seed.

    python benchmarks/table1.py [--quick] [--width 0.125] [--rounds 15] [--train-subset 7000]
Writes benchmarks/results/table1.json, table1.md and table1.png (matplotlib).
CIFAR-10 comes from ../shared/data/cifar10-jpeg.zip, unzipped to /tmp/cifar10.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
ZIP = REPO.parent / "shared" / "data" / "cifar10-jpeg.zip"
if not ZIP.is_file():
    ZIP = Path("/work/shared/data/cifar10-jpeg.zip")
SETTINGS = ["80-15-5", "33-33-33", "5-15-80"]
PAPER_TABLE1 = {  # CIFAR-10, equal partition, mean of 3 seeds (paper Table 1)
    "equal": {"80-15-5": 49.9, "33-33-33": 74.9, "5-15-80": 85.1},
    "flops": {"80-15-5": 32.1, "33-33-33": 67.3, "5-15-80": 86.3},
    "serving-rate": {"80-15-5": 54.2, "33-33-33": 74.9, "5-15-80": 86.7},
    "balanced-adj": {"80-15-5": 53.4, "33-33-33": 74.9, "5-15-80": 87.6},
}


def ensure_cifar(path: Path) -> Path:
    if not (path / "train").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["unzip", "-q", "-o", str(ZIP), "-d", str(path)], check=True)
    return path


def train(out: Path, dataset: str, strategy: str, serving: str, args, **extra) -> dict:
    from training.config import make_config
    from training.run import train_run

    if (out / "summary.json").is_file():  # finished earlier: reuse
        return json.loads((out / "summary.json").read_text())
    overrides = dict(
        dataset=dataset, strategy=strategy, serving=serving, rounds=args.rounds, width=args.width, seed=args.seed,
        train_subset=args.train_subset, val_size=args.val_size, eval_every=args.rounds, threads=args.threads,
        local_epochs=args.local_epochs, **extra,
    )
    config = make_config(overrides=overrides)
    resume = (out / "checkpoint.pt").is_file()
    t = time.perf_counter()
    summary = train_run(config, out, resume=resume, progress=True)
    summary["train_wall_seconds"] = time.perf_counter() - t
    return summary


def evaluate(run: Path, serving: str) -> float:
    from cis.spec import parse_spec
    from cis.topologies import apply_serving, parse_serving
    from training.run import evaluate_run

    meta = json.loads((run / "checkpoint.json").read_text())
    spec = apply_serving(parse_spec(meta["spec"]), parse_serving(serving, 3))
    return 100 * evaluate_run(run, spec)["cis_accuracy"]


def common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="smoke setting: tiny width, 1 round, 1400 images")
    ap.add_argument("--data", default="/tmp/cifar10")
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--train-subset", type=int, default=7000)
    ap.add_argument("--val-size", type=int, default=2000)
    ap.add_argument("--local-epochs", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", default=None, help="folder for the runs (default /tmp/cis-bench/<script>)")


def quick(args) -> None:
    if args.quick:
        args.width, args.rounds, args.train_subset, args.val_size, args.local_epochs = 0.0625, 1, 1400, 500, 0.25


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    args = ap.parse_args()
    quick(args)
    dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    runs = Path(args.runs or f"/tmp/cis-bench/table1{'-quick' if args.quick else ''}")
    start = time.perf_counter()
    table: dict[str, dict[str, float]] = {s: {} for s in PAPER_TABLE1}
    info: dict[str, dict] = {}
    for strategy in ("equal", "flops"):
        run = runs / strategy
        summary = train(run, dataset, strategy, "33-33-33", args)
        info[strategy] = {"weights": summary["weights"], "final_exit_accuracy": summary["final_exit_accuracy"],
                          "exit_accuracy": summary["test"]["exit_accuracy"]}
        for setting in SETTINGS:
            table[strategy][setting] = evaluate(run, setting)
    for strategy in ("serving-rate", "balanced-adj"):
        for setting in SETTINGS:
            if strategy == "serving-rate" and setting == "33-33-33":
                table[strategy][setting] = table["equal"][setting]  # identical weights (1/3 each)
                continue
            run = runs / f"{strategy}-{setting}"
            summary = train(run, dataset, strategy, setting, args)
            info[f"{strategy}@{setting}"] = {"weights": summary["weights"], "exit_accuracy": summary["test"]["exit_accuracy"]}
            table[strategy][setting] = 100 * summary["cis_accuracy"]
    elapsed = time.perf_counter() - start
    scale = {k: getattr(args, k) for k in ("width", "rounds", "train_subset", "val_size", "local_epochs", "seed", "threads")}
    result = {"scale": scale, "cis_accuracy": table, "paper": PAPER_TABLE1, "runs": info, "seconds": elapsed}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "table1_quick" if args.quick else "table1"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Table 1 at reduced scale (CIFAR-10, paper-7, equal partition)\n",
        f"Scale: ResNet-18 width {args.width}, {args.rounds} rounds, {args.train_subset} training images, "
        f"seed {args.seed}, one seed only; {elapsed / 60:.1f} min. Paper: full ResNet-18, 100 rounds, 45k images, 3 seeds.\n",
        "| strategy | " + " | ".join(f"{s} ours | {s} paper" for s in SETTINGS) + " |",
        "|---|" + "---|---|" * len(SETTINGS),
    ]
    for s in PAPER_TABLE1:
        lines.append(f"| {s} | " + " | ".join(f"{table[s][x]:.1f} | {PAPER_TABLE1[s][x]:.1f}" for x in SETTINGS) + " |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
        for ax, (title, data) in zip(axes, (("ours (reduced scale)", table), ("paper Table 1", PAPER_TABLE1))):
            for s, row in data.items():
                ax.plot(SETTINGS, [row[x] for x in SETTINGS], marker="o", label=s)
            ax.set_title(title), ax.set_xlabel("serving setting"), ax.set_ylabel("CIS accuracy (%)")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")


if __name__ == "__main__":
    main()
