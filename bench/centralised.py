"""Centralised vs federated training at the same SGD steps, on one cell (issue 32, item 5).

One cell: a data set (digits by default, or a CIFAR-10 subset with ``--data cifar10:PATH``), the paper-7
tree under one serving setting, one strategy. Per seed, two runs of the same config:

    federated     Algorithm 1 over the spec's nodes (IID, equal shares): rounds x J local steps per node
    centralised   ``--centralised``: one model on the pooled training data, the exit losses weighted by the
                  same Lambda~; as many rounds, each of J_c = round(total federated steps / rounds) steps,
                  so both runs take the same number of SGD steps in all (the federated total over nodes)

and reports the test accuracy per exit, the CIS accuracy (quota thresholds at the spec's serving shares),
the SGD steps each run took and its wall time, per seed and as mean ± sd with the paired difference.

    python -m bench.centralised                 # digits, 30 rounds, seeds 1-3
    python -m bench.centralised --quick         # smoke: 2 rounds, 1 seed (writes centralised-quick.*)
    python -m bench.centralised --data cifar10:/tmp/cifar10 --train-subset 7000 --width 0.25 --rounds 20

Writes bench/results/centralised.{json,md} (``--quick``: centralised-quick.{json,md}). The runs go to
/tmp/cis-bench/centralised (``--runs``); a finished run is read back, not retrained.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.harness import machine, write_results
from cis.training.config import make_config
from cis.training.run import train_run

MODES = ("federated", "centralised")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke setting: 2 rounds, seed 1 (not a result)")
    ap.add_argument("--data", default="digits", help="data reference (default digits; cifar10:PATH for CIFAR-10)")
    ap.add_argument("--serving", default="33-33-33", help="serving shares of the paper-7 cell (default 33-33-33)")
    ap.add_argument("--strategy", default="serving-rate")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--train-subset", type=int, default=None, help="a seeded subset of the training split")
    ap.add_argument("--val-size", type=int, default=None)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=Path, default=Path("/tmp/cis-bench/centralised"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seeds = 2, "1"
    return args


def cell_config(args: argparse.Namespace, seed: int, **extra) -> dict:
    return {
        "dataset": args.data, "serving": args.serving, "strategy": args.strategy, "rounds": args.rounds,
        "width": args.width, "train_subset": args.train_subset, "val_size": args.val_size, "seed": seed,
        "threads": args.threads, **extra,
    }


def run(values: dict, out: Path) -> dict:
    """One run's result (trained unless its summary is there): accuracies, SGD steps, seconds."""
    summary_file = out / "summary.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        seconds = json.loads((out / "bench.json").read_text())["seconds"]
    else:
        start = time.perf_counter()
        summary = train_run(make_config(values), out, progress=False)
        seconds = time.perf_counter() - start
        (out / "bench.json").write_text(json.dumps({"seconds": seconds}))
    return {
        "exit_accuracy": summary["test"]["exit_accuracy"],
        "final_exit_accuracy": summary["final_exit_accuracy"],
        "cis_accuracy": summary["cis_accuracy"],
        "sgd_steps": summary["sgd_steps"]["total"],
        "seconds": seconds,
    }


def seed_pair(args: argparse.Namespace, seed: int) -> dict:
    """The federated run, then the centralised run with as many SGD steps in all."""
    tag = f"{args.data.replace('/', '_').replace(':', '_')}-{args.serving}-{args.strategy}-r{args.rounds}-w{args.width}"
    base = args.runs / tag / f"seed{seed}"
    fed = run(cell_config(args, seed), base / "federated")
    steps = max(1, round(fed["sgd_steps"] / args.rounds))
    central = run(cell_config(args, seed, centralised=True, local_steps=steps), base / f"centralised-J{steps}")
    return {"seed": seed, "federated": fed, "centralised": central}


def summarise(pairs: list[dict]) -> dict:
    """Mean ± sd per mode and metric, and the paired centralised - federated difference."""
    out: dict = {}
    exits = sorted(pairs[0]["federated"]["exit_accuracy"], key=int)
    metrics = [f"exit_{e}" for e in exits] + ["cis_accuracy"]

    def value(r: dict, m: str) -> float:
        return float(r["exit_accuracy"][m[5:]] if m.startswith("exit_") else r[m])

    for m in metrics:
        per = {mode: np.array([value(p[mode], m) for p in pairs]) for mode in MODES}
        diff = per["centralised"] - per["federated"]
        out[m] = {
            **{mode: {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0}
               for mode, v in per.items()},
            "difference": {"mean": float(diff.mean()), "sd": float(diff.std(ddof=1)) if len(diff) > 1 else 0.0},
        }
    return out


def markdown(result: dict) -> list[str]:
    s, a = result["summary"], result["scale"]
    smoke = "QUICK SMOKE RUN, not a result. " if result["quick"] else ""
    lines = [
        "# Centralised vs federated training at the same SGD steps",
        "",
        f"{smoke}Cell: {a['data']}, paper-7 at {a['serving']}, strategy {a['strategy']}, {a['rounds']} rounds, "
        f"width {a['width']}, train subset {a['train_subset']}, seeds {a['seeds']}. The centralised run takes "
        "as many SGD steps in all as the federated run's nodes together (test accuracy, %).",
        "",
        "| metric | federated | centralised | centralised - federated |",
        "|---|---|---|---|",
    ]
    for m, v in s.items():
        cells = [f"{100 * v[k]['mean']:.2f} ± {100 * v[k]['sd']:.2f}" for k in (*MODES, "difference")]
        lines.append(f"| {m.replace('_', ' ')} | " + " | ".join(cells) + " |")
    lines += ["", "| seed | mode | SGD steps | seconds | final exit | CIS |", "|---|---|---|---|---|---|"]
    for p in result["pairs"]:
        for mode in MODES:
            r = p[mode]
            lines.append(
                f"| {p['seed']} | {mode} | {r['sgd_steps']} | {r['seconds']:.1f} | "
                f"{100 * r['final_exit_accuracy']:.2f} | {100 * r['cis_accuracy']:.2f} |"
            )
    m = result["machine"]
    lines += ["", f"Machine: {m['cpus']} CPUs, load average {m['load_avg'][0]:.2f} at the end; "
              f"{a['threads']} torch thread(s) per run; total {result['seconds'] / 60:.1f} min."]
    return lines


def main() -> None:
    args = parse()
    start = time.perf_counter()
    pairs = [seed_pair(args, int(s)) for s in args.seeds.split(",") if s.strip()]
    keys = ("data", "serving", "strategy", "rounds", "width", "train_subset", "val_size", "seeds", "threads")
    result = {
        "benchmark": "centralised",
        "quick": args.quick,
        "scale": {k: getattr(args, k) for k in keys},
        "pairs": pairs,
        "summary": summarise(pairs),
        "machine": machine(),
        "seconds": time.perf_counter() - start,
    }
    write_results("centralised-quick" if args.quick else "centralised", result, markdown(result))


if __name__ == "__main__":
    main()
