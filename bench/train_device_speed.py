"""Training throughput of the Table 1 model on a device: images per second of federated local training.

The Table 1 setting of bench/table1.py (ResNet18EE at width 0.125, paper-7, CIFAR-10 with 7000
training images, equal partition, serving-rate weights at 80-15-5, local_epochs 0.25, batch 128): the
engine runs ``--rounds`` rounds and each round's images (the sum over its (node, exit) pairs of
steps x batch) are divided by its train seconds. Round 1 pays the warm-up (cuDNN autotuning, first
allocations, CUDA graph captures) and is left out; the result is the median over the other rounds,
evaluation excluded.

``--paper-scale`` is the paper's run instead: width 1, 5,000 validation images and every other training
image (35,000 of the 40,000 this project's CIFAR-10 copy has; the paper's 45,000 are not there), 118 local
steps a round (the paper's root steps, ``--local-steps`` to probe with fewer). ``--variants`` measures
several ways of computing the same run in one process, the data loaded once: ``+``-joined of
``channels_last`` (``memory_format``), ``bf16`` (``amp``), ``graphs`` (``cuda_graphs``), or ``fp32`` for
none; the result names the fastest (a bf16 variant only where it beats the fastest float32 one by
``BF16_MARGIN``, since it changes the numbers more than the others do). ``--combine A,B`` sums the
throughput of result files measured at once by processes sharing one GPU.

    python -m bench.train_device_speed --device cpu                 # this machine's CPU
    python -m bench.train_device_speed --device cuda [--amp bf16]   # a GPU (the same numbers, another name)
    python -m bench.train_device_speed --width 0.25 --train-subset 20000   # the larger-scale cell's model
    python -m bench.train_device_speed --device cuda --paper-scale --local-steps 16 --rounds 4 \\
        --variants fp32,channels_last,bf16,graphs,graphs+channels_last --out paper_speed
    python -m bench.train_device_speed --combine paper_speed_2x_1,paper_speed_2x_2 --out paper_speed_2x
    python -m bench.train_device_speed --report-paper FILE [--runs DIR]   # scripts/gpu_paper_scale.sh's
        paper_speed.json (and the partial runs' metrics.jsonl under DIR) -> bench/results/paper_speed.{json,md}

Writes bench/results/train_device_speed_<device>[_<amp>].json (``--out`` for another name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.harness import RESULTS, ensure_cifar, machine, write_results

OPTIONS = {  # a variant's name -> the run setting it turns on
    "channels_last": ("memory_format", "channels_last"),
    "bf16": ("amp", "bf16"),
    "graphs": ("cuda_graphs", "on"),
}
BF16_MARGIN = 1.25  # a bf16 variant is chosen only when this much faster than the fastest float32 one
PAPER = {"width": 1.0, "val_size": 5000, "train_subset": None, "local_steps": 118}


def variant_settings(name: str) -> dict[str, str]:
    """The config settings of a variant name such as ``graphs+channels_last`` (``fp32``: none)."""
    parts = [p for p in name.split("+") if p and p != "fp32"]
    if unknown := [p for p in parts if p not in OPTIONS]:
        raise SystemExit(f"--variants: {unknown[0]!r} in {name!r}; expected fp32 or +-joined {', '.join(OPTIONS)}")
    return dict(OPTIONS[p] for p in parts)


def run_config(args, settings: dict[str, str]):
    from cis.training.config import make_config

    return make_config(
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
            local_steps=args.local_steps,
            device=args.device,
            **{"amp": args.amp, **settings},
        )
    )


def measure(args, settings: dict[str, str] | None = None, splits=None) -> dict:
    """Train ``args.rounds`` rounds of the run with ``settings``; images/s per round, the median of rounds 2...
    ``splits``: the data already loaded (one load for several variants)."""
    import torch

    from cis.training.run import build_setup

    start = time.perf_counter()
    s = build_setup(run_config(args, settings or {}), splits=splits)
    per_round = []
    for _ in range(args.rounds):
        r = s.engine.run_round()
        if s.device.type == "cuda":
            torch.cuda.synchronize()
        images = sum(p["samples"] for p in r["pairs"])
        loss = statistics.mean(p["loss"] for p in r["pairs"])
        per_round.append({"round": r["round"], "images": images, "seconds": r["train_seconds"], "mean_loss": loss})
    timed = per_round[1:] or per_round
    rates = [p["images"] / p["seconds"] for p in timed]
    return {
        "device": str(s.device) if s.device.type == "cpu" else torch.cuda.get_device_name(s.device),
        "amp": s.config.amp,
        "memory_format": s.config.memory_format,
        "cuda_graphs": s.config.cuda_graphs,
        "threads": torch.get_num_threads(),
        "width": args.width,
        "train_subset": len(s.splits.train),
        "local_steps": s.steps,
        "rounds": per_round,
        "images_per_s_median": statistics.median(rates),
        "seconds_per_round_median": statistics.median(p["seconds"] for p in timed),
        "wall_seconds": time.perf_counter() - start,
        "_splits": s.splits,
    }


def free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fastest(results: dict[str, dict]) -> str:
    """The fastest variant; a bf16 one only where it beats the fastest float32 one by :data:`BF16_MARGIN`."""
    speed = {name: r["images_per_s_median"] for name, r in results.items()}
    fp32 = {n: v for n, v in speed.items() if "bf16" not in n.split("+")}
    best = max(speed, key=speed.__getitem__)
    if fp32 and "bf16" in best.split("+"):
        best32 = max(fp32, key=fp32.__getitem__)
        return best if speed[best] >= BF16_MARGIN * speed[best32] else best32
    return best


def combine(names: list[str]) -> dict:
    """Processes that shared one GPU: their summed images/s (each process's median over its timed rounds)."""
    found = [n for n in names if (RESULTS / f"{n}.json").is_file()]  # a process cut off by its timeout wrote none
    if not found:
        raise SystemExit(f"--combine: none of {', '.join(names)} in {RESULTS}")
    files = [json.loads((RESULTS / f"{n}.json").read_text()) for n in found]
    parts = [f["variants"][f["best"]] if "variants" in f else f for f in files]  # one variant each
    return {
        "processes": len(names),
        "finished": len(parts),
        "images_per_s_total": sum(p["images_per_s_median"] for p in parts),
        "images_per_s_each": [p["images_per_s_median"] for p in parts],
        "parts": found,
        "machine": machine(),
    }


def paper_report(merged: dict, runs: Path | None) -> dict:
    """scripts/gpu_paper_scale.sh's merged probes (one process, then N processes sharing the GPU) and the
    validation CIS accuracy of its paper-scale runs so far, as one result with a markdown table."""
    one = merged["paper_speed"]
    shared = {k: v for k, v in merged.items() if "processes" in v}
    partial = {}
    for metrics in sorted(runs.glob("*/metrics.jsonl")) if runs else []:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        partial[metrics.parent.name] = {
            "rounds_done": max(r["round"] for r in rows),
            "seconds_per_round_median": statistics.median(r["train_seconds"] for r in rows),
            "val_cis_accuracy": {r["round"]: r["val_cis_accuracy"] for r in rows if "val_cis_accuracy" in r},
        }
    return {"probes": one, "shared": shared, "runs": partial}


def paper_markdown(result: dict) -> str:
    one = result["probes"]
    device = next(iter(one["variants"].values()))["device"]
    base = one["variants"]["fp32"]["images_per_s_median"] if "fp32" in one["variants"] else None
    lines = [
        f"# Paper-scale training speed on {device} (issue 35 item 5)\n",
        "ResNet-18 width 1, paper-7, CIFAR-10 (35,000 training images), 4 rounds of 16 local steps per variant "
        "(round 1 excluded), one process; then the fastest variant in N processes sharing the GPU. "
        f"Command: `{one['command']}`.\n",
        "| variant | images/s | vs fp32 |",
        "|---|---|---|",
    ]
    for name, v in one["variants"].items():
        ratio = f"{v['images_per_s_median'] / base:.2f}x" if base else "–"
        lines.append(f"| {name} | {v['images_per_s_median']:,.0f} | {ratio} |")
    lines += ["", f"Fastest (bf16 only at >= {BF16_MARGIN}x the fastest float32): {one['best']}.\n",
              "| processes sharing the GPU | images/s together | each |", "|---|---|---|"]  # fmt: skip
    for v in result["shared"].values():
        each = ", ".join(f"{x:,.0f}" for x in v["images_per_s_each"])
        lines.append(f"| {v['processes']} | {v['images_per_s_total']:,.0f} | {each} |")
    if result["runs"]:
        lines += ["", "Paper-scale runs at 5-15-80, seed 1, the fastest variant, side by side (stopped by the "
                  "session's device time; checkpoints not kept):\n",
                  "| strategy | rounds done | s/round (median) | validation CIS accuracy by round |",
                  "|---|---|---|---|"]  # fmt: skip
        for name, r in result["runs"].items():
            acc = ", ".join(f"{k}: {100 * v:.1f}" for k, v in r["val_cis_accuracy"].items())
            lines.append(f"| {name} | {r['rounds_done']} | {r['seconds_per_round_median']:.2f} | {acc} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:K | auto")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--train-subset", type=int, default=7000)
    ap.add_argument("--val-size", type=int, default=2000)
    ap.add_argument("--local-steps", type=int, default=None, help="J directly (default: local epochs 0.25)")
    ap.add_argument("--paper-scale", action="store_true", help="width 1, val 5,000, every other image, J = 118")
    ap.add_argument("--variants", default=None, help="comma-separated, e.g. fp32,channels_last,bf16,graphs+bf16")
    ap.add_argument("--combine", default=None, help="comma-separated result names measured at once: sum them")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--data", default="/tmp/cifar10")
    ap.add_argument("--out", default=None, help="result name in bench/results")
    ap.add_argument("--report-paper", default=None, help="scripts/gpu_paper_scale.sh's paper_speed.json: report it")
    ap.add_argument("--runs", default=None, help="with --report-paper: the unpacked paper-scale run dirs")
    args = ap.parse_args()
    if args.report_paper:
        result = paper_report(json.loads(Path(args.report_paper).read_text()), Path(args.runs) if args.runs else None)
        write_results(args.out or "paper_speed", result)
        (RESULTS / f"{args.out or 'paper_speed'}.md").write_text(paper_markdown(result))
        return
    given = {a.split("=")[0] for a in sys.argv[1:]}
    if args.combine:
        result = combine([n for n in args.combine.split(",") if n])
        write_results(args.out or "train_device_speed_combined", result)
        print(f"{result['processes']} processes: {result['images_per_s_total']:.0f} images/s together")
        return
    if args.paper_scale:
        for key, value in PAPER.items():
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, value)
    command = "python -m bench.train_device_speed " + " ".join(sys.argv[1:])
    name = args.out or f"train_device_speed_{args.device.split(':')[0]}" + ("" if args.amp == "off" else f"_{args.amp}")
    if args.variants is None:
        result = measure(args)
        result.pop("_splits")
        write_results(name, {**result, "machine": machine(), "command": command})
        print(
            f"{result['device']} (amp {args.amp}, {result['threads']} threads): "
            f"{result['images_per_s_median']:.0f} images/s, "
            f"{result['seconds_per_round_median']:.3f} s/round (median of rounds 2-{args.rounds})"
        )
        return
    results: dict[str, dict] = {}
    splits = None
    for variant in [v for v in args.variants.split(",") if v]:
        free_device_memory()  # the last variant's model, data copy and graphs
        got = measure(args, variant_settings(variant), splits)
        splits = got.pop("_splits")
        results[variant] = got
        print(f"{variant}: {got['images_per_s_median']:.0f} images/s ({got['wall_seconds']:.0f} s)", flush=True)
        write_results(name, {"variants": results, "best": fastest(results), "machine": machine(), "command": command})
    print(f"fastest: {fastest(results)}")


if __name__ == "__main__":
    main()
