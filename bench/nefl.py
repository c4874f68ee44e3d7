"""NeFL vs the nested baselines on reduced-scale CIFAR-10 (ResNet20, paper-7, 3 sub-models).

Runs, all through ``build_setup`` (the engine of ``cis train --method``), with the
papers' weighting (``--strategy equal``: every client weighs |S_i|):

- ``nefl-WD`` / ``nefl-W`` / ``nefl-D``: NeFL with width and depth, width only, depth only;
- ``heterofl``, ``fjord``: the width baselines (shared / per-sub-model BN, ordered dropout); HeteroFL
  with its static BatchNorm (the default, as the NeFL paper runs it: no running statistics while
  training, each sub-model's recomputed over the training data afterwards), and
  ``heterofl-tracked-bn`` with option ``static_bn=false`` (shared running statistics tracked while
  training: the HeteroFL row of the results before static BN);
- ``depthfl-prefix``: DepthFL as NeFL implements it (Appendix B.3): sub-model k is a
  contiguous prefix of the blocks (plus the downsampling blocks), unit steps, not learned.

Every run reports the test accuracy of sub-models 1..3 (a CIS tier serves its
sub-model) and the CIS accuracy at 33-33-33. The papers' directions: NeFL-D's
smallest sub-model well above the DepthFL-style prefix; HeteroFL's smallest
sub-model the worst among the width methods (NeFL-W, HeteroFL, FjORD); HeteroFL's
largest sub-model above its smaller ones (its accuracy grows with size in NeFL's tables).

Reduced scale (say so with any number): ResNet20 at half width (channels 8/16/32), 10k training images,
16 rounds of 6 local steps of 64, test on 2,000 and validation on 1,000 images, one seed. The six runs
before ``heterofl-tracked-bn`` took about 17 minutes together on this 2-core CPU at a load of 3 (each row
takes 2-3 minutes), roughly twice that when the machine is busy (load 10); ``--quick`` is a smoke test.

    python -m bench.nefl [--quick] [--rounds 16] [--train-subset 10000] [--only heterofl,... [--merge]]
Writes bench/results/nefl.json and nefl.md. ``--merge`` (with ``--only``) keeps the other rows of
the saved results, which must have the same scale, and replaces the rows it reruns. CIFAR-10 comes from
../shared/data/cifar10-jpeg.zip, unzipped to /tmp/cifar10.
"""

from __future__ import annotations

import json
import sys
import time

from bench.args import nested_args
from bench.harness import RESULTS, machine, nested_head, write_results
from bench.models import load_splits, make_setup, train_and_report

RUNS = {  # name -> (method, options)
    "nefl-WD": ("nefl", {"nefl_mode": "WD"}),
    "nefl-W": ("nefl", {"nefl_mode": "W"}),
    "nefl-D": ("nefl", {"nefl_mode": "D"}),
    "heterofl": ("heterofl", {}),
    "heterofl-tracked-bn": ("heterofl", {"static_bn": False}),
    "fjord": ("fjord", {}),
    "depthfl-prefix": ("heterofl", {}),  # its model is swapped for the prefix sub-models below
}
WIDTH_METHODS = ("nefl-W", "heterofl", "fjord")
SCALE = ("quick", "rounds", "local_steps", "batch_size", "train_subset", "val", "test", "seed", "width")
"""The flags that make two runs' numbers comparable (``--merge`` refuses saved results at another scale)."""


def depthfl_prefix(s, args):
    """Swap a heterofl setup's model for DepthFL-style prefix sub-models (decoupled BN, fixed unit steps)."""
    import torch

    from cis.training.families.nested import build_subset_method, default_gammas
    from cis.training.federated import FederatedEngine
    from cis.training.methods.nested import NestedNet, depthfl_specs

    torch.manual_seed(s.config.seed)
    layout = s.model.layout
    model = NestedNet(
        layout, depthfl_specs(layout, default_gammas(s.model.num_exits)), decoupled_bn=True, use_steps=False
    )
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
    if "heterofl" in r:  # larger sub-models more accurate, as in the NeFL paper's HeteroFL rows
        acc = r["heterofl"]["submodel_accuracy"]
        largest = max(acc, key=int)
        gap = acc[largest] - max(v for k, v in acc.items() if k != largest)
        out["heterofl_largest_above_smaller"] = {"gap_pp": 100 * gap, "holds": gap > 0}
    return out


