"""Wall time of the same training on the built-in engine and on Flower (simulation, deployment on loopback).

The same config (digits, paper-7, seed 0) runs three ways, one after the other:
built-in engine (cis/training/run.py train_run), Flower's simulation engine
(run_flower mode "simulation": ray, one virtual SuperNode per node) and Flower's
deployment engine on loopback (a SuperLink and 7 SuperNodes as subprocesses,
the run submitted with ``flwr run``). The three produce the same weights (the
script checks the CIS accuracies agree), so the difference is engine overhead.

Where the time goes, from each run's own timers:
    startup      everything before round 1: ray / the SuperLink and SuperNodes start,
                 the ServerApp builds its Setup, the query that maps Flower nodes to CIS nodes
                 (the nodes load their data)
    rounds       the sum of train_seconds over rounds (send, local training, replies, aggregation);
                 per round also the local compute alone (built-in engine's train_seconds)
    server       configure_train + aggregate_train (the strategy's own work)
    eval/ckpt    the validation pass and the checkpoint after each round (same code everywhere)

    python -m bench.flower_overhead [--rounds 3] [--skip-deployment]
Writes bench/results/flower_overhead.json. Timings on a shared 2-core box are noisy; the
ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import RESULTS, machine
from cis.training.config import make_config
from cis.training.run import train_run

OUT = RESULTS / "flower_overhead.json"


def rounds_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def breakdown(out: Path, wall: float, summary: dict) -> dict:
    lines = rounds_of(out)
    train = sum(ln["train_seconds"] for ln in lines)
    ev = sum(ln.get("eval_seconds", 0.0) for ln in lines)
    d = {
        "wall_seconds": wall,
        "rounds_train_seconds": train,
        "per_round_train_seconds": train / len(lines),
        "eval_seconds": ev,
        "cis_accuracy": summary["cis_accuracy"],
        "final_exit_accuracy": summary["final_exit_accuracy"],
    }
    ft = summary.get("flower_timing")
    if ft:
        d["flower_timing"] = ft
        d["startup_seconds"] = wall - ft["rounds_seconds"] + ft["discover_seconds"]
        d["server_strategy_seconds"] = ft["configure_seconds"] + ft["aggregate_seconds"]
    else:
        d["startup_seconds"] = wall - train - ev
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-deployment", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from cis.training.flower.launch import run_flower

    config = make_config(overrides={"rounds": args.rounds, "seed": 0})
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="flower-overhead-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        s = train_run(config, tmp / "builtin", progress=False, log=lambda s: None)
        results["builtin"] = breakdown(tmp / "builtin", time.perf_counter() - t0, s)
        print(f"built-in: {results['builtin']['wall_seconds']:.1f} s", file=sys.stderr)

        t0 = time.perf_counter()
        s = run_flower(config, tmp / "sim", "simulation", num_cpus=os.cpu_count(), log=lambda s: None)
        results["flower_simulation"] = breakdown(tmp / "sim", time.perf_counter() - t0, s)
        print(f"flower simulation: {results['flower_simulation']['wall_seconds']:.1f} s", file=sys.stderr)

        if not args.skip_deployment:
            t0 = time.perf_counter()
            s = run_flower(config, tmp / "dep", "deployment", round_timeout=600, log=lambda s: None)
            results["flower_deployment"] = breakdown(tmp / "dep", time.perf_counter() - t0, s)
            print(f"flower deployment: {results['flower_deployment']['wall_seconds']:.1f} s", file=sys.stderr)

    base = results["builtin"]
    for k in ("flower_simulation", "flower_deployment"):
        if k in results:
            r = results[k]
            r["wall_ratio"] = r["wall_seconds"] / base["wall_seconds"]
            r["per_round_ratio"] = r["per_round_train_seconds"] / base["per_round_train_seconds"]
            r["same_accuracy"] = r["cis_accuracy"] == base["cis_accuracy"]
    import flwr

    report = {
        "config": {"dataset": "digits", "spec": "paper-7", "rounds": args.rounds, "seed": 0, "threads": 1},
        "flwr": flwr.__version__ if hasattr(flwr, "__version__") else "",
        "machine": machine(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for k, r in results.items():
        extra = f"  x{r['wall_ratio']:.1f} wall, x{r['per_round_ratio']:.1f} per round" if "wall_ratio" in r else ""
        print(f"{k:18s} wall {r['wall_seconds']:6.1f} s  startup {r['startup_seconds']:5.1f} s  "
              f"rounds {r['rounds_train_seconds']:6.1f} s  CIS acc {100 * r['cis_accuracy']:.1f} %{extra}")


if __name__ == "__main__":
    main()
