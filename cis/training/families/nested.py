"""The builder of the nested methods (NeFL, SLT, HeteroFL, FjORD, FedRolex, FD, small model).

    record = model_config(config, options, num_exits, train)   # the NestedNet server model's config
    setup = build_pieces(config, spec, model, clients, sgd, options, weights_for, log)

The server model is a :class:`~cis.training.methods.nested.NestedNet` over a residual layout
(:mod:`cis.training.methods.resnet`); each node trains its tier's sub-model (or, with dynamic tiers, one of
the smaller ones) through a :class:`~cis.training.methods.subfl.DeviceModel` rule and the
:class:`~cis.training.methods.subfl.SubsetTrainer`; the engine's ``ExitSampler`` draws the sub-model from
:func:`tier_matrix`, and :class:`~cis.training.aggregation.aggregators.SubsetAggregator` averages the
uploaded slices, a node's weight ``Lambda~_k(t) |S_i|`` (nodes serving more requests weigh more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from cis.core.errors import CisError
from cis.training.aggregation.aggregators import SubsetAggregator
from cis.training.federated import ExitSampler, MethodSetup
from cis.training.local import Client
from cis.training.methods.nested import NestedNet, nefl_specs
from cis.training.methods.registry import NESTED_METHODS, OPTIONS, check_square_images
from cis.training.methods.resnet import LAYOUTS, ResNetLayout
from cis.training.methods.static_bn import mark_stale_
from cis.training.methods.subfl import DeviceModel, FjordDevice, GroupDevice, NestedDevice, SltDevice, SubsetTrainer
from cis.training.models.model_ref import build_model


def model_config(config, options: dict[str, Any], num_exits: int, train) -> dict[str, Any]:
    """The config of ``config.method``'s server model on the dataset's layout, scaled by ``config.width``
    (``cis.training.models.model_ref.build_model`` builds it)."""
    if options["gammas"] is not None and len(options["gammas"]) != num_exits:
        raise CisError(
            f"option gammas: {len(options['gammas'])} values; expected one parameter ratio per sub-model (E "
            f"= {num_exits})"
        )
    check_square_images(train.input_shape, config.method)
    base = LAYOUTS[options["layout"] or ("digits" if config.dataset_name == "digits" else "resnet20")]
    layout = dataclasses.replace(
        base, in_channels=int(train.x.shape[1]), input_size=int(train.x.shape[2]), num_classes=train.num_classes,
        channels=tuple(max(2, round(c * config.width)) for c in base.channels),
    )
    return subset_config(
        config.method, layout, num_exits, options["gammas"], options["nefl_mode"], options["nefl_init"],
        options["learn_steps"], options["static_bn"],
    )


def build_pieces(config, spec, model: NestedNet, clients: list[Client], sgd: dict, options: dict[str, Any],
                 weights_for, log) -> MethodSetup:
    """Each node's tiers, the sampling matrix over them, and the chooser, trainer and aggregator."""
    E = model.num_exits
    allowed = None
    if options["tiers"] == "dynamic":
        allowed = nefl_tiers([c.max_exit for c in clients], E, options["tier_spread"])
    budgets = options["budgets"]
    if budgets is not None and len(budgets) != E:
        raise CisError(f"option budgets: {len(budgets)} values; expected one channel keep-ratio per tier (E = {E})")
    matrix = tier_matrix(allowed or [[c.max_exit] for c in clients], E)
    weights = weights_for(model, matrix)
    chooser, trainer, aggregator = build_subset_method(
        config.method, model, clients, sgd, config.participation, allowed, budgets,
        weight=lambda c, k, t: float(weights.at(t)[k - 1]) * c.size,  # nodes serving more requests weigh more
    )
    if config.method == "slt":
        # device_model gives slt an SltDevice; a budget the planner cannot meet fails now, not in round 1
        cast(SltDevice, trainer.device).plan(model)
    return MethodSetup(model, chooser, trainer, aggregator, matrix, weights)


