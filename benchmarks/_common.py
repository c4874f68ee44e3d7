"""What the benchmarks share: paths, the CIFAR-10 unzip, common flags, machine facts, result files, and
the training helpers of the paper tables and of the ViT / nested-method benchmarks.

A benchmark runs as a script (``python benchmarks/NAME.py``): Python puts benchmarks/ first on
``sys.path``, so ``from _common import ...`` finds this module, and the project comes from its
installed package (``pip install -e .``), not from ``sys.path`` edits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
CIFAR_ZIP = next(
    (
        p
        for p in (REPO.parent / "shared" / "data" / "cifar10-jpeg.zip", Path("/work/shared/data/cifar10-jpeg.zip"))
        if p.is_file()
    ),
    REPO.parent / "shared" / "data" / "cifar10-jpeg.zip",
)


def ensure_cifar(path: Path) -> Path:
    """CIFAR-10 at ``path`` (an image folder, unzipped from ../shared/data/cifar10-jpeg.zip when missing, or the
    python-pickle layout ``path``/cifar-10-batches-py)."""
    if not (path / "train").is_dir() and not (path / "cifar-10-batches-py").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["unzip", "-q", "-o", str(CIFAR_ZIP), "-d", str(path)], check=True)
    return path


def machine() -> dict[str, Any]:
    """Where the numbers were measured (say the load: the development machine is shared)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def write_results(name: str, data: dict, markdown: str | list[str] | None = None) -> None:
    """``RESULTS/name.json`` and, given a table, ``RESULTS/name.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    if markdown is not None:
        text = markdown if isinstance(markdown, str) else "\n".join(markdown) + "\n"
        (RESULTS / f"{name}.md").write_text(text)
    print(f"wrote {RESULTS / name}.json" + (" and .md" if markdown is not None else ""), file=sys.stderr)


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


# ---------------------------------------------------------------- the paper tables (table1.py, table2.py)


def train(out: Path, dataset: str, strategy: str, serving: str, args, **extra) -> dict:
    from training.config import make_config
    from training.run import train_run

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
    come from a generator seeded by (seed, t) (training/engine.py), so the replay is exact; an auto
    run adds the losers' pilots, ``auto_candidates - 1`` replays of its first ``pilot_rounds`` rounds.
    """
    from training.engine import derived_generator
    from training.local import exit_steps
    from training.run import build_setup

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
    from cis.spec import parse_spec
    from cis.topologies import apply_serving, parse_serving
    from training.run import evaluate_run

    meta = json.loads((run / "checkpoint.json").read_text())
    spec = apply_serving(parse_spec(meta["spec"]), parse_serving(serving, 3))
    got = evaluate_run(run, spec)
    return 100 * got["cis_accuracy"], 100 * got["val_cis_accuracy"]


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


def claim(path: Path) -> bool:
    """Take the run whose result file is ``path`` for this process (``path``.lock holds the owner's pid).

    Several campaign processes (one per core) can then share one campaign; a lock
    left by a process that died is taken over.
    """
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(lock.read_text() or 0), 0)
            return False  # its owner is alive
        except (ProcessLookupError, ValueError):
            lock.write_text(str(os.getpid()))
            return True
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def save_run(path: Path, record: dict, commit: bool) -> None:
    """One finished run's numbers, written at once (and committed with --commit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    path.with_suffix(".lock").unlink(missing_ok=True)
    if commit:
        subprocess.run(["git", "-C", str(REPO), "add", str(path)], check=False)
        subprocess.run(
            ["git", "-C", str(REPO), "commit", "-q", "-m", f"{path.parent.parent.name}: {path.stem}", "--", str(path)],
            check=False,
        )


def stats(values: list[float]) -> dict:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0, "n": len(a)}


def paired(values: list[float], base: list[float]) -> dict:
    """The per-seed difference against a baseline: mean, sd, the sign per seed and the paired t-test's p."""
    d = np.asarray(values, dtype=float) - np.asarray(base, dtype=float)
    return {
        **stats(d.tolist()),
        "per_seed": [round(float(x), 2) for x in d],
        "signs": "".join("+" if x > 0 else "-" if x < 0 else "0" for x in d),
        "t_test_p": paired_t_p(d),
    }


