"""Local training of one node in one round (Algorithm 1, lines 6-10).

:class:`ExitSGDTrainer` is the CIS paper's local step: J steps of mini-batch SGD
on the loss of the sampled exit only (the model runs ``forward(x, upto=e)``,
so stages after e are never computed). Every node keeps its own optimizer
(momentum buffers) across rounds. The learning rate follows one cosine schedule
over rounds, lr_t = lr * (1 + cos(pi (t-1) / T)) / 2 for round t = 1..T, which
is a function of the round alone: a node that sits a round out still finds its
schedule one step further when it comes back (the notes' "the schedule steps
even in rounds it sits out").

J is the same for every node: ``local_epochs`` passes over the *largest* node's
data (J = ceil(local_epochs * max_i |S_i| / batch)), so a node with less data
does proportionally more epochs over its own (the paper's "local epochs scaled
by largest / own dataset"). Batches walk through seeded permutations of the
node's data; a node with fewer samples than the batch size uses all of them.

A loss that is NaN or infinite (training that diverged, or a model whose output is not finite) is
:class:`NonFiniteLoss`, a one-line error; the engine names the round, node and exit it happened in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from cis.core.errors import CisError
from cis.training.cis_options import OPTIMIZERS
from cis.training.data.loading import augment_batch
from cis.training.graphs import exit_loss
from cis.training.models.contract import EarlyExitNet


@dataclass
class Client:
    """One node's local data (already tensors; shared, never copied per round)."""

    id: str
    index: int
    max_exit: int
    x: Tensor
    y: Tensor

    @property
    def size(self) -> int:
        return len(self.y)


class NonFiniteLoss(CisError):
    """A local step's loss is NaN or infinite: training diverged (too high a learning rate) or the model's output
    is not finite. One line; the engine adds where (round, node, exit) and the run fails with exit status 2."""


def finite_loss(loss: Tensor | float, lr: float, where: str = "") -> float:
    """``loss`` as a float; :class:`NonFiniteLoss` where it is NaN or infinite (``where``: e.g. which step)."""
    value = float(loss.detach()) if isinstance(loss, Tensor) else float(loss)
    if not math.isfinite(value):
        raise NonFiniteLoss(
            f"the training loss is {value}{where} at lr {lr:g}; expected a finite loss: training diverged, try a lower "
            "--lr (or --clip-grad-norm), or, where the model's own output is NaN or inf, fix the model"
        )
    return value


class LocalTrainer(Protocol):
    """How a node trains in a round. The engine hands it the working model already
    loaded with the global weights; it trains in place and returns statistics."""

    def setup(self, model: EarlyExitNet, clients: list[Client]) -> None: ...

    def train(self, model: EarlyExitNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def cosine_lr(base_lr: float, t: int, total_rounds: int, schedule: str = "cosine") -> float:
    if schedule == "constant":
        return base_lr
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * (t - 1) / max(total_rounds, 1)))


def local_steps(sizes: list[int], batch_size: int, local_epochs: float = 1.0, steps: int | None = None) -> int:
    """J: the same number of updates for every node, ``local_epochs`` over the largest dataset."""
    if steps is not None:
        return int(steps)
    return max(1, math.ceil(local_epochs * max(sizes) / batch_size))


def exit_steps(steps: int, flops: Sequence[float] | None, own_exit: int, exit: int) -> int:
    """Local steps for a node whose largest exit is ``own_exit`` training ``exit``.

    ``flops`` None (rule "same"): J for every exit. Otherwise (rule "flops", a
    diagnostic of bench/table2.py): a lower exit gets J * flops(own) / flops(exit)
    steps, the same compute as a round at the node's own exit.
    """
    if flops is None or exit >= own_exit:
        return steps
    return max(1, round(steps * flops[own_exit - 1] / flops[exit - 1]))


def batch_indices(n: int, batch_size: int, steps: int, gen: torch.Generator) -> list[Tensor]:
    """``steps`` batches walking through fresh permutations of range(n)."""
    b = min(batch_size, n)
    need = steps * b
    perms = [torch.randperm(n, generator=gen) for _ in range(math.ceil(need / n))]
    flat = torch.cat(perms)[:need]
    return list(flat.view(steps, b))


