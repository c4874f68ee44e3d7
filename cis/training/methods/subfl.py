"""What a device of a nested method trains: the device models (which compact network, loaded and uploaded
where) and the trainer of the compact networks.

The engine hands the trainer the working :class:`~cis.training.methods.nested.NestedNet`
loaded with the global weights. :class:`SubsetTrainer` asks its
:class:`DeviceModel` rule what the device trains this round (a compact network,
the selection it loads, the selection it uploads), trains that compact network,
and writes the uploaded pieces back into the working model in place.
:class:`cis.training.aggregation.aggregators.SubsetAggregator` then averages every uploaded element over the clients
that uploaded it (:class:`~cis.training.aggregation.averages.SelectionAverage`): NeFedAvg
for nested slices, per-sub-model FedAvg for decoupled BatchNorm and step sizes,
the index-wise average of HeteroFL / FedRolex / FD, and SLT's trained-slices-only average.

A fresh SGD optimizer per client and round (momentum does not carry over, as the
compact network's shape changes between rounds); the learning rate follows the
engine's cosine schedule over rounds. Only one trainer state: none (resume-safe).

"exit" k in the engine's pairs is the sub-model a client trains in that round
(cis/training/families/nested.py builds the server model and these pieces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from cis.training.data.loading import augment_batch
from cis.training.local import Client, LocalSGD, batch_indices, finite_loss
from cis.training.methods import slt as slt_mod
from cis.training.methods import widthfl
from cis.training.methods.nested import NestedNet
from cis.training.methods.resnet import CompactResNet
from cis.training.selection import Selection, gather, scatter_

DeviceChoice = tuple[CompactResNet, Selection, Selection]
"""(compact network, selection it loads, selection it uploads)."""


class DeviceModel:
    """What client ``client`` trains as sub-model ``k`` in ``round``; ``per_batch`` redraws it every mini-batch."""

    per_batch = False

    def choose(self, model: NestedNet, client: Client, k: int, round: int, gen: torch.Generator) -> DeviceChoice:
        raise NotImplementedError


class NestedDevice(DeviceModel):
    """NeFL / HeteroFL / small model / DepthFL-style: the server model's own sub-model k."""

    def choose(self, model: NestedNet, client: Client, k: int, round: int, gen: torch.Generator) -> DeviceChoice:
        net, sel = model.trainee(k)
        return net, sel, sel


class FjordDevice(NestedDevice):
    """FjORD: every mini-batch trains a sub-model drawn uniformly from 1..k (ordered dropout)."""

    per_batch = True

    def choose(self, model: NestedNet, client: Client, k: int, round: int, gen: torch.Generator) -> DeviceChoice:
        return super().choose(model, client, int(torch.randint(1, k + 1, (1,), generator=gen)), round, gen)


@dataclass
class GroupDevice(DeviceModel):
    """FedRolex (``rolling``) / Federated Dropout (``random``) / ordered: a width per sub-model k."""

    rule: str
    widths: Sequence[float]  # channel keep-ratio s of sub-model k = 1..E

    def choose(self, model: NestedNet, client: Client, k: int, round: int, gen: torch.Generator) -> DeviceChoice:
        groups = widthfl.RULES[self.rule](model.layout, self.widths[k - 1], round, gen)
        net = CompactResNet(model.layout, widthfl.group_widths(model.layout, groups))
        sel = widthfl.group_selection(model.layout, groups)
        return net, sel, sel


@dataclass
class SltDevice(DeviceModel):
    """SLT: the configuration of the round's step; sub-model k's budget is width ``budgets[k-1]``
    (the tightest one plans the steps, looser ones freeze fewer layers, Eq. 7)."""

    budgets: Sequence[float]
    total_rounds: int
    batch: int = 32

    def __post_init__(self) -> None:
        layout_s = min(self.budgets)
        self._s = layout_s
        self._plans: dict[int, tuple[list[slt_mod.Config], list[int]]] = {}

    def plan(self, model: NestedNet) -> tuple[list[slt_mod.Config], list[int]]:
        key = id(model.layout)
        if key not in self._plans:
            configs = slt_mod.plan(model.layout, self._s, self.batch)
            self._plans[key] = (configs, slt_mod.schedule(model.layout, configs, self._s, self.total_rounds))
        return self._plans[key]

    def config(self, model: NestedNet, k: int, round: int) -> slt_mod.Config:
        configs, rounds = self.plan(model)
        n = slt_mod.step_at(round, rounds)
        cfg = slt_mod.Config(0, 0, self._s) if n == 0 else configs[n - 1]
        if n > 0:
            budget = slt_mod.budget_bytes(model.layout, self.budgets[k - 1], self.batch)
            cfg = slt_mod.Config(slt_mod.min_frozen(model.layout, cfg, budget, self.batch), cfg.trained, cfg.s)
        return cfg

    def choose(self, model: NestedNet, client: Client, k: int, round: int, gen: torch.Generator) -> DeviceChoice:
        cfg = self.config(model, k, round)
        load, upload = slt_mod.slt_selection(model.layout, cfg)
        return slt_mod.slt_compact(model.layout, cfg), load, upload


class SubsetTrainer(LocalSGD):
    """Local SGD on a compact sub-network; writes the uploaded slices back into the working model."""

    def __init__(self, device: DeviceModel, **settings) -> None:
        super().__init__(**settings)
        self.device = device
        self.uploads: dict[int, Selection] = {}

    def setup(self, model: NestedNet, clients: list[Client]) -> None:
        self.uploads = {}

    def _optimizer(self, net: CompactResNet, lr: float) -> torch.optim.SGD:
        params = [p for p in net.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def train(self, model: NestedNet, client: Client, exit: int, round: int, gen: torch.Generator) -> dict:
        lr = self.lr_at(round)
        state = model.state_dict()  # shares storage with the working model: scatter_ updates it
        upload_all: Selection = {}
        choice: DeviceChoice | None = None
        total = 0.0
        for step, idx in enumerate(batch_indices(client.size, self.batch_size, self.steps, gen)):
            if choice is None or self.device.per_batch:
                choice = self.device.choose(model, client, exit, round, gen)
                net, load, upload = choice
                net.load_state_dict(gather(state, load))
                net.train()
                opt = self._optimizer(net, lr)
            xb, yb = client.x[idx], client.y[idx]
            if self.augment:
                xb = augment_batch(xb, gen, **self.augment)
            loss = F.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += finite_loss(loss, lr)
            if self.device.per_batch or step == self.steps - 1:
                compact = net.state_dict()
                scatter_(state, compact, upload)
                upload_all = merge_upload(upload_all, upload)
        self.uploads[client.index] = upload_all
        return self.round_stats(total, client, lr)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


def merge_upload(uploaded: Selection, selection: Selection) -> Selection:
    """Add a compact selection to a client's upload, keyed by global tensor. Only FjORD uploads
    several (nested prefix) sub-models in a round; the larger slice of a tensor contains the smaller."""
    out = dict(uploaded)
    for gk, idx in selection.values():
        if gk not in out or _size(idx) >= _size(out[gk][1]):
            out[gk] = (gk, idx)
    return out


def _size(idx: tuple) -> float:
    return float(np.prod([len(i) if isinstance(i, Tensor) else (1 if isinstance(i, int) else np.inf) for i in idx]))