def paired_t_p(d: np.ndarray) -> float | None:
    """Two-sided p of the paired t-test on the differences ``d`` (None below 2 pairs; 1.0 when all are 0)."""
    if len(d) < 2:
        return None
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        return 1.0 if float(np.mean(d)) == 0.0 else 0.0
    from scipy.stats import t as student_t

    t = float(np.mean(d)) / (sd / np.sqrt(len(d)))
    return float(2 * student_t.sf(abs(t), len(d) - 1))


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-Bonferroni adjusted p-values over one family of comparisons (None stays None)."""
    named = sorted(((p, k) for k, p in pvalues.items() if p is not None))
    m, out, running = len(named), dict.fromkeys(pvalues), 0.0
    for rank, (p, k) in enumerate(named):
        running = max(running, min(1.0, (m - rank) * p))
        out[k] = running
    return out


def add_holm(comparisons: dict[str, dict]) -> None:
    """Write ``holm_p`` into every comparison of a table (one family), from its ``t_test_p``."""
    adjusted = holm({k: c.get("t_test_p") for k, c in comparisons.items()})
    for k, c in comparisons.items():
        c["holm_p"] = adjusted[k]


def fmt_test(c: dict) -> str:
    """'+2.0 ± 0.9 (+++++) p 0.01 / Holm 0.05' for a markdown table."""
    p = "–" if c.get("t_test_p") is None else f"{c['t_test_p']:.3f}"
    h = "–" if c.get("holm_p") is None else f"{c['holm_p']:.3f}"
    return f"{c['mean']:+.1f} ± {c['sd']:.1f} ({c['signs']}) p {p} / Holm {h}"


# ---------------------------------------------------------------- the ViT benchmarks (flame.py, reefl.py)


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


def vit_result(
    benchmark: str, args: argparse.Namespace, scale_keys: tuple[str, ...], cells: dict, start: float
) -> dict:
    """The result object of flame.py / reefl.py: its scale (the named args), its cells, its seconds."""
    return {
        "benchmark": benchmark,
        "quick": args.quick,
        "scale": {k: getattr(args, k) for k in scale_keys},
        "cells": cells,
        "seconds": time.perf_counter() - start,
    }


def vit_head(name: str, out: dict, setting: str) -> tuple[int, list[str]]:
    """(number of exits, the markdown's title and scale line) of a flame.py / reefl.py result ``out``."""
    exits = len(str(out["scale"]["exits"]).split(","))
    smoke = " (quick smoke run)" if out["quick"] else ""
    scale = f"Scale: {out['scale']}; {setting} Total {out['seconds'] / 60:.1f} min."
    return exits, [f"# {name} benchmark{smoke}", "", scale]


def vit_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds, args.train_subset, args.val_size, args.width, args.local_epochs = 1, 700, 300, 0.5, 0.25


def spec_file(num_exits: int, folder: Path) -> Path:
    """The paper-7 tree (4 devices, 2 edges, a cloud: 7 clients) with its three tiers at exits
    E/3, 2E/3, E of a model with ``num_exits`` = E exits (E a multiple of 3)."""
    from cis.spec import parse_spec, spec_to_dict, write_spec
    from cis.topologies import make_spec

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


# ---------------------------------------------------------------- the nested-method benchmarks (nefl.py, slt.py)


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


def nested_head(title: str, a: dict, what: str) -> list[str]:
    """The markdown's title and the sentence on the scale of a nested-method run (``a``: its args)."""
    scale = (
        f"{'QUICK SMOKE RUN, not a result. ' if a['quick'] else ''}Reduced scale: ResNet20 at width {a['width']}, "
        f"{a['train_subset']} training images, {a['rounds']} rounds x {a['local_steps']} local steps of "
        f"{a['batch_size']}, test on {a['test']} images, seed {a['seed']}; papers' weighting (--strategy equal)."
    )
    return [f"# {title}", "", f"{scale} {what}", ""]


def load_splits(dataset: str, seed: int, val: int, test: int):
    """The dataset with seeded subsets of its validation and test splits (the training subset is the config's)."""
    from training.data import DataSplits, load_dataset

    splits = load_dataset(dataset, seed=seed, val_size=val)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.permutation(len(splits.test))[:test])
    return DataSplits(splits.train, splits.val, splits.test.subset(keep))


def make_setup(method: str, options: dict, splits, args: argparse.Namespace, **extra: Any):
    """``training.run.build_setup`` of a nested method at the benchmark's scale (the papers' |S_i| weighting)."""
    from training.config import make_config
    from training.run import build_setup

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
