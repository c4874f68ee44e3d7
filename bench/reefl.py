"""ReeFL on reduced-scale CIFAR-10: ReeFL vs DepthFL vs ExclusiveFL, with and without modulation and distillation.

Same small ViT backbone, data, paper-7 tree (7 clients, budgets = their tier's
exit), rounds and local steps for every run (``--method`` through
cis.training.run.build_setup); metric: test accuracy per exit and its mean over exits.

- ``reefl``: Ree + shared classifier, feature modulation, best-exit self-distillation;
- ``reefl -mod``, ``reefl -kd``, ``reefl -mod -kd``: the ablations;
- ``depthfl``: per-exit heads, all exits of a client's budget trained, mutual distillation;
- ``exclusivefl``: only the clients that fit the full model train (the cloud).

The paper's direction: ReeFL ahead of per-exit heads; modulation and distillation add a little.

Local SGD (``--sgd``): ``paper`` (default) is the ReeFL paper's local
training for every method (appendix A: lr 0.05, momentum 0, batch 32,
gradients clipped by value at 1; weight decay 0, as the paper names none for
FedAvg) with our cosine schedule to 0 instead of to 1e-3; ``engine`` is the
project's CIFAR setting (lr 0.1, momentum 0.9, weight decay 5e-4, batch 128,
no clipping; results/reefl-engine-sgd.md).

    python -m bench.reefl [--quick] [--sgd engine --out reefl-engine-sgd]
Writes bench/results/reefl.json and reefl.md (or --out's name).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.args import vit_args, vit_quick
from bench.harness import RESULTS, vit_head, vit_result, write_results
from bench.models import spec_file

PAPER_SGD = {"lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "batch_size": 32}
PAPER_CLIP = 1.0

CELLS = (
    ("reefl", "reefl", {}),
    ("reefl -mod", "reefl", {"modulation": False}),
    ("reefl -kd", "reefl", {"distill": False}),
    ("reefl -mod -kd", "reefl", {"modulation": False, "distill": False}),
    ("depthfl", "depthfl", {}),
    ("exclusivefl", "exclusivefl", {}),
)


def main() -> None:
    ap = vit_args(__doc__.splitlines()[0], rounds=12, exits="2,4,6")
    ap.add_argument("--only", default=None, help="comma-separated cell names to run")
    ap.add_argument(
        "--sgd",
        default="paper",
        choices=("engine", "paper"),
        help="local SGD: the project's CIFAR setting or the ReeFL paper's",
    )
    args = ap.parse_args()
    vit_quick(args)
    name = args.out or ("reefl-quick" if args.quick else "reefl")
    if args.report_only:
        out = json.loads((RESULTS / f"{name}.json").read_text())
        out["directions"] = directions(out["cells"])
        write_results(name, out, markdown(out))
        print(markdown(out))
        return
    exits = [int(e) for e in args.exits.split(",")]
    spec = spec_file(len(exits), Path(f"/tmp/cis-bench/{name}"))
    wanted = set(args.only.split(",")) if args.only else None
    start = time.perf_counter()
    cells = {}
    for label, method, opts in CELLS:
        if wanted and label not in wanted:
            continue
        # the distillation weight ramps over the first 30 % of the rounds, as the paper's 300 of 1k
        ramp = {"kd_ramp_rounds": max(1, round(0.3 * args.rounds))} if method in ("reefl", "depthfl") else {}
        clip = {"clip_value": PAPER_CLIP} if args.sgd == "paper" else {}
        cells[label] = run_cell(method, {**opts, **ramp, **clip, "vit_exits": exits, "depth": exits[-1]}, args, spec)
        print(
            f"{label}: mean exit accuracy {100 * cells[label]['mean_exit_accuracy']:.1f}% "
            f"({cells[label]['wall_seconds']:.0f} s)",
            file=sys.stderr,
        )
    keys = ("rounds", "sgd", "train_subset", "val_size", "width", "local_epochs", "exits", "seed", "threads")
    out = vit_result("reefl", args, keys, cells, start)
    out["directions"] = directions(cells)
    write_results(name, out, markdown(out))
    print(markdown(out))


def directions(cells: dict) -> dict:
    """The paper's claims as differences of mean exit accuracy (percentage points), where both runs exist."""
    acc = {k: 100 * c["mean_exit_accuracy"] for k, c in cells.items()}
    pairs = {
        "reefl_minus_depthfl_pp": ("reefl", "depthfl"),
        "reefl_minus_exclusivefl_pp": ("reefl", "exclusivefl"),
        "modulation_gain_pp": ("reefl", "reefl -mod"),
        "distillation_gain_pp": ("reefl", "reefl -kd"),
    }
    return {k: acc[a] - acc[b] for k, (a, b) in pairs.items() if a in acc and b in acc}


