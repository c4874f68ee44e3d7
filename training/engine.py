"""The federated round loop with pluggable pieces.

One round of :class:`FederatedEngine`:

    pairs = chooser.choose(t, gen)                 # which node trains which sub-model (exit)
    aggregator.begin(global_state, t)
    for (i, e) in pairs:                           # clients run one after another in this process
        model.load_state_dict(global_state)        # in-place copy into the ONE working model
        stats = trainer.train(model, client_i, e, t, gen_i)
        aggregator.add(client_i, e, model.state_dict())   # accumulates its weighted delta in place
    aggregator.finish(global_state)                # updates the global state in place

Memory: the global state, the working model and one accumulator (three copies
of the weights) plus whatever the trainer keeps per node (momentum buffers).
No per-client model copies are made.

Randomness is derived, not carried: round t draws its pairs from a generator
seeded by (seed, t) and node i's batches/augmentation from (seed, t, i). A run
resumed from the checkpoint after round t therefore replays rounds t+1.. exactly;
the only trainer state to save is what the trainer itself keeps (momentum).

Methods plug in by implementing :class:`ExitChooser`, :class:`training.local.LocalTrainer`
and :class:`Aggregator` (e.g. ReeFL: a trainer with distillation and an
aggregator that averages per parameter over the clients that hold it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from training.aggregation import (
    accumulate,
    accumulate_aliased,
    aliased_totals,
    apply_aliased,
    apply_update,
    coefficient_totals,
    pair_coefficient,
    round_coefficients,
    zeros_like_state,
)
from training.local import Client, LocalTrainer
from training.models import EarlyExitNet
from training.sampling import choose_participants, exit_data_sizes, sample_exits
from training.strategies import Weights


def derived_generator(*key: int) -> torch.Generator:
    """A torch generator seeded from a tuple of integers (seed, round, node ...)."""
    seed = int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


class ExitChooser(Protocol):
    def choose(self, round: int, gen: torch.Generator) -> list[tuple[int, int]]:
        """[(client index, exit or sub-model id)] for this round."""
        ...


class Aggregator(Protocol):
    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None: ...

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None: ...

    def finish(self, global_state: dict[str, Tensor]) -> None: ...


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


class CisAggregator:
    """Algorithm 1, line 12: w += eta_s * sum c_ie (w_ie - w), c_ie = Lambda~_e |S_i| / (|S_e,p| p_ie).

    ``coefficient_rule`` selects the diagnostic variants of training/aggregation.py
    (default: line 12 as written) and ``bn_rule`` the update of BatchNorm running
    statistics (default ``convex``: line 12 unless it would overshoot). After each round,
    ``last_stats`` holds the round's total coefficient per stage body and per exit
    head and how many BatchNorm variances the projection clamped at 0.
    """

    def __init__(
        self,
        weights: Weights,
        matrix: np.ndarray,
        sizes: Sequence[int],
        inclusion: float = 1.0,
        p_mode: str = "divide",
        server_lr: float = 1.0,
        coefficient_rule: str = "literal",
        bn_rule: str = "convex",
    ) -> None:
        self.weights, self.matrix = weights, np.asarray(matrix)
        self.sizes = [int(s) for s in sizes]
        self.exit_sizes = exit_data_sizes(self.matrix, self.sizes)
        self.inclusion, self.p_mode, self.server_lr = inclusion, p_mode, server_lr
        self.coefficient_rule, self.bn_rule = coefficient_rule, bn_rule
        self._acc: dict[str, Tensor] | None = None
        self._global: dict[str, Tensor] | None = None
        self._coef: dict[int, float] = {}
        self._stat_weight: dict[str, float] | None = None
        self.last_coefficients: list[float] = []
        self.last_stats: dict = {}

    def coefficients(self, round: int, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """c_ie of each pair of the round, under this aggregator's p mode and coefficient rule."""
        p_pair = [float(self.matrix[i, e - 1]) * self.inclusion for i, e in pairs]
        return round_coefficients(
            pairs, self.weights.at(round), self.sizes, self.exit_sizes, p_pair, self.p_mode, self.coefficient_rule
        )

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        coefs = self.coefficients(round, pairs)
        self._coef = {i: c for (i, _), c in zip(pairs, coefs)}
        self.last_stats = {"coefficients": coefficient_totals(pairs, coefs, self.matrix.shape[1])}
        self._global = global_state
        self._stat_weight = {} if self.bn_rule == "convex" else None
        if self._acc is None:
            self._acc = zeros_like_state(global_state)
        else:  # reuse the buffers: zero the deltas, restart the counts from the global ones
            for k, a in self._acc.items():
                a.zero_() if a.is_floating_point() else a.copy_(global_state[k])
        self.last_coefficients = []

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        c = self._coef[client.index]
        self.last_coefficients.append(c)
        accumulate(self._acc, local_state, self._global, c, self._stat_weight)

    def finish(self, global_state: dict[str, Tensor]) -> None:
        self.last_stats["bn_clamped"] = apply_update(global_state, self._acc, self.server_lr, self._stat_weight)


