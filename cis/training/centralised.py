"""``cis train --centralised``: one model trained on the pooled data, its exit losses weighted by Lambda~.

The common case where the data sits in one place. The run keeps the federated run's machinery with one
node, ``pooled``, that holds every training sample: each round it takes J SGD steps (J = ``--local-steps``,
else ``--local-epochs`` passes over the pooled data) on

    loss = sum_e Lambda~_e(t) * CE(logits of exit e, y)        over all exits e = 1..E,

Lambda~ being the ``--strategy`` weights that the federated run of the same config aggregates with (the
spec's serving rates; for balanced-adj the same sampling matrix and node sizes; ramps per round). No
partition, no exit sampling, no aggregation: the pooled node's weights are the model. Rounds stay the unit
of the lr schedule, validation and checkpoints, so metrics.jsonl, ``--resume``, ``sgd_steps``,
``cis evaluate`` and ``cis export`` work as for a federated run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cis.training.aggregation.weights import Weights
from cis.training.builders import WeightsFor, method_model
from cis.training.data.loading import augment_batch
from cis.training.federated import MethodSetup
from cis.training.local import Client, ExitSGDTrainer, batch_indices
from cis.training.methods.distill import exit_cross_entropies
from cis.training.models.contract import EarlyExitNet
from cis.training.sampling import sampling_matrix

POOLED = "pooled"  # the one node's id: its SGD steps are the run's


class PooledChooser:
    """Every round: the pooled node trains every exit (pair (0, E))."""

    def __init__(self, num_exits: int) -> None:
        self.num_exits = num_exits

    def choose(self, round: int, gen: torch.Generator) -> list[tuple[int, int]]:
        return [(0, self.num_exits)]


class WeightedExitTrainer(ExitSGDTrainer):
    """SGD (or AdamW) on the Lambda~_e(t)-weighted sum of every exit's cross-entropy; cosine lr over rounds."""

    def __init__(self, weights: Weights, **sgd) -> None:
        super().__init__(**sgd)
        self.weights = weights

    def train(self, model: EarlyExitNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict:
        opt = self.optimizers[client.id]
        lr = self.lr_at(round)
        for group in opt.param_groups:
            group["lr"] = lr
        w = torch.as_tensor(self.weights.at(round), dtype=torch.float32, device=client.x.device)
        model.train()
        total, per_exit = 0.0, torch.zeros(len(w))
        for idx in batch_indices(client.size, self.batch_size, self.steps, gen):
            xb, yb = client.x[idx], client.y[idx]
            if self.augment:
                xb = augment_batch(xb, gen, **self.augment)
            ce = exit_cross_entropies(model(xb, upto=exit), yb)
            loss = (w[: len(ce)] * ce.float()).sum()
            self.descend(opt, loss, model)
            total += float(loss.detach())
            per_exit += ce.detach().float().cpu()
        stats = self.round_stats(total, client, lr)
        stats["exit_loss"] = (per_exit / self.steps).tolist()
        return stats


class PooledAggregator:
    """The pooled node's weights become the global ones (nothing to average)."""

    def __init__(self) -> None:
        self._local: dict[str, Tensor] = {}

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        self._local = {}

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        self._local = local_state

    def finish(self, global_state: dict[str, Tensor]) -> None:
        for k, v in global_state.items():
            v.copy_(self._local[k])


def pooled_client(train_x: Tensor, train_y: Tensor, num_exits: int) -> Client:
    """The one node of a centralised run: every training sample, every exit."""
    return Client(POOLED, 0, num_exits, train_x, train_y)


def centralised_setup(config, spec, train, sgd: dict, weights_for: WeightsFor,
                      log: Callable[[str], None] = lambda s: None, start_weights: bool = True) -> MethodSetup:
    """Method ``cis``'s model (the built-in or ``--model``; ``--weights`` where ``start_weights``), the weights of
    the federated run with the spec's nodes, and the pooled pieces."""
    model = method_model(config, spec.num_exits, train, log, start_weights)
    matrix = sampling_matrix([n.exit for n in spec.nodes], spec.num_exits, 0.0, config.p_rule, None)
    weights = weights_for(model, matrix)
    trainer = WeightedExitTrainer(weights, **sgd)
    return MethodSetup(model, PooledChooser(spec.num_exits), trainer, PooledAggregator(), matrix, weights)