class LocalSGD:
    """The local SGD settings every local trainer shares (J steps of a batch, the lr schedule, augmentation,
    the optimizer and gradient clipping)."""

    def __init__(
        self,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        batch_size: int,
        steps: int,
        total_rounds: int,
        schedule: str = "cosine",
        augment: dict | None = None,
        optimizer: str = "sgd",
        clip_grad_norm: float | None = None,
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r}: expected one of {OPTIMIZERS}")
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.batch_size, self.steps, self.total_rounds = batch_size, steps, total_rounds
        self.schedule, self.augment = schedule, augment
        self.optimizer, self.clip_grad_norm = optimizer, clip_grad_norm
        self.step_loss = 0.0  # the last descend's loss

    def lr_at(self, round: int) -> float:
        return cosine_lr(self.lr, round, self.total_rounds, self.schedule)

    def make_optimizer(self, params: list[Tensor]) -> torch.optim.Optimizer:
        """A node's optimizer: ``torch.optim.SGD`` (lr, momentum, weight decay) or ``torch.optim.AdamW`` (lr,
        weight decay; torch's default betas and eps)."""
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def descend(self, opt: torch.optim.Optimizer, loss: Tensor, model: torch.nn.Module) -> None:
        """One step down ``loss``: gradients, clipped to ``clip_grad_norm`` (their total norm) where set, then
        the optimizer's step. Sets ``step_loss`` (the loss as a float); a NaN or infinite loss raises
        :class:`NonFiniteLoss`."""
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad_norm)
        opt.step()
        # read once the step is queued (no extra wait); a NaN or inf loss is NonFiniteLoss, one line
        self.step_loss = finite_loss(loss, opt.param_groups[0]["lr"])

    def round_stats(self, total_loss: float, client: Client, lr: float, steps: int | None = None) -> dict:
        """What a round of ``steps`` (default J) local steps reports: mean loss, steps, samples seen, lr."""
        steps = self.steps if steps is None else steps
        finite_loss(total_loss, lr, f" (summed over the round's {steps} steps)")
        samples = steps * min(self.batch_size, client.size)
        return {"loss": total_loss / steps, "steps": steps, "samples": samples, "lr": lr}


class ExitSGDTrainer(LocalSGD):
    """SGD on the sampled exit's loss; per-node momentum; cosine lr over rounds."""

    def __init__(self, exit_flops: Sequence[float] | None = None, **settings) -> None:
        super().__init__(**settings)
        self.exit_flops = exit_flops  # set: lower exits train J * flops(own) / flops(e) steps (rule "flops")
        self.exit_loss = exit_loss  # a step's loss; cis/training/graphs.py's GraphedExitLoss with cuda_graphs "on"
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self._params: list[Tensor] = []

    def setup(self, model: EarlyExitNet, clients: list[Client]) -> None:
        self._params = list(model.parameters())
        self.optimizers = {c.id: self.make_optimizer(self._params) for c in clients}

    def train(self, model: EarlyExitNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict:
        opt = self.optimizers[client.id]
        lr = self.lr_at(round)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        total = 0.0
        steps = exit_steps(self.steps, self.exit_flops, client.max_exit, exit)
        for idx in batch_indices(client.size, self.batch_size, steps, gen):
            xb, yb = client.x[idx], client.y[idx]
            if self.augment:
                xb = augment_batch(xb, gen, **self.augment)
            loss = self.exit_loss(model, xb, yb, exit)
            self.descend(opt, loss, model)
            total += self.step_loss
        return self.round_stats(total, client, lr, steps)

    # Resume: only tensors. Per node, its optimizer's per-parameter state as "<parameter index>.<name>"
    # (SGD: momentum_buffer; AdamW: exp_avg, exp_avg_sq, step).
    def state_dict(self) -> dict:
        out = {}
        for cid, opt in self.optimizers.items():
            out[cid] = {
                f"{k}.{name}": t.clone()
                for k, p in enumerate(self._params)
                for name, t in opt.state.get(p, {}).items()
                if isinstance(t, Tensor)
            }
        return {"optimizer": out}

    def load_state_dict(self, state: dict) -> None:
        per_node = state.get("optimizer")
        if per_node is None:  # checkpoints written before the optimizer state was generic: momentum buffers by index
            per_node = {
                cid: {f"{k}.momentum_buffer": b for k, b in bufs.items()}
                for cid, bufs in state.get("momentum", {}).items()
            }
        for cid, flat in per_node.items():
            opt = self.optimizers[cid]
            opt.state.clear()
            for key, t in flat.items():
                k, name = key.split(".", 1)
                param = self._params[int(k)]
                # a checkpoint loads on the CPU: the state goes to its parameter's device, except Adam's
                # step counter, which torch keeps on the CPU (as Optimizer.load_state_dict does)
                opt.state[param][name] = t.clone() if name == "step" else t.to(param.device, copy=True)
