"""The builder of the early-exit methods (ReeFL, DepthFL, InclusiveFL, ExclusiveFL, ScaleFL, FLAME).

    record = model_config(config, options, num_exits, train)   # a ViT (or the dataset's CNN, option arch=cnn)
    setup = build_pieces(config, spec, model, clients, sgd, options, weights_for, log)

or, for code and tests, the two steps apart:

    model = build_model(method_model_config("reefl", {"arch": "vit", "exits": [2, 4, 6]}))   #
    cis.training.models.model_ref
    chooser, trainer, aggregator = build_method("reefl", model, clients, sgd, method_options("reefl"))

``options`` are the method's options with every default filled
(:func:`cis.training.methods.registry.method_options` / ``effective_options``: the defaults
live there only). ``sgd`` holds the keyword arguments of
:class:`cis.training.local.ExitSGDTrainer` (lr, momentum, weight_decay, batch_size, steps,
total_rounds, schedule, augment). A client's budget is ``Client.max_exit`` (the spec
node's exit; round-robin in the ReeFL setup, :func:`cis.training.methods.baselines.round_robin_budgets`).
``weights``: the run's inference-aware Lambda~ (a client's weight Lambda~_e(t) |S_i|;
None: |S_i|, the papers' own weighting); FLAME's aggregation rule sets its own weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from cis.core.errors import CisError
from cis.training.aggregation.aggregators import MaskedAggregator
from cis.training.aggregation.averages import (
    exit_based_term,
    exit_conscious_term,
    fedavg_term,
    held_term,
    patience_term,
)
from cis.training.aggregation.weights import Weights
from cis.training.data.loading import image_family
from cis.training.federated import MethodSetup
from cis.training.local import Client, ExitSGDTrainer
from cis.training.methods import baselines as bl
from cis.training.methods.registry import (
    EARLY_EXIT_METHODS,
    FLAME_AGGREGATIONS,
    FLAME_ALIASES,
    FLAME_SETTING_A,
    check_square_images,
)
from cis.training.methods.vit import ViTEE
from cis.training.models.cnns import default_model_config
from cis.training.models.contract import EarlyExitNet
from cis.training.models.flops import exit_costs
from cis.training.sampling import sampling_matrix


def model_config(config, options: dict[str, Any], num_exits: int, train) -> dict[str, Any]:
    """The config of the method's model for the dataset: the ViT of :func:`vit_config`, or the dataset's CNN
    (option arch=cnn); ``cis.training.models.model_ref.build_model`` builds it."""
    check_square_images(train.input_shape, config.method)
    in_channels, size = int(train.x.shape[1]), int(train.x.shape[2])
    if options["arch"] == "cnn":
        base = default_model_config(image_family(config.dataset_name, train.input_shape), config.width)
        base.update(num_classes=train.num_classes, in_channels=in_channels, input_size=size)
        if len(base["exits"]) != num_exits:
            raise CisError(
                f"option arch=cnn: the {base['arch']} model has {len(base['exits'])} exits; the spec has {num_exits}"
            )
    else:
        base = vit_config(config, options, num_exits, train.num_classes, in_channels, size)
    return method_model_config(config.method, base)


def vit_config(config, opts: dict[str, Any], num_exits: int, classes: int, in_channels: int, size: int) -> dict:
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


def build_pieces(config, spec, model: EarlyExitNet, clients: list[Client], sgd: dict, options: dict[str, Any],
                 weights_for, log) -> MethodSetup:
    """Each client trains its largest exit; the weights Lambda~ scale its term, except under FLAME."""
    E = model.num_exits
    flame = config.method == "flame"
    matrix = sampling_matrix([E if flame else c.max_exit for c in clients], E, 0.0)
    weights = weights_for(model, matrix)
    if config.method == "exclusivefl":  # its only trained exit at weight 0 trains nothing: refused
        bl.check_exclusive_weights(weights, E, config.rounds)
    if flame:
        log(f"flame: the {options['flame_aggregation']!r} aggregation rule sets the clients' weights; "
            f"--strategy {config.strategy} is recorded but not applied")
    pieces = build_method(config.method, model, clients, sgd, options, config.participation, None if flame else weights)
    return MethodSetup(model, *pieces, matrix, weights)


def method_model_config(method: str, base: dict[str, Any]) -> dict[str, Any]:
    """The model config a method trains: ReeFL swaps the per-exit heads for Ree; the rest keep them."""
    _check(method)
    if method == "reefl":
        return {**base, "arch": ViTEE.arch, "head": "ree"}
    if base.get("arch") == ViTEE.arch:
        return {**base, "head": "exit"}
    return dict(base)


def build_method(
    method: str,
    model: EarlyExitNet,
    clients: list[Client],
    sgd: dict[str, Any],
    options: Mapping[str, Any],
    participation: float = 1.0,
    weights: Weights | None = None,
) -> tuple[bl.BudgetChooser, Any, MaskedAggregator]:
    """(chooser, trainer, aggregator) of an early-exit method; ``options`` with every default filled."""
    _check(method)
    budgets = [c.max_exit for c in clients]
    E = model.num_exits
    chooser = bl.BudgetChooser(budgets, participation)
    held = lambda c, e, size: held_term(size, e)  # noqa: E731
    clip = options["clip_value"]
    if method in ("reefl", "depthfl"):
        loss = method if options["distill"] else "all"
        trainer = bl.MultiExitTrainer(loss=loss, clip_value=clip, ramp_rounds=options["kd_ramp_rounds"], **sgd)
        return chooser, trainer, MaskedAggregator(held, weights)
    if method == "exclusivefl":
        chooser = bl.BudgetChooser(budgets, participation, only_exit=E)
        return chooser, bl.MultiExitTrainer(loss="all", clip_value=clip, **sgd), MaskedAggregator(held, weights)
    if method == "inclusivefl":
        exits = model.config()["exits"]
        aggregator = MaskedAggregator(
            held, weights, bl.INCLUSIVEFL_BETA, bl.block_prefixes(model), bl.exit_boundary_blocks(exits)
        )
        return chooser, ExitSGDTrainer(**sgd), aggregator
    if method == "scalefl":
        widths = bl.scalefl_widths(E)
        trainer = bl.MultiExitTrainer(
            loss="scalefl", distill_weight=bl.SCALEFL_KD_WEIGHT, tau=bl.SCALEFL_TAU, widths=widths, **sgd
        )
        vit = cast(ViTEE, model)  # ScaleFL trains its own ViT (no arch option, no user model)
        sliced = lambda c, e, size: (float(size), bl.width_holds(vit, e, widths[e - 1]))  # noqa: E731
        return chooser, trainer, MaskedAggregator(sliced, weights)
    return _flame(model, clients, sgd, options, participation)


def _flame(model: EarlyExitNet, clients: list[Client], sgd: dict[str, Any], options: Mapping[str, Any],
           participation: float) -> tuple[bl.BudgetChooser, Any, MaskedAggregator]:
    rule = dict(FLAME_ALIASES).get(options["flame_aggregation"], options["flame_aggregation"])
    if rule not in FLAME_AGGREGATIONS:
        raise ValueError(f"FLAME aggregation {rule!r}: expected one of {FLAME_AGGREGATIONS}")
    p = list(options["patience"] or FLAME_SETTING_A)
    patience = {c.id: int(p[k % len(p)]) for k, c in enumerate(clients)}
    E = model.num_exits
    chooser = bl.BudgetChooser([E] * len(clients), participation)  # every client runs the full model
    trainer = bl.FlameTrainer(
        patience=patience, forward_flops=[c["flops"] for c in exit_costs(model)], grouping=options["grouping"],
        group_step=options["group_step"], **{**sgd, "optimizer": options["optimizer"]}
    )
    terms = {  # FLAME's rules; weights Lambda~ do not apply
        "fedavg": lambda c, e, size: fedavg_term(size),
        "patience-conscious": lambda c, e, size: patience_term(patience[c.id]),
        "exit-conscious": lambda c, e, size: exit_conscious_term(trainer.last_avg_exit[c.id]),
        "exit-based": lambda c, e, size: exit_based_term(trainer.last_avg_exit[c.id]),
    }
    return chooser, trainer, MaskedAggregator(terms[rule])


def _check(method: str) -> None:
    if method not in EARLY_EXIT_METHODS:
        raise ValueError(f"method {method!r}: expected one of {EARLY_EXIT_METHODS}")
