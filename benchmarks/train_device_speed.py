"""Training throughput of the Table 1 model on a device: images per second of federated local training.

The Table 1 setting of benchmarks/table1.py (ResNet18EE at width 0.125, paper-7, CIFAR-10 with 7000
training images, equal partition, serving-rate weights at 80-15-5, local_epochs 0.25, batch 128): the
engine runs ``--rounds`` rounds and each round's images (the sum over its (node, exit) pairs of
steps x batch) are divided by its train seconds. Round 1 pays the warm-up (cuDNN autotuning, first
allocations) and is left out; the result is the median over the other rounds, evaluation excluded.

    python benchmarks/train_device_speed.py --device cpu                 # this machine's CPU
    python benchmarks/train_device_speed.py --device cuda [--amp bf16]   # a GPU (the same numbers, another name)
    python benchmarks/train_device_speed.py --width 0.25 --train-subset 20000   # the larger-scale cell's model

Writes benchmarks/results/train_device_speed_<device>[_<amp>].json (``--out`` for another name).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _results import ensure_cifar, machine, write_results


def measure(args) -> dict:
    import torch

    from training.config import make_config
    from training.run import build_setup

    config = make_config(
        overrides=dict(
            dataset=f"cifar10:{ensure_cifar(Path(args.data))}",
            strategy="serving-rate",
            serving="80-15-5",
            rounds=args.rounds,
            width=args.width,
            seed=1,
            train_subset=args.train_subset,
            val_size=args.val_size,
            threads=args.threads,
            local_epochs=0.25,
            device=args.device,
            amp=args.amp,
        )
    )
    s = build_setup(config)
    per_round = []
    for _ in range(args.rounds):
        r = s.engine.run_round()
        if s.device.type == "cuda":
            torch.cuda.synchronize()
        images = sum(p["samples"] for p in r["pairs"])
        per_round.append({"round": r["round"], "images": images, "seconds": r["train_seconds"]})
    timed = per_round[1:] or per_round
    rates = [p["images"] / p["seconds"] for p in timed]
    return {
        "device": str(s.device) if s.device.type == "cpu" else torch.cuda.get_device_name(s.device),
        "amp": args.amp,
        "threads": torch.get_num_threads(),
        "width": args.width,
        "train_subset": args.train_subset,
        "rounds": per_round,
        "images_per_s_median": statistics.median(rates),
        "seconds_per_round_median": statistics.median(p["seconds"] for p in timed),
        "machine": machine(),
        "command": "python benchmarks/train_device_speed.py " + " ".join(args.argv),
    }


def main() -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:K | auto")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--train-subset", type=int, default=7000)
    ap.add_argument("--val-size", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--data", default="/tmp/cifar10")
    ap.add_argument("--out", default=None, help="result name in benchmarks/results")
    args = ap.parse_args()
    args.argv = sys.argv[1:]
    result = measure(args)
    name = args.out or f"train_device_speed_{args.device.split(':')[0]}" + ("" if args.amp == "off" else f"_{args.amp}")
    write_results(name, result)
    print(
        f"{result['device']} (amp {args.amp}, {result['threads']} threads): "
        f"{result['images_per_s_median']:.0f} images/s, "
        f"{result['seconds_per_round_median']:.3f} s/round (median of rounds 2-{args.rounds})"
    )


if __name__ == "__main__":
    main()
