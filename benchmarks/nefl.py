"""NeFL vs the nested baselines on reduced-scale CIFAR-10 (ResNet20, paper-7, 3 sub-models).

Runs, all through ``build_setup`` (the engine of ``cis train --method``), with the
papers' weighting (``--strategy equal``: every client weighs |S_i|):

- ``nefl-WD`` / ``nefl-W`` / ``nefl-D``: NeFL with width and depth, width only, depth only;
- ``heterofl``, ``fjord``: the width baselines (shared / per-sub-model BN, ordered dropout);
- ``depthfl-prefix``: DepthFL as NeFL implements it (Appendix B.3): sub-model k is a
  contiguous prefix of the blocks (plus the downsampling blocks), unit steps, not learned.

Every run reports the test accuracy of sub-models 1..3 (a CIS tier serves its
sub-model) and the CIS accuracy at 33-33-33. The papers' directions: NeFL-D's
smallest sub-model well above the DepthFL-style prefix; HeteroFL's smallest
sub-model the worst among the width methods (NeFL-W, HeteroFL, FjORD).

Reduced scale (say so with any number): ResNet20 at half width (channels 8/16/32), 10k training images, 16 rounds of 6 local
steps of 64, test on 2,000 and validation on 1,000 images, one seed. The full run
takes about 17 minutes on this 2-core CPU at a load of 3 (about 64 s per round for all six runs),
roughly twice that when the machine is as busy as it was while this was written (load 10); ``--quick`` is a smoke test.

    python benchmarks/nefl.py [--quick] [--rounds 16] [--train-subset 10000]
Writes benchmarks/results/nefl.json and nefl.md. CIFAR-10 comes from
../shared/data/cifar10-jpeg.zip, unzipped to /tmp/cifar10.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import RESULTS, ensure_cifar  # noqa: E402  (repo on sys.path, the CIFAR-10 unzip)

RUNS = {  # name -> (method, options)
    "nefl-WD": ("nefl", {"nefl_mode": "WD"}),
    "nefl-W": ("nefl", {"nefl_mode": "W"}),
    "nefl-D": ("nefl", {"nefl_mode": "D"}),
    "heterofl": ("heterofl", {}),
    "fjord": ("fjord", {}),
    "depthfl-prefix": ("heterofl", {}),  # its model is swapped for the prefix sub-models below
}
WIDTH_METHODS = ("nefl-W", "heterofl", "fjord")


def load_splits(dataset: str, seed: int, val: int, test: int):
    """The dataset with seeded subsets of its validation and test splits (the training subset is the config's)."""
    from training.data import DataSplits, load_dataset

    splits = load_dataset(dataset, seed=seed, val_size=val)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.permutation(len(splits.test))[:test])
    return DataSplits(splits.train, splits.val, splits.test.subset(keep))


def make_setup(method: str, options: dict, splits, args, **extra):
    from training.config import make_config
    from training.run import build_setup

    config = make_config(overrides=dict(
        dataset=args.dataset, method=method, options=options, strategy="equal", rounds=args.rounds, seed=args.seed,
        train_subset=args.train_subset, local_steps=args.local_steps, batch_size=args.batch_size,
        threads=args.threads, width=args.width, **extra,
    ))
    return build_setup(config, splits=splits)


def train_and_report(name: str, s, args) -> dict:
    """Run all rounds of a setup; test accuracy per sub-model, CIS accuracy, seconds."""
    from training.run import final_report

    t0 = time.perf_counter()
    for _ in range(s.config.rounds):
        r = s.engine.run_round()
        if args.verbose:
            loss = np.mean([p["loss"] for p in r["pairs"]])
            print(f"  {name} round {r['round']}: loss {loss:.3f} ({r['train_seconds']:.1f} s)", file=sys.stderr)
    train_s = time.perf_counter() - t0
    report = final_report(s)
    acc = {int(e): float(v) for e, v in report["exit_accuracy"].items()}
    out = {
        "method": s.config.method, "options": s.config.options, "submodel_accuracy": acc,
        "smallest": acc[1], "largest": acc[max(acc)], "mean": float(np.mean(list(acc.values()))),
        "cis_accuracy": float(report["cis_accuracy"]), "train_seconds": train_s,
        "total_seconds": time.perf_counter() - t0,
        "params": [int(sum(v.numel() for v in s.model.submodel(k).state_dict().values() if v.is_floating_point()))
                   for k in range(1, s.model.num_exits + 1)],
    }
    print(f"{name:15s} sub-models " + " ".join(f"{100 * v:5.1f}" for v in acc.values())
          + f"  CIS {100 * out['cis_accuracy']:5.1f}  ({out['total_seconds']:.0f} s)", file=sys.stderr)
    return out


