"""``--method NAME`` -> the model and the engine pieces a run trains with; every method, ``cis`` included.

    setup = build_method_setup(config, spec, train, clients, sgd, weights_for, log)
    engine = FederatedEngine(setup.model, clients, setup.chooser, setup.trainer, setup.aggregator, seed=config.seed)

One builder per method family of the registry (:data:`training.methods.registry.FAMILIES`):

    cis         Algorithm 1: the dataset's early-exit CNN, ExitSampler (exits drawn from the sampling
                matrix), ExitSGDTrainer, CisAggregator (training/engine.py)
    early-exit  a ViT (or the CNN, option arch=cnn) and training/methods/setup.py's pieces
    nested      a NestedNet and training/methods/subfl.py's pieces

Options are read from :func:`~training.methods.registry.effective_options`: every default is the schema's.
Inference-aware weighting (the CIS paper's point, for every method where it applies): a client's weight in
the methods' per-entry averages is ``Lambda~_e(t) * |S_i|``, ``e`` the exit (sub-model) it trained,
``Lambda~`` the ``--strategy`` weights; ``--strategy equal`` gives back the papers' ``|S_i|`` weighting.
FLAME is the exception: every client trains the full model, and ``flame_aggregation`` sets its weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cis.errors import CisError
from training.architectures import build_model
from training.engine import AuthorsCodeAggregator, CisAggregator, ExitSampler
from training.flops import exit_costs
from training.local import ExitSGDTrainer
from training.methods.registry import NESTED_METHODS, effective_options, family_of
from training.models import EarlyExitNet, default_model_config
from training.sampling import sampling_matrix


@dataclass
class MethodSetup:
    model: EarlyExitNet
    chooser: Any
    trainer: Any
    aggregator: Any
    matrix: np.ndarray  # the exit (sub-model) each node trains, as a sampling matrix
    weights: Any  # training.strategies.Weights


WeightsFor = Callable[[Any, np.ndarray], Any]
"""(model, matrix) -> Weights: the run's ``--strategy`` weights for this model."""


def method_model(config, num_exits: int, train) -> EarlyExitNet:
    """The model a method trains for a dataset (shape and classes from the data), ``num_exits`` exits."""
    opts = effective_options(config.method, config.options)
    torch.manual_seed(config.seed)
    in_channels, size = int(train.x.shape[1]), int(train.x.shape[2])
    if config.method == "cis":
        return build_model(
            {**default_model_config(config.dataset_name, config.width), "num_classes": train.num_classes}
        )
    if config.method in NESTED_METHODS:
        from training.methods.resnet import LAYOUTS
        from training.methods.subfl import subset_model

        if opts["gammas"] is not None and len(opts["gammas"]) != num_exits:
            raise CisError(
                f"option gammas: {len(opts['gammas'])} values; expected one parameter ratio per sub-model (E "
                f"= {num_exits})"
            )
        base = LAYOUTS[opts["layout"] or ("digits" if config.dataset_name == "digits" else "resnet20")]
        layout = dataclasses.replace(
            base, in_channels=in_channels, input_size=size, num_classes=train.num_classes,
            channels=tuple(max(2, round(c * config.width)) for c in base.channels),
        )
        return subset_model(
            config.method, layout, num_exits, opts["gammas"], opts["nefl_mode"], opts["nefl_init"], opts["learn_steps"],
            opts["static_bn"],
        )
    from training.methods.setup import method_model_config

    if opts["arch"] == "cnn":
        base = default_model_config(config.dataset_name, config.width)
        base.update(num_classes=train.num_classes, in_channels=in_channels, input_size=size)
        if len(base["exits"]) != num_exits:
            raise CisError(
                f"option arch=cnn: the {base['arch']} model has {len(base['exits'])} exits; the spec has {num_exits}"
            )
    else:
        base = _vit_config(config, opts, num_exits, train.num_classes, in_channels, size)
    return build_model(method_model_config(config.method, base))


def _vit_config(config, opts: dict[str, Any], num_exits: int, classes: int, in_channels: int, size: int) -> dict:
    """The early-exit ViT of a dataset; the options left at None take the dataset's sizes."""
    digits = config.dataset_name == "digits"
    heads = opts["heads"]
    dim = opts["dim"] or (32 if digits else 64)
    dim = max(heads, round(dim * config.width / heads) * heads)
    depth = opts["depth"] or (3 if digits else 6)
    exits = opts["vit_exits"] or [round(depth * k / num_exits) for k in range(1, num_exits + 1)]
    if len(exits) != num_exits or len(set(exits)) != num_exits or min(exits) < 1:
        raise CisError(
            f"ViT: {num_exits} exits in {depth} blocks; expected depth >= {num_exits} or option vit_exits "
            f"with {num_exits} blocks"
        )
    base = {
        "arch": "vit", "exits": list(exits), "num_classes": classes, "in_channels": in_channels,
        "input_size": size, "patch": opts["patch"] or (2 if digits else 4), "dim": dim, "depth": depth,
        "heads": heads, "mlp_ratio": opts["mlp_ratio"],
    }
    if config.method == "reefl":
        base["modulation"] = bool(opts["modulation"])
    return base


