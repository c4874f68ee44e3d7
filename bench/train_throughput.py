"""Samples/s of the federated engine against a plain centralized PyTorch loop.

Same model, same data, same number and kind of updates: the engine runs R rounds
of the paper-7 CIS (7 nodes, each training its own largest exit for J steps,
then the Algorithm 1 aggregation); the plain loop runs the identical sequence
of (exit, batch) SGD steps on one model with one optimizer and no federation.
The ratio engine/plain is measured in one process, alternating the two,
and the median over repeats is reported. Overhead = 1 - ratio (target < 10 %).

    python -m bench.train_throughput [--quick] [--threads 1]
Writes bench/results/train_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from bench.harness import RESULTS
from cis.core.topologies import make_spec
from cis.training.aggregation.aggregators import CisAggregator
from cis.training.aggregation.weights import make_weights
from cis.training.architectures import build_model
from cis.training.data.loading import load_dataset
from cis.training.data.partition import partition
from cis.training.federated import ExitSampler, FederatedEngine, derived_generator
from cis.training.local import Client, ExitSGDTrainer, batch_indices
from cis.training.models.cnns import default_model_config
from cis.training.sampling import sampling_matrix


def setup(case: str, seed: int = 0):
    spec = make_spec("paper-7", "33-33-33")
    if case == "digits":
        d = load_dataset("digits", seed=seed).train
        x, y = torch.from_numpy(d.x), torch.from_numpy(d.y)
        mcfg, batch = default_model_config("digits"), 32
    else:  # CIFAR-shaped synthetic data, narrow ResNet-18 (the benchmark measures overhead, not accuracy)
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(1400, 3, 32, 32, generator=g), torch.randint(0, 10, (1400,), generator=g)
        mcfg, batch = default_model_config("cifar10", 0.125), 64
    parts = partition(y.numpy(), spec.nodes, "equal", seed=seed)
    clients = [
        Client(n.id, k, n.exit, x[torch.from_numpy(parts[n.id])], y[torch.from_numpy(parts[n.id])])
        for k, n in enumerate(spec.nodes)
    ]
    matrix = sampling_matrix([n.exit for n in spec.nodes], 3)
    steps = -(-max(c.size for c in clients) // batch)
    return spec, clients, matrix, mcfg, batch, steps


def run_engine(case: str, rounds: int) -> tuple[float, int]:
    spec, clients, matrix, mcfg, batch, steps = setup(case)
    torch.manual_seed(0)
    model = build_model(mcfg)
    trainer = ExitSGDTrainer(
        lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=batch, steps=steps, total_rounds=rounds
    )
    agg = CisAggregator(make_weights("equal", 3), matrix, [c.size for c in clients])
    engine = FederatedEngine(model, clients, ExitSampler(matrix), trainer, agg, seed=0)
    t = time.perf_counter()
    samples = 0
    for _ in range(rounds):
        r = engine.run_round()
        samples += sum(p["samples"] for p in r["pairs"])
    return time.perf_counter() - t, samples


def run_plain(case: str, rounds: int) -> tuple[float, int]:
    """The same (exit, batch) sequence on one model with one optimizer; no federation."""
    spec, clients, matrix, mcfg, batch, steps = setup(case)
    torch.manual_seed(0)
    model = build_model(mcfg).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    t = time.perf_counter()
    samples = 0
    for rnd in range(1, rounds + 1):
        for c in clients:
            e = c.max_exit
            for idx in batch_indices(c.size, batch, steps, derived_generator(0, rnd, c.index + 1)):
                loss = F.cross_entropy(model(c.x[idx], upto=e)[e - 1], c.y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                samples += len(idx)
    return time.perf_counter() - t, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke setting: 1 repeat, 1 round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cases", default="digits,resnet18-w0.125")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.rounds = 1, 1
    torch.set_num_threads(args.threads)
    out = {
        "threads": args.threads,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "machine": platform.processor() or platform.machine(),
        "cases": {},
    }
    for case in args.cases.split(","):
        run_engine(case, 1), run_plain(case, 1)  # warm-up
        eng, pln, ratios = [], [], []
        for _ in range(args.repeats):
            te, se = run_engine(case, args.rounds)
            tp, sp = run_plain(case, args.rounds)
            assert se == sp
            eng.append(se / te), pln.append(sp / tp), ratios.append((se / te) / (sp / tp))
        res = {
            "engine_samples_per_s": statistics.median(eng),
            "plain_samples_per_s": statistics.median(pln),
            "ratio_median": statistics.median(ratios),
            "overhead_median": 1 - statistics.median(ratios),
            "ratios": ratios,
            "samples_per_run": se,
        }
        out["cases"][case] = res
        print(
            f"{case}: engine {res['engine_samples_per_s']:.0f} samples/s, plain {res['plain_samples_per_s']:.0f} "
            "samples/s, "
            f"ratio {res['ratio_median']:.3f} (overhead {100 * res['overhead_median']:.1f} %)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "train_throughput_quick.json" if args.quick else "train_throughput.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS / name}")


if __name__ == "__main__":
    main()
