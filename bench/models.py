"""The training helpers of the benchmarks: a paper-table run (train, evaluate, replayed SGD steps), the paper-7
spec of a ViT's exits, and a nested method's splits, setup and report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def train(out: Path, dataset: str, strategy: str, serving: str, args, **extra) -> dict:
    from cis.training.config import make_config
    from cis.training.run import train_run

    if (out / "summary.json").is_file():  # finished earlier: reuse
        return json.loads((out / "summary.json").read_text())
    overrides = dict(
        dataset=dataset,
        strategy=strategy,
        serving=serving,
        rounds=args.rounds,
        width=args.width,
        seed=args.seed,
        train_subset=args.train_subset,
        val_size=args.val_size,
        eval_every=args.eval_every or args.rounds,
        threads=args.threads,
        local_epochs=args.local_epochs,
        **extra,
    )
    config = make_config(overrides=overrides)
    resume = (out / "checkpoint.pt").is_file()
    t = time.perf_counter()
    summary = train_run(config, out, resume=resume, progress=True)
    summary["train_wall_seconds"] = time.perf_counter() - t
    return summary


def replayed_sgd_steps(config, auto_candidates: int = 1, pilot_rounds: int = 0) -> dict:
    """A run's SGD steps without training it: build its setup and replay its seeded exit draws.

    For the run files written before runs recorded their steps (issue 22). The draws of round t
    come from a generator seeded by (seed, t) (cis/training/federated.py), so the replay is exact; an auto
    run adds the losers' pilots, ``auto_candidates - 1`` replays of its first ``pilot_rounds`` rounds.
    """
    from cis.training.federated import derived_generator
    from cis.training.local import exit_steps
    from cis.training.run import build_setup

    s = build_setup(config)
    flops = getattr(s.engine.trainer, "exit_flops", None)
    per_round = []
    for t in range(1, config.rounds + 1):
        row = [0] * len(s.clients)
        for i, e in s.engine.chooser.choose(t, derived_generator(config.seed, t)):
            row[i] += exit_steps(s.steps, flops, s.clients[i].max_exit, e)
        per_round.append(row)
    per_node = {c.id: sum(r[k] for r in per_round) for k, c in enumerate(s.clients)}
    discarded = (auto_candidates - 1) * sum(sum(r) for r in per_round[:pilot_rounds])
    root = next(n.id for n in s.spec.nodes if n.parent is None)
    return {
        "total": sum(per_node.values()) + discarded,
        "root": per_node[root],
        "per_node": per_node,
        "discarded_pilots": discarded,
        "source": "replayed from the run's config (issue 22): the run predates recorded steps",
    }


def evaluate(run: Path, serving: str) -> tuple[float, float]:
    """(test, validation) CIS accuracy (%) of a finished run under another serving setting."""
    from cis.core.spec import parse_spec
    from cis.core.topologies import apply_serving, parse_serving
    from cis.training.run import evaluate_run

    meta = json.loads((run / "checkpoint.json").read_text())
    spec = apply_serving(parse_spec(meta["spec"]), parse_serving(serving, 3))
    got = evaluate_run(run, spec)
    return 100 * got["cis_accuracy"], 100 * got["val_cis_accuracy"]


def spec_file(num_exits: int, folder: Path) -> Path:
    """The paper-7 tree (4 devices, 2 edges, a cloud: 7 clients) with its three tiers at exits
    E/3, 2E/3, E of a model with ``num_exits`` = E exits (E a multiple of 3)."""
    from cis.core.spec import parse_spec, spec_to_dict, write_spec
    from cis.core.topologies import make_spec

    if num_exits % 3:
        raise SystemExit(f"--exits: {num_exits} exits; expected a multiple of 3 (the paper-7 tree has three tiers)")
    d = spec_to_dict(make_spec("paper-7", "33-33-34", num_classes=10))
    d["cis"]["exits"] = num_exits
    for node in d["nodes"]:
        node["exit"] = node["exit"] * num_exits // 3
    spec = parse_spec(d, "<benchmark spec>")
    path = folder / f"spec-{num_exits}.toml"
    folder.mkdir(parents=True, exist_ok=True)
    write_spec(spec, path)
    return path


def load_splits(dataset: str, seed: int, val: int, test: int):
    """The dataset with seeded subsets of its validation and test splits (the training subset is the config's)."""
    from cis.training.data.loading import DataSplits, load_dataset

    splits = load_dataset(dataset, seed=seed, val_size=val)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.permutation(len(splits.test))[:test])
    return DataSplits(splits.train, splits.val, splits.test.subset(keep))


def make_setup(method: str, options: dict, splits, args: argparse.Namespace, **extra: Any):
    """``cis.training.run.build_setup`` of a nested method at the benchmark's scale (the papers' |S_i| weighting)."""
    from cis.training.config import make_config
    from cis.training.run import build_setup

    config = make_config(
        overrides=dict(
            dataset=args.dataset,
            method=method,
            options=options,
            strategy="equal",
            rounds=args.rounds,
            seed=args.seed,
            train_subset=args.train_subset,
            local_steps=args.local_steps,
            batch_size=args.batch_size,
            threads=args.threads,
            width=args.width,
            **extra,
        )
    )
    return build_setup(config, splits=splits)


def train_and_report(name: str, s, args: argparse.Namespace) -> dict:
    """Run all rounds of a setup; test accuracy per sub-model, CIS accuracy, seconds."""
    from cis.training.run import final_report

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
        "method": s.config.method,
        "options": s.config.options,
        "submodel_accuracy": acc,
        "smallest": acc[1],
        "largest": acc[max(acc)],
        "mean": float(np.mean(list(acc.values()))),
        "cis_accuracy": float(report["cis_accuracy"]),
        "train_seconds": train_s,
        "total_seconds": time.perf_counter() - t0,
        "params": [
            int(sum(v.numel() for v in s.model.submodel(k).state_dict().values() if v.is_floating_point()))
            for k in range(1, s.model.num_exits + 1)
        ],
    }
    print(
        f"{name:15s} sub-models "
        + " ".join(f"{100 * v:5.1f}" for v in acc.values())
        + f"  CIS {100 * out['cis_accuracy']:5.1f}  ({out['total_seconds']:.0f} s)",
        file=sys.stderr,
    )
    return out