def build_method_setup(
    config, spec, train, clients, sgd: dict, weights_for: WeightsFor, log: Callable[[str], None]
) -> MethodSetup:
    """Model and engine pieces of ``config.method`` for the spec's nodes (``clients``)."""
    builder = BUILDERS[family_of(config.method)]
    try:
        model = method_model(config, spec.num_exits, train)
        if config.method == "cis" and model.num_exits != spec.num_exits:
            raise CisError(
                f"spec {spec.name!r}: has {spec.num_exits} exits; the {model.arch} model has {model.num_exits}"
            )
        return builder(config, spec, model, clients, sgd, weights_for, log)
    except ValueError as exc:  # the methods' own checks of user input
        raise CisError(f"--method {config.method}: {exc}") from None


def _cis(config, spec, model, clients, sgd, weights_for, log) -> MethodSetup:
    """Algorithm 1: each node draws an exit from its row of the sampling matrix; CisAggregator applies line 12."""
    matrix = sampling_matrix([n.exit for n in spec.nodes], spec.num_exits, config.p, config.p_rule, config.p_matrix)
    weights = weights_for(model, matrix)
    sampler = ExitSampler(matrix, config.participation)
    sizes = [c.size for c in clients]
    if config.algorithm == "authors-code":
        aggregator = AuthorsCodeAggregator(
            weights, matrix, sizes, root_index(spec), model.exit_state_keys, config.server_lr
        )
    else:
        aggregator = CisAggregator(
            weights, matrix, sizes, sampler.inclusion, config.p_mode, config.server_lr,
            config.coefficient_rule, config.bn_rule,
        )
    exit_flops = [c["flops"] for c in exit_costs(model)] if config.lower_exit_steps == "flops" else None
    return MethodSetup(model, sampler, ExitSGDTrainer(exit_flops=exit_flops, **sgd), aggregator, matrix, weights)


def root_index(spec) -> int:
    """The index of the node without a parent: the one whose model the authors' code aggregates into."""
    roots = [k for k, n in enumerate(spec.nodes) if n.parent is None]
    if len(roots) != 1:
        raise CisError(
            f"spec {spec.name!r}: {len(roots)} nodes without a parent; algorithm 'authors-code' aggregates into "
            "the one root's model"
        )
    return roots[0]


def _early_exit(config, spec, model, clients, sgd, weights_for, log) -> MethodSetup:
    from training.methods.setup import build_method

    opts = effective_options(config.method, config.options)
    E = model.num_exits
    flame = config.method == "flame"
    matrix = sampling_matrix([E if flame else c.max_exit for c in clients], E, 0.0)
    weights = weights_for(model, matrix)
    if flame:
        log(f"flame: the {opts['flame_aggregation']!r} aggregation rule sets the clients' weights; "
            f"--strategy {config.strategy} is recorded but not applied")
    pieces = build_method(config.method, model, clients, sgd, opts, config.participation, None if flame else weights)
    return MethodSetup(model, *pieces, matrix, weights)


def _nested(config, spec, model, clients, sgd, weights_for, log) -> MethodSetup:
    from training.methods.subfl import build_subset_method, nefl_tiers, tier_matrix

    opts = effective_options(config.method, config.options)
    E = model.num_exits
    allowed = None
    if opts["tiers"] == "dynamic":
        allowed = nefl_tiers([c.max_exit for c in clients], E, opts["tier_spread"])
    budgets = opts["budgets"]
    if budgets is not None and len(budgets) != E:
        raise CisError(f"option budgets: {len(budgets)} values; expected one channel keep-ratio per tier (E = {E})")
    matrix = tier_matrix(allowed or [[c.max_exit] for c in clients], E)
    weights = weights_for(model, matrix)
    chooser, trainer, aggregator = build_subset_method(
        config.method, model, clients, sgd, config.participation, allowed, budgets,
        weight=lambda c, k, t: float(weights.at(t)[k - 1]) * c.size,  # nodes serving more requests weigh more
    )
    if config.method == "slt":
        trainer.device.plan(model)  # a budget the planner cannot meet fails now, not in round 1
    return MethodSetup(model, chooser, trainer, aggregator, matrix, weights)


BUILDERS = {"cis": _cis, "early-exit": _early_exit, "nested": _nested}