def depthfl_prefix(s, args):
    """Swap a heterofl setup's model for DepthFL-style prefix sub-models (decoupled BN, fixed unit steps)."""
    import torch

    from training.engine import FederatedEngine
    from training.methods.nested import NestedNet, depthfl_specs
    from training.methods.subfl import build_subset_method, default_gammas

    torch.manual_seed(s.config.seed)
    layout = s.model.layout
    model = NestedNet(layout, depthfl_specs(layout, default_gammas(s.model.num_exits)), decoupled_bn=True, use_steps=False)
    c = s.config
    sgd = dict(lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay, batch_size=c.batch_size, steps=s.steps,
               total_rounds=c.rounds, schedule=c.schedule, augment=s.engine.trainer.augment)
    pieces = build_subset_method("heterofl", model, s.clients, sgd, c.participation)
    s.model, s.engine = model, FederatedEngine(model, s.clients, *pieces, seed=c.seed)
    return s


def directions(results: dict) -> dict:
    r = results
    out = {}
    if "nefl-D" in r and "depthfl-prefix" in r:
        gap = r["nefl-D"]["smallest"] - r["depthfl-prefix"]["smallest"]
        out["nefl_d_smallest_above_depthfl_prefix"] = {"gap_pp": 100 * gap, "holds": gap > 0.02}
    width = [m for m in WIDTH_METHODS if m in r]
    if "heterofl" in width and len(width) > 1:
        worst = min(width, key=lambda m: r[m]["smallest"])
        out["heterofl_smallest_worst_of_width_methods"] = {"worst": worst, "holds": worst == "heterofl"}
    return out


def write_results(name: str, data: dict, table: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    (RESULTS / f"{name}.md").write_text("\n".join(table) + "\n")
    print(f"wrote {RESULTS / name}.json and .md", file=sys.stderr)


def markdown(data: dict) -> list[str]:
    a = data["args"]
    lines = [
        "# NeFL vs nested baselines (reduced-scale CIFAR-10, ResNet20 x width, paper-7, 3 sub-models)",
        "",
        f"{'QUICK SMOKE RUN, not a result. ' if a['quick'] else ''}Reduced scale: {a['train_subset']} training images, "
        f"ResNet20 at width {a['width']}, {a['rounds']} rounds x {a['local_steps']} local steps of {a['batch_size']}, test on {a['test']} images, seed {a['seed']}; "
        "papers' weighting (--strategy equal). Test accuracy (%) per sub-model; CIS accuracy at 33-33-33.",
        "",
        "| run | sub-model 1 | sub-model 2 | sub-model 3 | mean | CIS | params (1/2/3) | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["runs"].items():
        acc = r["submodel_accuracy"]
        lines.append(
            f"| {name} | " + " | ".join(f"{100 * acc[k]:.1f}" for k in sorted(acc)) + f" | {100 * r['mean']:.1f} | "
            f"{100 * r['cis_accuracy']:.1f} | {'/'.join(f'{p / 1000:.0f}k' for p in r['params'])} | {r['total_seconds']:.0f} |"
        )
    lines += ["", "Directions from the papers:", ""]
    for k, v in data["directions"].items():
        detail = ", ".join(f"{a}={b:+.1f}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items() if a != "holds")
        lines.append(f"- {k}: {'holds' if v['holds'] else 'does NOT hold'} ({detail})")
    lines.append(f"\nTotal {data['seconds']:.0f} s.")
    return lines


def parse_args(argv=None, **defaults):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny smoke run (minutes); numbers mean nothing")
    p.add_argument("--data", default="/tmp/cifar10")
    p.add_argument("--rounds", type=int, default=defaults.get("rounds", 16))
    p.add_argument("--local-steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train-subset", type=int, default=10000)
    p.add_argument("--val", type=int, default=1000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=float, default=defaults.get("width", 0.5), help="channel multiplier of ResNet20 (default 0.5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: small convs gain little from more)")
    p.add_argument("--only", help="comma-separated run names")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.local_steps, args.batch_size = 2, 2, 32
        args.train_subset, args.val, args.test = 600, 200, 300
    args.dataset = f"cifar10:{ensure_cifar(Path(args.data))}"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from training.data import load_dataset  # noqa: F401  (fail early on a missing dataset)

    t0 = time.perf_counter()
    splits = load_splits(args.dataset, args.seed, args.val, args.test)
    names = args.only.split(",") if args.only else list(RUNS)
    results = {}
    for name in names:
        method, options = RUNS[name]
        s = make_setup(method, options, splits, args)
        if name == "depthfl-prefix":
            s = depthfl_prefix(s, args)
        results[name] = train_and_report(name, s, args)
    data = {
        "benchmark": "nefl", "args": {k: v for k, v in vars(args).items() if k != "dataset"},
        "runs": results, "directions": directions(results), "seconds": time.perf_counter() - t0,
    }
    write_results("nefl", data, markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
