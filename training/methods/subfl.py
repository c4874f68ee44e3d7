"""Sub-model methods as the engine's (chooser, trainer, aggregator).

The engine hands the trainer the working :class:`~training.methods.nested.NestedNet`
loaded with the global weights. :class:`SubsetTrainer` asks its
:class:`DeviceModel` rule what the device trains this round (a compact network,
the selection it loads, the selection it uploads), trains that compact network,
and writes the uploaded pieces back into the working model in place.
:class:`SubsetAggregator` then averages every uploaded element over the clients
that uploaded it (:class:`~training.methods.slicing.SelectionAverage`): NeFedAvg
for nested slices, per-sub-model FedAvg for decoupled BatchNorm and step sizes,
the index-wise average of HeteroFL / FedRolex / FD, and SLT's trained-slices-only average.

A fresh SGD optimizer per client and round (momentum does not carry over, as the
compact network's shape changes between rounds); the learning rate follows the
engine's cosine schedule over rounds. Only one trainer state: none (resume-safe).

"exit" k in the engine's pairs is the sub-model a client trains in that round;
:func:`tier_matrix` turns per-node allowed sub-models (NeFL's tiers, or a fixed
assignment) into the sampling matrix the engine's ``ExitSampler`` draws from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from training.data import augment_batch
from training.local import Client, LocalSGD, batch_indices
from training.methods import slt as slt_mod
from training.methods import widthfl
from training.methods.nested import NestedNet
from training.methods.registry import NESTED_METHODS, OPTIONS
from training.methods.resnet import CompactResNet
from training.methods.slicing import Selection, SelectionAverage, gather, scatter_
from training.methods.static_bn import mark_stale_

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
            total += float(loss.detach())
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


class SubsetAggregator:
    """Element-wise weighted average of the uploaded slices (see :mod:`training.methods.slicing`).
    ``static_bn``: the round's new weights make the per-sub-model statistics stale
    (:mod:`training.methods.static_bn`)."""

    def __init__(
        self,
        trainer: SubsetTrainer,
        weight: Callable[[Client, int, int], float] | None = None,
        static_bn: bool = False,
    ) -> None:
        self.trainer = trainer
        self.weight = weight or (lambda client, k, round: float(client.size))
        self.static_bn = static_bn
        self._avg = SelectionAverage(torch.float64)
        self._global: dict[str, Tensor] = {}
        self._round = 0

    def begin(self, global_state: dict[str, Tensor], round: int, pairs: Sequence[tuple[int, int]]) -> None:
        self._global, self._round = global_state, round

    def add(self, client: Client, exit: int, local_state: dict[str, Tensor]) -> None:
        upload = self.trainer.uploads[client.index]  # keyed by global tensor
        self._avg.add_selection(
            self._global, gather(local_state, upload), upload, self.weight(client, exit, self._round)
        )

    def finish(self, global_state: dict[str, Tensor]) -> None:
        self._avg.write(global_state)
        if self.static_bn:
            mark_stale_(global_state)


def tier_matrix(allowed: Sequence[Sequence[int]], num_submodels: int) -> np.ndarray:
    """Row i uniform over node i's allowed sub-models (NeFL B.5 tiers; a single entry = fixed assignment)."""
    m = np.zeros((len(allowed), num_submodels))
    for i, ks in enumerate(allowed):
        for k in ks:
            m[i, k - 1] = 1.0 / len(ks)
    return m


def nefl_tiers(max_exits: Sequence[int], num_submodels: int, spread: int = 1) -> list[list[int]]:
    """Dynamic tiers: a node whose largest exit is E_i picks among sub-models E_i - spread .. E_i."""
    return [list(range(max(1, e - spread), e + 1)) for e in max_exits]




def default_gammas(num_submodels: int) -> list[float]:
    """Parameter ratios k / E of sub-models k = 1..E (NeFL's 0.2, 0.4, .., 1 for E = 5)."""
    return [k / num_submodels for k in range(1, num_submodels + 1)]


def subset_model(
    method: str,
    layout,
    num_submodels: int,
    gammas: Sequence[float] | None = None,
    mode: str = OPTIONS["nefl_mode"].default,
    init: str = OPTIONS["nefl_init"].default,
    learn_steps: bool = OPTIONS["learn_steps"].default,
    static_bn: bool = OPTIONS["static_bn"].default,
) -> NestedNet:
    """The server model a method trains; its sub-models 1..E are what the CIS tiers serve.
    ``static_bn`` applies to heterofl only (its static BatchNorm, :mod:`training.methods.static_bn`)."""
    from training.methods.nested import nefl_specs

    if method not in NESTED_METHODS:
        raise ValueError(f"method {method!r}: expected one of {NESTED_METHODS}")
    gammas = list(gammas or default_gammas(num_submodels))
    if method == "nefl":
        return NestedNet(
            layout, nefl_specs(layout, gammas, mode, init), decoupled_bn=True, use_steps=True, learn_steps=learn_steps
        )
    if method == "small":
        gammas = [min(gammas)] * len(gammas)
    return NestedNet(
        layout, nefl_specs(layout, gammas, "W"), decoupled_bn=method == "fjord", use_steps=False,
        static_bn=static_bn and method == "heterofl",
    )


def build_subset_method(
    method: str,
    model: NestedNet,
    clients: list[Client],
    sgd: dict,
    participation: float = 1.0,
    allowed: Sequence[Sequence[int]] | None = None,
    budgets: Sequence[float] | None = None,
    weight: Callable[[Client, int, int], float] | None = None,
):
    """(chooser, trainer, aggregator) for the engine. ``allowed[i]``: sub-models node i may pick
    (default: its own tier, ``Client.max_exit``); ``budgets``: channel keep-ratio s per tier for
    FedRolex / FD / SLT (default: the sub-models' own ratios)."""
    from training.engine import ExitSampler

    E = model.num_exits
    allowed = allowed or [[c.max_exit] for c in clients]
    budgets = list(budgets or [s.channel_ratio for s in model.specs])
    if method in ("nefl", "heterofl", "small"):
        device: DeviceModel = NestedDevice()
    elif method == "fjord":
        device = FjordDevice()
    elif method in ("fedrolex", "fd"):
        device = GroupDevice("rolling" if method == "fedrolex" else "random", budgets)
    elif method == "slt":
        device = SltDevice(budgets, int(sgd["total_rounds"]), int(sgd["batch_size"]))
    else:
        raise ValueError(f"method {method!r}: expected one of {NESTED_METHODS}")
    trainer = SubsetTrainer(device, **sgd)
    aggregator = SubsetAggregator(trainer, weight, static_bn=model.static_bn)
    return ExitSampler(tier_matrix(allowed, E), participation), trainer, aggregator
