"""The federated round loop with pluggable pieces.

One round of :class:`FederatedEngine`:

    pairs = engine.choose(t)                       # which node trains which sub-model (exit)
    engine.aggregate_round(t, pairs, updates)      # the one aggregation call:
        aggregator.begin(global_state, t, pairs)
        for (i, e), (local_state, stats) in zip(pairs, updates):   # drawn order: the float sums' order
            sgd_steps[i] += stats["steps"]
            aggregator.add(client_i, e, local_state)   # accumulates its weighted part in place
        aggregator.finish(global_state)            # updates the global state in place

``run_round`` trains the pairs one after another in this process, ``updates`` being a generator
that loads the global state into the ONE working model, trains it and yields its state; the Flower
strategy (cis/training/flower/strategy.py) makes the same call over the nodes' replies.

Memory: the global state, the working model and one accumulator (three copies
of the weights) plus whatever the trainer keeps per node (momentum buffers).
No per-client model copies are made.

Randomness is derived, not carried: round t draws its pairs from a generator
seeded by (seed, t) and node i's batches/augmentation from (seed, t, i). A run
resumed from the checkpoint after round t therefore replays rounds t+1.. exactly;
the only trainer state to save is what the trainer itself keeps (momentum).

Methods plug in by implementing :class:`ExitChooser`, :class:`cis.training.local.LocalTrainer`
and :class:`cis.training.aggregation.aggregators.Aggregator` (a method's builder,
cis/training/methods/build_*.py, returns them as a :class:`MethodSetup`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from cis.training.aggregation.aggregators import Aggregator
from cis.training.local import Client, LocalTrainer
from cis.training.models.contract import EarlyExitNet
from cis.training.sampling import choose_participants, sample_exits

Pairs = Sequence[tuple[int, int]]
"""A round's (node index, exit or sub-model) pairs, in the order they were drawn."""


def derived_generator(*key: int) -> torch.Generator:
    """A torch generator seeded from a tuple of integers (seed, round, node ...)."""
    seed = int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


class ExitChooser(Protocol):
    def choose(self, round: int, gen: torch.Generator) -> list[tuple[int, int]]:
        """[(client index, exit or sub-model id)] for this round."""
        ...


class ExitSampler:
    """Algorithm 1, line 3: a participating set of nodes, each drawing one exit from its row of p."""

    def __init__(self, matrix: np.ndarray, participation: float = 1.0) -> None:
        self.matrix = np.asarray(matrix, dtype=np.float64)
        self.participation = participation

    @property
    def inclusion(self) -> float:
        """Probability that a given node takes part in a round."""
        n = len(self.matrix)
        if self.participation >= 1.0:
            return 1.0
        return max(1, int(round(self.participation * n))) / n

    def choose(self, round: int, gen: torch.Generator) -> list[tuple[int, int]]:
        nodes = choose_participants(len(self.matrix), self.participation, gen)
        return sample_exits(self.matrix, nodes, gen)


@dataclass
class MethodSetup:
    """What a method's builder hands the engine: the model and the three pieces, with the sampling matrix of
    the exit (sub-model) each node trains and the run's aggregation weights."""

    model: EarlyExitNet
    chooser: ExitChooser
    trainer: Any  # a cis.training.local.LocalTrainer
    aggregator: Aggregator
    matrix: np.ndarray
    weights: Any  # cis.training.aggregation.weights.Weights


class StepFailed(RuntimeError):
    """A node's local training raised; the message says where (round, node, exit), the cause what."""


class FederatedEngine:
    """Rounds of (choose, train locally, aggregate) over in-process clients."""

    def __init__(
        self,
        model: EarlyExitNet,
        clients: list[Client],
        chooser: ExitChooser,
        trainer: LocalTrainer,
        aggregator: Aggregator,
        seed: int = 0,
    ) -> None:
        self.model, self.clients = model, clients
        self.chooser, self.trainer, self.aggregator = chooser, trainer, aggregator
        self.seed = seed
        self.global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.round = 0
        self.sgd_steps = [0] * len(clients)  # local SGD steps each node has run so far (the run's compute)
        trainer.setup(model, clients)

    def choose(self, round: int) -> list[tuple[int, int]]:
        """Line 3: the round's (node index, exit) pairs, drawn from the generator of (seed, round)."""
        return self.chooser.choose(round, derived_generator(self.seed, round))

    def aggregate_round(
        self, round: int, pairs: Pairs, updates: Iterable[tuple[dict[str, Tensor], dict]]
    ) -> list[dict]:
        """Line 12 (or the method's rule) over one round: ``updates`` yields each pair's (local state, stats) in
        the order of ``pairs``. Counts each node's local SGD steps (``stats["steps"]``), updates the global state
        and the working model, and returns the pairs' records ({node, exit, **stats})."""
        self.aggregator.begin(self.global_state, round, pairs)
        records = []
        for (i, e), (local_state, stats) in zip(pairs, updates):
            client = self.clients[i]
            self.sgd_steps[i] += int(stats.get("steps", 0))
            self.aggregator.add(client, e, local_state)
            records.append({"node": client.id, "exit": e, **stats})
        self.aggregator.finish(self.global_state)
        self.model.load_state_dict(self.global_state)
        self.round = round
        return records

    def run_round(self) -> dict:
        t = self.round + 1
        start = time.perf_counter()
        pairs = self.choose(t)
        records = self.aggregate_round(t, pairs, self._train(t, pairs))
        return {"round": t, "pairs": records, "train_seconds": time.perf_counter() - start}

    def _train(self, t: int, pairs: Pairs) -> Iterator[tuple[dict[str, Tensor], dict]]:
        """Each pair trained in turn on the working model, loaded with the global state first."""
        for i, e in pairs:
            self.model.load_state_dict(self.global_state)
            try:
                stats = self.trainer.train(self.model, self.clients[i], e, t, derived_generator(self.seed, t, i + 1))
            except Exception as exc:  # the run says where (cis/training/run.py: one line)
                raise StepFailed(f"round {t}, node {self.clients[i].id} training exit {e}") from exc
            yield self.model.state_dict(), stats

    def sync_model(self) -> EarlyExitNet:
        """The working model holding the global weights (after a round it already does)."""
        self.model.load_state_dict(self.global_state)
        return self.model

    def start_from(self, weights: dict[str, Tensor]) -> None:
        """Begin from given global weights (a warm start: the papers that fine-tune a pretrained model)."""
        for k, v in self.global_state.items():
            v.copy_(weights[k])
        self.sync_model()

    def state_dict(self) -> dict:
        """Trainer state for resuming (tensors only); the global weights go in the checkpoint's model."""
        return {
            "round": torch.tensor(self.round),
            "sgd_steps": torch.tensor(self.sgd_steps),
            "trainer": self.trainer.state_dict(),
        }

    def load_state_dict(self, state: dict, global_state: dict[str, Tensor]) -> None:
        self.round = int(state["round"])
        if "sgd_steps" in state:  # checkpoints from before the count resume with it unknown (0)
            self.sgd_steps = [int(x) for x in state["sgd_steps"]]
        for k, v in self.global_state.items():
            v.copy_(global_state[k])
        self.trainer.load_state_dict(state.get("trainer", {}))
        self.sync_model()
