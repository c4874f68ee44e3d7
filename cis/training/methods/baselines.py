"""The engine pieces of ReeFL, FLAME and the early-exit baselines (ExitChooser, LocalTrainer, Aggregator).

- Choosers: :class:`BudgetChooser` (each taking-part client trains its largest
  exit; ExclusiveFL keeps only the clients that fit the full model).
- Trainers: :class:`MultiExitTrainer` (losses of all exits in the client's
  budget plus a distillation term: ReeFL, DepthFL, ExclusiveFL, ScaleFL);
  InclusiveFL trains its sub-model's deepest exit only, which is
  :class:`cis.training.local.ExitSGDTrainer` as it is; :class:`FlameTrainer`.
Their aggregation (a weighted average per entry over the clients that hold it, InclusiveFL's momentum
distillation as an option) is :class:`cis.training.aggregation.aggregators.MaskedAggregator`.

Budgets: :func:`round_robin_budgets` gives client k the largest exit (k mod E) + 1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from cis.training.aggregation.averages import Holds, key_exit
from cis.training.data.loading import augment_batch
from cis.training.local import Client, ExitSGDTrainer, batch_indices, finite_loss
from cis.training.methods import distill, flame
from cis.training.methods.registry import FLAME_GROUP_STEPS, FLAME_GROUPINGS, FLAME_OPTIMIZERS, KD_RAMP_ROUNDS
from cis.training.methods.vit import Block, ViTEE, qkv_rows, width_counts
from cis.training.models.contract import EarlyExitNet
from cis.training.sampling import choose_participants

LOSSES = ("reefl", "depthfl", "all", "scalefl")
SCALEFL_WIDTHS_4 = (0.4, 0.55, 0.75, 1.0)
SCALEFL_KD_WEIGHT, SCALEFL_TAU = 0.05, 3.0
INCLUSIVEFL_BETA = 0.2


def round_robin_budgets(num_clients: int, num_exits: int) -> list[int]:
    """Client k's largest exit: (k mod E) + 1, the same number of clients per exit (the ReeFL setup)."""
    return [k % num_exits + 1 for k in range(num_clients)]


def scalefl_widths(num_exits: int) -> list[float]:
    """Width ratio of each sub-model: the paper's [0.4, 0.55, 0.75, 1] for 4 exits, else evenly from 0.4 to 1."""
    if num_exits == 4:
        return list(SCALEFL_WIDTHS_4)
    return [float(w) for w in np.linspace(0.4, 1.0, num_exits)] if num_exits > 1 else [1.0]


class BudgetChooser:
    """Each round a uniform share of the eligible clients takes part, each at its largest exit."""

    def __init__(self, max_exits: Sequence[int], participation: float = 1.0, only_exit: int | None = None) -> None:
        self.max_exits = [int(e) for e in max_exits]
        self.eligible = [i for i, e in enumerate(self.max_exits) if only_exit is None or e == only_exit]
        if not self.eligible:
            raise ValueError(f"no client has exit {only_exit} in its budget; ExclusiveFL would train nobody")
        self.participation = participation

    def choose(self, round: int, gen: torch.Generator) -> list[tuple[int, int]]:
        picked = choose_participants(len(self.eligible), self.participation, gen)
        return [(self.eligible[k], self.max_exits[self.eligible[k]]) for k in picked]


def check_exclusive_weights(weights, num_exits: int, rounds: int) -> None:
    """ExclusiveFL trains only the clients of the full model (exit E), each weighing Lambda~_E(t) |S_i|: in a round
    where Lambda~_E is 0 the average keeps the old values, the round's update thrown away. Such weights (the last
    exit serving no requests under serving-rate, auto ...) are refused before training (a ValueError: one line)."""
    for t in range(1, rounds + 1):
        if not float(weights.at(t)[num_exits - 1]) > 0:
            raise ValueError(
                f"only the clients of exit {num_exits} (the full model) train, and the {weights.strategy} weights "
                f"give exit {num_exits} weight 0 in round {t}, so their updates would be thrown away; expected "
                f"weights with exit {num_exits} above 0 (a spec whose last exit serves requests, or --strategy equal)"
            )


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