def merge_saved(data: dict, names: list[str]) -> dict:
    """``data`` (the rerun rows) merged into the saved results/nefl.json; the saved run's order and scale."""
    saved = json.loads((RESULTS / "nefl.json").read_text())
    differ = {k: (saved["args"].get(k), data["args"][k]) for k in SCALE if saved["args"].get(k) != data["args"][k]}
    if differ:
        raise SystemExit(f"--merge: results/nefl.json has another scale (saved, now): {differ}; rerun every row")
    runs = {**saved["runs"], **data["runs"]}
    runs = {n: runs[n] for n in [*RUNS, *runs] if n in runs}
    merges = [*saved.get("merges", []), {"rerun": names, "seconds": data["seconds"], "machine": machine()}]
    return {
        **saved, "runs": runs, "directions": directions(runs), "merges": merges,
        "seconds": sum(r["total_seconds"] for r in runs.values()),
    }


def markdown(data: dict) -> list[str]:
    lines = [
        *nested_head("NeFL vs nested baselines (reduced-scale CIFAR-10, ResNet20 x width, paper-7, 3 sub-models)",
                     data["args"], "Test accuracy (%) per sub-model; CIS accuracy at 33-33-33."),
        "| run | sub-model 1 | sub-model 2 | sub-model 3 | mean | CIS | params (1/2/3) | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["runs"].items():
        acc = r["submodel_accuracy"]
        lines.append(
            f"| {name} | " + " | ".join(f"{100 * acc[k]:.1f}" for k in sorted(acc)) + f" | {100 * r['mean']:.1f} | "
            f"{100 * r['cis_accuracy']:.1f} | {'/'.join(f'{p / 1000:.0f}k' for p in r['params'])} "
            f"| {r['total_seconds']:.0f} |"
        )
    lines += ["", "Directions from the papers:", ""]
    for k, v in data["directions"].items():
        detail = ", ".join(
            f"{a}={b:+.1f}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items() if a != "holds"
        )
        lines.append(f"- {k}: {'holds' if v['holds'] else 'does NOT hold'} ({detail})")
    lines.append(
        "\nheterofl: static BatchNorm (no running statistics while training; each sub-model's own, a cumulative "
        "average over the training data after training); heterofl-tracked-bn: option static_bn=false (shared "
        "running statistics tracked and averaged while training)."
    )
    for m in data.get("merges", []):
        lines.append(
            f"\nRerun with --merge: {', '.join(m['rerun'])} ({m['seconds']:.0f} s, load average "
            f"{m['machine']['load_avg'][0]:.1f}); the other rows are from the earlier run of the same scale."
        )
    lines.append(f"\nTotal {data['seconds']:.0f} s (the rows' own seconds).")
    return lines


def main(argv=None) -> int:
    args = nested_args(__doc__.split("\n")[0], argv, extra=lambda p: p.add_argument(
        "--merge", action="store_true", help="with --only: keep the saved results' other rows (same scale)"))
    if args.merge and not args.only:
        raise SystemExit("--merge: give --only with the rows to rerun")
    from cis.training.data.loading import load_dataset  # noqa: F401  (fail early on a missing dataset)

    t0 = time.perf_counter()
    splits = load_splits(args.dataset, args.seed, args.val, args.test)
    names = args.only.split(",") if args.only else list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"--only: unknown run(s) {unknown}; expected names from {list(RUNS)}")
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
    if args.merge:
        data = merge_saved(data, names)
    write_results("nefl", data, markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
