"""The flags the benchmarks share: the training scale, the paper tables', the ViT and nested-method benchmarks'."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.harness import ensure_cifar


def scale_args(
    ap: argparse.ArgumentParser,
    quick_help: str,
    rounds: int,
    train_subset: int,
    seed: int = 0,
    threads: int = 2,
    threads_help: str | None = None,
) -> None:
    """The flags of every training benchmark's scale: --quick, --data (CIFAR-10), --rounds, --train-subset,
    --seed, --threads."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--data", default="/tmp/cifar10", help="CIFAR-10 folder (image-folder or pickle layout)")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--train-subset", type=int, default=train_subset)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--threads", type=int, default=threads, help=threads_help)


def common_args(ap: argparse.ArgumentParser, rounds: int = 60, local_epochs: float = 0.25) -> None:
    ap.add_argument("--quick", action="store_true", help="smoke setting: tiny width, 2 rounds, 1400 images, 1 seed")
    ap.add_argument("--data", default="/tmp/cifar10")
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--train-subset", type=int, default=7000)
    ap.add_argument("--val-size", type=int, default=2000)
    ap.add_argument("--local-epochs", type=float, default=local_epochs)
    ap.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds (default 1,2,3,4,5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    ap.add_argument("--eval-every", type=int, default=10, help="validation every N rounds (metrics.jsonl)")
    ap.add_argument("--runs", default=None, help="folder for the run dirs (default /tmp/cis-bench/<script>)")
    ap.add_argument("--report", action="store_true", help="only rebuild the result files from the per-run files")
    ap.add_argument("--commit", action="store_true", help="git-commit each finished run's file (long campaigns)")


def quick(args) -> None:
    if args.quick:
        args.width, args.rounds, args.train_subset, args.val_size, args.local_epochs = 0.0625, 2, 1400, 500, 0.25
        args.seeds = args.seeds if args.seeds != "1,2,3,4,5" else "1"


def seeds_of(args) -> list[int]:
    return [int(s) for s in str(args.seeds).split(",") if s.strip()]


def scale_of(args, keys=("width", "rounds", "train_subset", "val_size", "local_epochs", "threads")) -> dict:
    return {k: getattr(args, k) for k in keys}


def vit_args(description: str, rounds: int, exits: str) -> argparse.ArgumentParser:
    """The flags flame.py and reefl.py share (CIFAR-10 subset, a ViT, the paper-7 tree)."""
    ap = argparse.ArgumentParser(description=description)
    scale_args(ap, "smoke setting: 1 round, 700 images, narrow model", rounds=rounds, train_subset=5000)
    ap.add_argument("--val-size", type=int, default=1000)
    ap.add_argument("--width", type=float, default=1.0, help="ViT width multiplier (dim 64 x width)")
    ap.add_argument("--local-epochs", type=float, default=1.0)
    ap.add_argument("--exits", default=exits, help="ViT blocks with an exit (vit_exits); the spec gets as many exits")
    ap.add_argument("--out", default=None, help="result name (default: the benchmark's, -quick with --quick)")
    ap.add_argument(
        "--report-only", action="store_true", help="rewrite the markdown (and directions) from the saved json"
    )
    return ap


def vit_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds, args.train_subset, args.val_size, args.width, args.local_epochs = 1, 700, 300, 0.5, 0.25


def nested_args(
    description: str, argv: list[str] | None = None, extra: Any = None, **defaults: Any
) -> argparse.Namespace:
    """The nested-method benchmarks' flags; ``extra(parser)`` adds a benchmark's own."""
    p = argparse.ArgumentParser(description=description)
    scale_args(
        p,
        "tiny smoke run (minutes); numbers mean nothing",
        rounds=defaults.get("rounds", 16),
        train_subset=10000,
        threads=1,
        threads_help="torch threads (default 1: small convs gain little from more)",
    )
    p.add_argument("--local-steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--val", type=int, default=1000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument(
        "--width", type=float, default=defaults.get("width", 0.5), help="channel multiplier of ResNet20 (default 0.5)"
    )
    p.add_argument("--only", help="comma-separated run names")
    p.add_argument("--verbose", action="store_true")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.local_steps, args.batch_size = 2, 2, 32
        args.train_subset, args.val, args.test = 600, 200, 300
    args.dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    return args