def markdown(out: dict) -> str:
    cells = out["cells"]
    setting = (
        "paper-7 tree, clients' budgets = their tier's exit; ViT from scratch (the paper fine-tunes a pretrained one); "
        "the distillation weight ramps over 30 % of the rounds (the paper: 300 of 1k)."
    )
    E, head = vit_head("ReeFL", out, setting)
    lines = [
        *head,
        "",
        "| run | " + " | ".join(f"exit {e} %" for e in range(1, E + 1)) + " | mean % | wall s |",
        "|---|" + "---|" * (E + 2),
    ]
    for k, c in cells.items():
        accs = " | ".join(f"{100 * c['test_exit_accuracy'][str(e)]:.1f}" for e in range(1, E + 1))
        lines.append(f"| {k} | {accs} | {100 * c['mean_exit_accuracy']:.1f} | {c['wall_seconds']:.0f} |")
    d = out.get("directions", {})
    lines += [
        "",
        "Paper's direction: ReeFL ahead of per-exit heads (DepthFL, ExclusiveFL); modulation and distillation add a "
        "little.",
        "",
    ]
    checks = {
        "reefl_minus_depthfl_pp": "ReeFL ahead of DepthFL", "reefl_minus_exclusivefl_pp": "ReeFL ahead of ExclusiveFL",
        "modulation_gain_pp": "modulation adds", "distillation_gain_pp": "distillation adds",
    }
    for k, what in checks.items():
        if k in d:
            verdict = (
                "within one seed's noise (under 1 point)"
                if abs(d[k]) < 1
                else ("holds" if d[k] > 0 else "does NOT hold")
            )
            lines.append(f"- {what}: {verdict} ({d[k]:+.1f} points)")
    return "\n".join(lines) + "\n"


def run_cell(method: str, options: dict, args, spec: Path) -> dict:
    import torch

    from cis.training.config import make_config
    from cis.training.evaluate import predict_exits
    from cis.training.run import build_setup

    config = make_config(overrides=dict(
        method=method, options=options, dataset=f"cifar10:{args.data}", spec=str(spec), rounds=args.rounds,
        width=args.width, seed=args.seed, train_subset=args.train_subset, val_size=args.val_size,
        local_epochs=args.local_epochs, threads=args.threads, eval_every=args.rounds,
        **(PAPER_SGD if args.sgd == "paper" else {}),
    ))
    s = build_setup(config)
    t0 = time.perf_counter()
    for _ in range(config.rounds):
        s.engine.run_round()
    wall = time.perf_counter() - t0
    torch.set_num_threads(args.threads)
    test = predict_exits(s.engine.sync_model(), s.splits.test.x)
    y = s.splits.test.y
    acc = {str(e): float((test[e].argmax(-1) == y).mean()) for e in sorted(test)}
    return {
        "method": method, "options": options, "test_exit_accuracy": acc,
        "mean_exit_accuracy": float(np.mean(list(acc.values()))), "wall_seconds": wall,
    }


if __name__ == "__main__":
    main()
