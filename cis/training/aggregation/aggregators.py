"""The aggregators: the engine's streaming form of the update rules, one client at a time.

Each takes a round as ``begin(global_state, round, pairs)``, one ``add(client, exit, local_state)``
per trained pair in the drawn order, and ``finish(global_state)``, which updates the global state in
place (:meth:`cis.training.federated.FederatedEngine.aggregate_round` drives them, for the built-in engine
and for Flower alike). No per-client copies: each keeps one accumulator.

- :class:`CisAggregator`: Algorithm 1's line 12 (:mod:`cis.training.aggregation.line12`);
- :class:`AuthorsCodeAggregator`: line 12 as the authors' code runs it (the root's model is the reference);
- :class:`MaskedAggregator`: the per-entry averages of ReeFL, FLAME and the early-exit baselines
  (:mod:`cis.training.aggregation.averages`), with InclusiveFL's momentum distillation as an option;
- :class:`SubsetAggregator`: the nested methods' per-element average of the uploaded slices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch
from torch import Tensor

from cis.training.aggregation.averages import SelectionAverage, Term, block_deltas_distilled
from cis.training.aggregation.line12 import (
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
from cis.training.aggregation.weights import Weights
from cis.training.cis_options import HEAD_UPDATES
from cis.training.sampling import exit_data_sizes
from cis.training.selection import Selection, gather

if TYPE_CHECKING:
    from cis.training.local import Client


class Aggregator(Protocol):
    """What the engine asks of an aggregator each round (see the module's docstring)."""

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None: ...

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None: ...

    def finish(self, global_state: dict[str, Tensor]) -> None: ...


class CisAggregator:
    """Algorithm 1, line 12: w += eta_s * sum c_ie (w_ie - w), c_ie = Lambda~_e |S_i| / (|S_e,p| p_ie).

    ``coefficient_rule`` selects the diagnostic variants of :mod:`cis.training.aggregation.line12`
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
        # begin() set the round's buffers and global state (the engine calls begin, add..., finish)
        acc, global_state = cast(dict[str, Tensor], self._acc), cast(dict[str, Tensor], self._global)
        accumulate(acc, local_state, global_state, c, self._stat_weight)

    def finish(self, global_state: dict[str, Tensor]) -> None:
        acc = cast(dict[str, Tensor], self._acc)  # set by begin()
        self.last_stats["bn_clamped"] = apply_update(global_state, acc, self.server_lr, self._stat_weight)


class AuthorsCodeAggregator:
    """Algorithm 1 as the authors' public code runs it (``--algorithm authors-code``; the rule is
    :func:`~cis.training.aggregation.line12.aliased_update`).

    The global model is the root's own model: the root trains it in place, and every other
    pair's difference is taken against the root's trained weights, on the parts that pair
    trained, with c_ce = Lambda~_e |S_c| p_ce / |S_{e,p}| (p_ce: the pair's row of the
    sampling matrix, 1 for a one-exit node). ``exit_keys(e, head=True)`` names the state entries that
    training exit e changes (:meth:`cis.training.models.cnns.EarlyExitNet.exit_state_keys`).

    ``head_update`` "applied" (default) moves head e by every pair that trained it; "released-code"
    drops the other pairs' head updates as arodio/FedCIS's released ``aggregate`` does (it writes
    them into ``classifiers[e_block - 1]`` and applies ``classifiers[block]`` for ``block in
    layers_per_classifier``, never the same index): only the root's in-place training moves a head.
    """

    def __init__(
        self,
        weights: Weights,
        matrix: np.ndarray,
        sizes: Sequence[int],
        root: int,
        exit_keys: Callable[..., list[str]],
        server_lr: float = 1.0,
        head_update: str = "applied",
    ) -> None:
        if head_update not in HEAD_UPDATES:
            raise ValueError(f"head update {head_update!r}: expected one of {HEAD_UPDATES}")
        self.weights, self.matrix, self.root = weights, np.asarray(matrix), root
        self.sizes = [int(s) for s in sizes]
        self.exit_sizes = exit_data_sizes(self.matrix, self.sizes)
        self.exit_keys, self.server_lr, self.head_update = exit_keys, server_lr, head_update
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
        heads = self.head_update == "applied"
        self.last_stats = {
            "coefficients": aliased_totals(pairs, coefs, self.matrix.shape[1], self.root, heads_applied=heads),
            "reference": "root",
        }
        if not heads:
            self.last_stats["head_update"] = self.head_update
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
        keys = self.exit_keys(exit) if self.head_update == "applied" else self.exit_keys(exit, head=False)
        accumulate_aliased(self._acc, self._totals, local_state, keys, c)

    def finish(self, global_state: dict[str, Tensor]) -> None:
        reference = self._reference if self._reference is not None else {k: v.clone() for k, v in global_state.items()}
        apply_aliased(global_state, reference, self._acc, self._totals, self.server_lr)
        self._reference = None


class MaskedAggregator:
    """The per-entry averages of :mod:`cis.training.aggregation.averages`, one client at a time.

    ``term(client, exit, size)`` is the client's :data:`~cis.training.aggregation.averages.Term` (weight, holds);
    ``size`` is its sample weight: |S_i|, or with inference-aware ``weights`` (the run's ``--strategy``)
    Lambda~_e(t) |S_i|, the CIS paper's weighting of the entry it trained. ``momentum_beta`` > 0 adds
    InclusiveFL's momentum distillation to the server update: the top block of every smaller sub-model
    also moves by beta times the mean update of the deeper blocks.
    """

    def __init__(
        self,
        term: Callable[[Client, int, float], Term],
        weights: Weights | None = None,
        momentum_beta: float = 0.0,
        block_prefixes: Sequence[str] = (),
        boundaries: Sequence[int] = (),
    ) -> None:
        self.term, self.weights = term, weights
        self.beta, self.prefixes, self.boundaries = momentum_beta, list(block_prefixes), list(boundaries)
        self._avg = SelectionAverage()
        self._global: dict[str, Tensor] = {}
        self._lam: np.ndarray | None = None
        self._old: dict[str, Tensor] = {}
        self.last_weights: list[float] = []

    def size(self, client: Client, exit: int) -> float:
        """The client's sample weight for the entry ``exit``: Lambda~_e(t) |S_i| (inference-aware) or |S_i|."""
        return float(client.size) if self._lam is None else float(self._lam[exit - 1]) * client.size

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        self._global = global_state
        self._lam = None if self.weights is None else self.weights.at(round)
        self.last_weights = []
        if self.beta:
            self._old = {k: v.clone() for k, v in global_state.items()}

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        weight, holds = self.term(client, exit, self.size(client, exit))
        self.last_weights.append(weight)
        self._avg.add_masked(self._global, local_state, weight, holds)

    @torch.no_grad()
    def finish(self, global_state: dict[str, Tensor]) -> None:
        self._avg.write(global_state)
        if self.beta:
            delta = {k: global_state[k] - self._old[k] for k in global_state if global_state[k].is_floating_point()}
            for k, d in block_deltas_distilled(delta, self.prefixes, self.boundaries, self.beta).items():
                global_state[k].copy_(self._old[k] + d)


class Uploader(Protocol):
    """A trainer that keeps what each client uploaded in the round (client index -> selection)."""

    @property
    def uploads(self) -> Mapping[int, Selection]: ...


class SubsetAggregator:
    """Element-wise weighted average of the uploaded slices
    (:func:`~cis.training.aggregation.averages.average_selections`, streamed).

    ``trainer.uploads[client index]`` is the selection a client uploaded this round, keyed by global tensor
    (:class:`cis.training.methods.subfl.SubsetTrainer` keeps them); ``after(global_state)`` runs once the averages
    are written (HeteroFL's static BatchNorm marks its per-sub-model statistics stale:
    :func:`cis.training.methods.static_bn.mark_stale_`)."""

    def __init__(
        self,
        trainer: Uploader,
        weight: Callable[[Client, int, int], float] | None = None,
        after: Callable[[dict[str, Tensor]], None] | None = None,
    ) -> None:
        self.trainer = trainer
        self.weight = weight or (lambda client, k, round: float(client.size))
        self.after = after
        self._avg = SelectionAverage(torch.float64)
        self._global: dict[str, Tensor] = {}
        self._round = 0

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        self._global, self._round = global_state, round

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        upload = self.trainer.uploads[client.index]
        self._avg.add_selection(
            self._global, gather(local_state, upload), upload, self.weight(client, exit, self._round)
        )

    def finish(self, global_state: dict[str, Tensor]) -> None:
        self._avg.write(global_state)
        if self.after is not None:
            self.after(global_state)
