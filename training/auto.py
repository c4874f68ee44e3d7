"""``--strategy auto``: choose the aggregation weights Lambda~ from the data at training time.

The CIS paper's best strategy changes from cell to cell of its Table 1, and a
user cannot train all four to find out. ``auto`` runs short pilots instead:

1. the candidates are equal, serving-rate and balanced-adj (training/strategies.py;
   flops is left out: its schedule only reaches its own weights in the last round),
   merged where their weights are within 0.02 of each other per exit;
2. every distinct candidate trains the first P = ceil(auto_pilot * T) rounds of the
   run from the same start: the same initial weights, the same seeded batches and
   exit draws, the same learning-rate schedule (rounds 1..P of the real run);
3. each pilot is scored by the CIS accuracy at the run's own serving setting on
   the validation split (never the test split), averaged over its last
   min(3, P) rounds to smooth the round-to-round noise;
4. the run goes on from the winner's state after round P (ties go to the earlier
   candidate), so only the losers' pilots are extra work: a run costs
   1 + (K - 1) * auto_pilot times a fixed strategy's for K distinct candidates,
   and with one distinct candidate (33-33-33) it IS that candidate's run.

The pilots' per-round lines and scores are written to ``auto.json`` in the run dir;
``--resume`` reads the choice back from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from training.engine import FederatedEngine
from training.strategies import Weights

SCORED_ROUNDS = 3


def pilot_length(total_rounds: int, fraction: float) -> int:
    """P: at least one round, and fewer than T (the run must go on after the choice)."""
    return max(1, min(total_rounds - 1, math.ceil(fraction * total_rounds)))


def pick(scores: dict[str, float]) -> str:
    """The candidate with the highest score; on a tie the earlier one."""
    best = None
    for name, score in scores.items():
        if best is None or score > scores[best]:
            best = name
    if best is None:
        raise ValueError("no pilot scores to pick from")
    return best


def snapshot(engine: FederatedEngine) -> dict[str, Any]:
    """Everything a run continues from: the global weights, the round and the trainers' state (copies)."""
    return {"global": {k: v.clone() for k, v in engine.global_state.items()}, "engine": engine.state_dict()}


def restore(engine: FederatedEngine, state: dict[str, Any]) -> None:
    engine.load_state_dict(state["engine"], state["global"])


def run_pilots(
    engine: FederatedEngine,
    weights: Weights,
    pilot: int,
    round_line: Callable[[dict], dict],
    evaluate: Callable[[], dict],
    on_round: Callable[[], None] = lambda: None,
) -> tuple[str, dict[str, dict]]:
    """Train every candidate of ``weights`` for ``pilot`` rounds; leave the engine in the winner's state.

    Returns the winner and, per candidate, its score and the metrics lines of its
    pilot rounds (with the validation evaluation of its scored rounds).
    """
    start = snapshot(engine)
    results: dict[str, dict] = {}
    best_state = None
    for name in weights.candidates:
        restore(engine, start)
        weights.choose(name)
        lines, scores, steps0 = [], [], sum(engine.sgd_steps)
        for k in range(1, pilot + 1):
            line = round_line(engine.run_round())
            if k > pilot - min(SCORED_ROUNDS, pilot):
                line.update(evaluate())
                scores.append(line["val_cis_accuracy"])
            lines.append(line)
            on_round()
        results[name] = {
            "val_cis_accuracy": float(sum(scores) / len(scores)),
            "sgd_steps": sum(engine.sgd_steps) - steps0,
            "lines": lines,
        }
        if pick({n: r["val_cis_accuracy"] for n, r in results.items()}) == name:
            best_state = snapshot(engine)
    winner = pick({n: r["val_cis_accuracy"] for n, r in results.items()})
    with torch.no_grad():
        restore(engine, best_state)
    weights.choose(winner)
    weights.details.update({
        "chosen": winner,
        "pilot_rounds": pilot,
        "pilot_val_cis_accuracy": {n: r["val_cis_accuracy"] for n, r in results.items()},
        # the losers' pilots: compute the run spent and then threw away (the winner's pilot is the run's start)
        "discarded_sgd_steps": sum(r["sgd_steps"] for n, r in results.items() if n != winner),
    })
    return winner, results