class AuthorsCodeAggregator:
    """Algorithm 1 as the authors' public code runs it (``--algorithm authors-code``, training/aggregation.py).

    The global model is the root's own model: the root trains it in place, and every other
    pair's difference is taken against the root's trained weights, on the parts that pair
    trained, with c_ce = Lambda~_e |S_c| p_ce / |S_{e,p}| (p_ce: the pair's row of the
    sampling matrix, 1 for a one-exit node). ``exit_keys(e)`` names the state entries that
    training exit e changes (:meth:`training.models.EarlyExitNet.exit_state_keys`).
    """

    def __init__(
        self,
        weights: Weights,
        matrix: np.ndarray,
        sizes: Sequence[int],
        root: int,
        exit_keys: Callable[[int], list[str]],
        server_lr: float = 1.0,
    ) -> None:
        self.weights, self.matrix, self.root = weights, np.asarray(matrix), root
        self.sizes = [int(s) for s in sizes]
        self.exit_sizes = exit_data_sizes(self.matrix, self.sizes)
        self.exit_keys, self.server_lr = exit_keys, server_lr
        self._acc: dict[str, Tensor] = {}
        self._totals: dict[str, float] = {}
        self._coef: dict[int, float] = {}
        self._reference: dict[str, Tensor] | None = None
        self._global: dict[str, Tensor] | None = None
        self.last_coefficients: list[float] = []
        self.last_stats: dict = {}

    def coefficients(self, round: int, pairs: Sequence[tuple[int, int]]) -> list[float]:
        """c_ce of each pair (the root's too, though its update enters with weight 1)."""
        w = self.weights.at(round)
        return [
            pair_coefficient(float(w[e - 1]), self.sizes[i], float(self.exit_sizes[e - 1]),
                             float(self.matrix[i, e - 1]), "multiply")
            for i, e in pairs
        ]

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        coefs = self.coefficients(round, pairs)
        self._coef = {i: c for (i, _), c in zip(pairs, coefs)}
        self.last_stats = {
            "coefficients": aliased_totals(pairs, coefs, self.matrix.shape[1], self.root),
            "reference": "root",
        }
        self._global, self._reference, self._totals = global_state, None, {}
        if not self._acc:
            self._acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
        for a in self._acc.values():
            a.zero_()
        self.last_coefficients = []

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        if client.index == self.root:  # the global model itself, trained in place
            self._reference = {k: v.detach().clone() for k, v in local_state.items()}
            self.last_coefficients.append(1.0)
            return
        c = self._coef[client.index]
        self.last_coefficients.append(c)
        accumulate_aliased(self._acc, self._totals, local_state, self.exit_keys(exit), c)

    def finish(self, global_state: dict[str, Tensor]) -> None:
        reference = self._reference if self._reference is not None else {k: v.clone() for k, v in global_state.items()}
        apply_aliased(global_state, reference, self._acc, self._totals, self.server_lr)
        self._reference = None


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

    def run_round(self) -> dict:
        t = self.round + 1
        start = time.perf_counter()
        pairs = self.chooser.choose(t, derived_generator(self.seed, t))
        self.aggregator.begin(self.global_state, t, pairs)
        records = []
        for i, e in pairs:
            client = self.clients[i]
            self.model.load_state_dict(self.global_state)
            stats = self.trainer.train(self.model, client, e, t, derived_generator(self.seed, t, i + 1))
            self.sgd_steps[i] += int(stats.get("steps", 0))
            self.aggregator.add(client, e, self.model.state_dict())
            records.append({"node": client.id, "exit": e, **stats})
        self.aggregator.finish(self.global_state)
        self.model.load_state_dict(self.global_state)
        self.round = t
        return {"round": t, "pairs": records, "train_seconds": time.perf_counter() - start}

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