class MultiExitTrainer(ExitSGDTrainer):
    """SGD on the cross-entropies of exits 1..e (e: the client's largest exit) plus a distillation term.

    ``loss``: ``reefl`` (best-exit KD with the ramped weight, reset per call),
    ``depthfl`` (mutual KD, ramped), ``all`` (no KD: ExclusiveFL), ``scalefl``
    (the deepest exit teaches, weight 0.05, tau 3, at the sub-model's width).
    """

    def __init__(
        self,
        *,
        loss: str,
        distill_weight: float = 1.0,
        tau: float = 1.0,
        ramp_rounds: int = KD_RAMP_ROUNDS,
        widths: Sequence[float] | None = None,
        clip_value: float | None = None,
        **sgd,
    ) -> None:
        if loss not in LOSSES:
            raise ValueError(f"loss {loss!r}: expected one of {LOSSES}")
        if ramp_rounds < 1:
            raise ValueError(f"option kd_ramp_rounds is {ramp_rounds}; expected rounds >= 1")
        super().__init__(**sgd)
        self.loss, self.distill_weight, self.tau, self.ramp_rounds = loss, distill_weight, tau, ramp_rounds
        self.widths, self.clip_value = widths, clip_value
        self.teachers: dict[str, int] = {}  # client id -> teacher exit at the end of its last call

    def kd_weight(self, round: int) -> float:
        if self.loss == "scalefl":
            return self.distill_weight
        return distill.ramp_weight(round, self.ramp_rounds, self.distill_weight)

    def train(self, model: EarlyExitNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict:
        opt = self.optimizers[client.id]
        lr = self.lr_at(round)
        _set_lr(opt, lr)
        if self.widths is not None:  # ScaleFL, whose model is its own ViT
            cast(ViTEE, model).set_width(self.widths[exit - 1])
        model.train()
        running = distill.RunningLoss()
        eta = self.kd_weight(round) if self.loss != "all" else 0.0
        total, per_exit = 0.0, torch.zeros(exit)
        try:
            for idx in batch_indices(client.size, self.batch_size, self.steps, gen):
                xb, yb = client.x[idx], client.y[idx]
                if self.augment:
                    xb = augment_batch(xb, gen, **self.augment)
                logits = model(xb, upto=exit)
                ce = distill.exit_cross_entropies(logits, yb)
                per_exit += ce.detach().float().cpu()
                loss = ce.sum()
                if self.loss == "reefl":
                    running.update(ce.detach())
                if eta > 0 and len(logits) > 1:
                    loss = loss + eta * self._kd(logits, running)
                self.descend(opt, loss, model)
                total += float(loss.detach())
        finally:
            if self.widths is not None:
                cast(ViTEE, model).set_width(1.0)
        stats: dict[str, Any] = {"loss": total / self.steps, "steps": self.steps, "lr": lr, "kd_weight": eta}
        stats["exit_loss"] = (per_exit / self.steps).tolist()  # each exit's cross-entropy (metrics.jsonl's loss)
        if self.loss == "reefl" and running.value is not None:
            self.teachers[client.id] = running.teacher() + 1
            stats["teacher"] = self.teachers[client.id]
        return stats

    def descend(self, opt: torch.optim.Optimizer, loss: Tensor, model: torch.nn.Module) -> None:
        """One step down ``loss``: the gradients clipped by value first (option ``clip_value``, the method's own
        rule: each entry to [-v, v], as ``clip_grad_value_`` does, by a hook on each parameter while its gradient
        is made), then :meth:`LocalSGD.descend`'s: to the total norm ``clip_grad_norm`` (--clip-grad-norm, the
        run's: a bound on the step taken), the optimizer's step."""
        if self.clip_value is None:
            return super().descend(opt, loss, model)
        v = self.clip_value
        hooks = [p.register_hook(lambda g: g.clamp(-v, v)) for p in model.parameters() if p.requires_grad]
        try:
            super().descend(opt, loss, model)
        finally:
            for hook in hooks:
                hook.remove()

    def _kd(self, logits: list[Tensor], running: distill.RunningLoss) -> Tensor:
        if self.loss == "reefl":
            return distill.best_exit_kd(logits, running.teacher(), self.tau)
        if self.loss == "depthfl":
            return distill.mutual_kd(logits, self.tau)
        return distill.deepest_exit_kd(logits, self.tau)


class FlameTrainer(ExitSGDTrainer):
    """FLAME's local training: patience exits per sample, grouped backpropagation (b = ``batch_size``).

    ``group_step`` sizes each group's update (cis/training/methods/flame.py says why ``share`` is the default);
    ``optimizer`` is ``sgd`` (momentum SGD, as every trainer here) or the paper's ``adamw``.

    ``patience`` maps client id -> training patience p_tr. ``forward_flops[e-1]`` is
    the forward cost up to exit e (cis/training/models/flops.py) for the FLOPs accounting.
    ``last_avg_exit`` keeps each client's average training exit of its last call
    (exit-conscious and exit-based aggregation read it).
    """

    def __init__(
        self, *, patience: dict[str, int], forward_flops: Sequence[int], grouping: str = "exit",
        group_step: str = "share", fixed_exits: dict[str, int] | None = None, **sgd,
    ) -> None:
        if grouping not in FLAME_GROUPINGS:
            raise ValueError(f"grouping {grouping!r}: expected one of {FLAME_GROUPINGS}")
        if group_step not in FLAME_GROUP_STEPS:
            raise ValueError(f"group_step {group_step!r}: expected one of {FLAME_GROUP_STEPS}")
        if sgd.get("optimizer", "sgd") not in FLAME_OPTIMIZERS:
            raise ValueError(f"optimizer {sgd['optimizer']!r}: expected one of {FLAME_OPTIMIZERS}")
        super().__init__(**sgd)
        self.patience, self.forward_flops, self.grouping = dict(patience), list(forward_flops), grouping
        self.group_step = group_step
        self.fixed_exits = dict(
            fixed_exits or {}
        )  # the fixed-exit baseline: client -> the one exit all its samples train
        self.last_avg_exit: dict[str, float] = {}

    def make_optimizer(self, params: list[Tensor]) -> torch.optim.Optimizer:
        if self.optimizer == "adamw":
            return torch.optim.AdamW(
                params, lr=self.lr, betas=flame.ADAMW_BETAS, eps=flame.ADAMW_EPS, weight_decay=self.weight_decay
            )
        return super().make_optimizer(params)

    def train(self, model: EarlyExitNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict:
        opt = self.optimizers[client.id]
        lr = self.lr_at(round)
        _set_lr(opt, lr)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        p_tr = self.patience[client.id]
        total, updates, flops = 0.0, 0, 0
        exit_counts = np.zeros(model.num_exits, dtype=np.int64)
        for idx in batch_indices(client.size, self.batch_size, self.steps, gen):
            xb, yb = client.x[idx], client.y[idx]
            if self.augment:
                xb = augment_batch(xb, gen, **self.augment)
            if client.id in self.fixed_exits:
                exit_logits, exits = flame.fixed_exit_forward(model, xb, self.fixed_exits[client.id])
            else:
                exit_logits, exits = flame.patience_forward(model, xb, p_tr)
            groups = flame.group_samples(exits, self.grouping, model.num_exits, gen)
            losses = flame.group_losses(exit_logits, yb, groups, self.group_step)
            for grads in flame.group_gradients(losses, params):
                opt.zero_grad(set_to_none=True)
                for p, g in zip(params, grads):
                    p.grad = g
                opt.step()
                updates += 1
            total += finite_loss(F.cross_entropy(exit_logits.detach(), yb), lr)  # the batch's mean loss at its exits
            flops += flame.training_flops(exits, self.forward_flops)
            exit_counts += np.bincount(exits, minlength=model.num_exits + 1)[1:]
        avg_exit = float((exit_counts * np.arange(1, model.num_exits + 1)).sum() / max(exit_counts.sum(), 1))
        self.last_avg_exit[client.id] = avg_exit
        return {
            "loss": total / self.steps, "steps": self.steps, "updates": updates, "lr": lr, "patience": p_tr,
            "avg_exit": avg_exit, "train_flops": flops, "exit_counts": exit_counts.tolist(),
        }


_BLOCK_PARAM = re.compile(r"\.blocks\.(\d+)\.(qkv|proj|fc1|fc2)\.(weight|bias)$")


def width_holds(model: ViTEE, max_exit: int, ratio: float) -> Holds:
    """ScaleFL: the entries a sub-model of depth ``max_exit`` and width ``ratio`` contains (entrywise masks)."""
    block: Block = model.blocks()[0]
    h_on, k_on = width_counts(block.heads, block.hidden, ratio)
    rows = qkv_rows(block.heads, block.head_dim, h_on)

    def holds(key: str, value: Tensor) -> bool | Tensor:
        if (key_exit(key) or 1) > max_exit:
            return False
        m = _BLOCK_PARAM.search(key)
        if m is None or ratio >= 1.0:
            return True
        layer, kind = m.group(2), m.group(3)
        mask = torch.zeros_like(value, dtype=torch.bool)
        if layer == "qkv":
            mask[rows] = True
        elif layer == "proj":
            if kind == "weight":
                mask[:, : h_on * block.head_dim] = True
            else:
                mask[:] = True
        elif layer == "fc1":
            mask[:k_on] = True
        elif kind == "weight":  # fc2
            mask[:, :k_on] = True
        else:
            mask[:] = True
        return mask

    return holds


def block_prefixes(model: EarlyExitNet) -> list[str]:
    """State-dict prefixes of the transformer blocks, shallow to deep."""
    return [name + "." for name, m in model.named_modules() if isinstance(m, Block)]


def exit_boundary_blocks(exits: Sequence[int]) -> list[int]:
    """0-based index of the top block of every sub-model but the full one."""
    return [e - 1 for e in list(exits)[:-1]]
