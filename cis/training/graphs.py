"""CUDA graphs for the local steps (``cuda_graphs = "on"``): each step's forward, loss and backward replayed.

A local step of :class:`cis.training.local.ExitSGDTrainer` is many small kernels (a narrow ResNet on 32x32
images), so a GPU spends much of it waiting for the CPU to launch them. With ``cuda_graphs = "on"`` the
step's forward, loss and backward for exit e run as one captured CUDA graph
(``torch.cuda.make_graphed_callables``), one graph per (exit, batch shape, dtype), captured the first
time that pair of exit and shape trains; the optimizer step, the augmentation and the batch draw stay
eager, so every random draw is the same as without graphs. The graphs hold the working model's own
parameter tensors, which the engine reloads in place each pair (``load_state_dict`` copies into them),
so one capture serves every node.

Capturing runs a few warm-up steps on the model. They would move BatchNorm's running statistics, so the
model's state is restored after each capture: the run computes what it computes without graphs (up to
the order of GPU sums). ``make`` is the capture function, injectable so the CPU test can check that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cis.training.models.contract import EarlyExitNet


def exit_loss(model: EarlyExitNet, xb: Tensor, yb: Tensor, exit: int) -> Tensor:
    """The local step's loss: cross-entropy of exit ``exit``'s logits (stages after it are not run)."""
    return F.cross_entropy(model(xb, upto=exit)[exit - 1], yb)


class ExitLoss(nn.Module):
    """:func:`exit_loss` at one exit as a module of the model's parameters (what a graph captures)."""

    def __init__(self, model: EarlyExitNet, exit: int) -> None:
        super().__init__()
        self.model, self.exit = model, exit

    def forward(self, xb: Tensor, yb: Tensor) -> Tensor:
        return exit_loss(self.model, xb, yb, self.exit)


def capture(module: nn.Module, sample: tuple[Tensor, ...]) -> Callable[..., Tensor]:
    """torch's capture: forward and backward of ``module`` on ``sample``'s shapes, parameters a stage after the
    exit leaves unused allowed."""
    return cast(Callable[..., Tensor], torch.cuda.make_graphed_callables(module, sample, allow_unused_input=True))


class GraphedExitLoss:
    """:func:`exit_loss` through captured graphs, one per (model, exit, batch shape, dtype)."""

    def __init__(self, make: Callable[[nn.Module, tuple[Tensor, ...]], Callable[..., Tensor]] = capture) -> None:
        self.make = make
        self.graphs: dict[tuple[Any, ...], Callable[..., Tensor]] = {}

    def __call__(self, model: EarlyExitNet, xb: Tensor, yb: Tensor, exit: int) -> Tensor:
        key = (id(model), exit, tuple(xb.shape), xb.dtype, torch.is_autocast_enabled(xb.device.type))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(model, xb, yb, exit)
        return graph(xb, yb)

    def _capture(self, model: EarlyExitNet, xb: Tensor, yb: Tensor, exit: int) -> Callable[..., Tensor]:
        saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
        graph = self.make(ExitLoss(model, exit), (xb.detach().clone(), yb.detach().clone()))
        with torch.no_grad():  # undo the warm-up steps' BatchNorm updates: the state is the round's
            for k, v in model.state_dict().items():
                v.copy_(saved[k])
        return graph