def default_gammas(num_submodels: int) -> list[float]:
    """Parameter ratios k / E of sub-models k = 1..E (NeFL's 0.2, 0.4, .., 1 for E = 5)."""
    return [k / num_submodels for k in range(1, num_submodels + 1)]


def subset_config(
    method: str,
    layout: ResNetLayout,
    num_submodels: int,
    gammas: Sequence[float] | None = None,
    mode: str = OPTIONS["nefl_mode"].default,
    init: str = OPTIONS["nefl_init"].default,
    learn_steps: bool = OPTIONS["learn_steps"].default,
    static_bn: bool = OPTIONS["static_bn"].default,
) -> dict[str, Any]:
    """The config (``NestedNet.config()``) of the server model a method trains; its sub-models 1..E are what
    the CIS tiers serve. ``static_bn`` applies to heterofl only (its static BatchNorm,
    :mod:`cis.training.methods.static_bn`)."""
    if method not in NESTED_METHODS:
        raise ValueError(f"method {method!r}: expected one of {NESTED_METHODS}")
    gammas = list(gammas or default_gammas(num_submodels))
    if method == "nefl":
        specs, decoupled, steps = nefl_specs(layout, gammas, mode, init), True, True
    else:
        if method == "small":
            gammas = [min(gammas)] * len(gammas)
        specs, decoupled, steps = nefl_specs(layout, gammas, "W"), method == "fjord", False
        learn_steps = True
    return {
        "arch": NestedNet.arch, "layout": layout.to_json(), "specs": [s.to_json() for s in specs],
        "decoupled_bn": decoupled, "use_steps": steps, "learn_steps": bool(learn_steps),
        "static_bn": bool(static_bn and method == "heterofl"),
    }


def subset_model(method: str, layout: ResNetLayout, num_submodels: int, *args: Any, **kwargs: Any) -> NestedNet:
    """The server model of :func:`subset_config` (same arguments), built through the reference path."""
    model = build_model(subset_config(method, layout, num_submodels, *args, **kwargs))
    assert isinstance(model, NestedNet)
    return model


def device_model(method: str, model: NestedNet, sgd: dict, budgets: Sequence[float]) -> DeviceModel:
    """What a device of ``method`` trains as sub-model k (``budgets``: the channel keep-ratio s per tier)."""
    if method in ("nefl", "heterofl", "small"):
        return NestedDevice()
    if method == "fjord":
        return FjordDevice()
    if method in ("fedrolex", "fd"):
        return GroupDevice("rolling" if method == "fedrolex" else "random", budgets)
    if method == "slt":
        return SltDevice(budgets, int(sgd["total_rounds"]), int(sgd["batch_size"]))
    raise ValueError(f"method {method!r}: expected one of {NESTED_METHODS}")


def build_subset_method(
    method: str,
    model: NestedNet,
    clients: list[Client],
    sgd: dict,
    participation: float = 1.0,
    allowed: Sequence[Sequence[int]] | None = None,
    budgets: Sequence[float] | None = None,
    weight: Callable[[Client, int, int], float] | None = None,
) -> tuple[ExitSampler, SubsetTrainer, SubsetAggregator]:
    """(chooser, trainer, aggregator) for the engine. ``allowed[i]``: sub-models node i may pick
    (default: its own tier, ``Client.max_exit``); ``budgets``: channel keep-ratio s per tier for
    FedRolex / FD / SLT (default: the sub-models' own ratios)."""
    allowed = allowed or [[c.max_exit] for c in clients]
    budgets = list(budgets or [s.channel_ratio for s in model.specs])
    trainer = SubsetTrainer(device_model(method, model, sgd, budgets), **sgd)
    aggregator = SubsetAggregator(trainer, weight, mark_stale_ if model.static_bn else None)
    return ExitSampler(tier_matrix(allowed, model.num_exits), participation), trainer, aggregator


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
