"""The early-exit methods' engine pieces: ``--method`` -> (chooser, trainer, aggregator).

    model = build_model(method_model_config("reefl", {"arch": "vit", "exits": [2, 4, 6]}))
    chooser, trainer, aggregator = build_method("reefl", model, clients, sgd, method_options("reefl"))
    engine = FederatedEngine(model, clients, chooser, trainer, aggregator, seed=seed)

``options`` are the method's options with every default filled
(:func:`training.methods.registry.method_options` / ``effective_options``: the defaults
live there only). ``sgd`` holds the keyword arguments of
:class:`training.local.ExitSGDTrainer` (lr, momentum, weight_decay, batch_size, steps,
total_rounds, schedule, augment). A client's budget is ``Client.max_exit`` (the spec
node's exit; round-robin in the ReeFL setup, :func:`training.methods.baselines.round_robin_budgets`).
``weights``: the run's inference-aware Lambda~ (a client's weight Lambda~_e(t) |S_i|;
None: |S_i|, the papers' own weighting); FLAME's aggregation rule sets its own weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.local import Client, ExitSGDTrainer
from training.methods import baselines as bl
from training.methods.aggregate import exit_based_term, exit_conscious_term, fedavg_term, held_term, patience_term
from training.methods.registry import EARLY_EXIT_METHODS, FLAME_AGGREGATIONS, FLAME_SETTING_A
from training.methods.vit import ViTEE
from training.models import EarlyExitNet
from training.strategies import Weights


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
):
    _check(method)
    budgets = [c.max_exit for c in clients]
    E = model.num_exits
    chooser = bl.BudgetChooser(budgets, participation)
    held = lambda c, e, size: held_term(size, e)  # noqa: E731
    clip = options["clip_value"]
    if method in ("reefl", "depthfl"):
        loss = method if options["distill"] else "all"
        trainer = bl.MultiExitTrainer(loss=loss, clip_value=clip, ramp_rounds=options["kd_ramp_rounds"], **sgd)
        return chooser, trainer, bl.MaskedAggregator(held, weights)
    if method == "exclusivefl":
        chooser = bl.BudgetChooser(budgets, participation, only_exit=E)
        return chooser, bl.MultiExitTrainer(loss="all", clip_value=clip, **sgd), bl.MaskedAggregator(held, weights)
    if method == "inclusivefl":
        exits = model.config()["exits"]
        aggregator = bl.MaskedAggregator(
            held, weights, bl.INCLUSIVEFL_BETA, bl.block_prefixes(model), bl.exit_boundary_blocks(exits)
        )
        return chooser, ExitSGDTrainer(**sgd), aggregator
    if method == "scalefl":
        widths = bl.scalefl_widths(E)
        trainer = bl.MultiExitTrainer(
            loss="scalefl", distill_weight=bl.SCALEFL_KD_WEIGHT, tau=bl.SCALEFL_TAU, widths=widths, **sgd
        )
        sliced = lambda c, e, size: (float(size), bl.width_holds(model, e, widths[e - 1]))  # noqa: E731
        return chooser, trainer, bl.MaskedAggregator(sliced, weights)
    return _flame(model, clients, sgd, options, participation)


def _flame(model: EarlyExitNet, clients: list[Client], sgd: dict[str, Any], options: Mapping[str, Any],
           participation: float):
    from training.flops import exit_costs

    rule = options["flame_aggregation"]
    if rule not in FLAME_AGGREGATIONS:
        raise ValueError(f"FLAME aggregation {rule!r}: expected one of {FLAME_AGGREGATIONS}")
    p = list(options["patience"] or FLAME_SETTING_A)
    patience = {c.id: int(p[k % len(p)]) for k, c in enumerate(clients)}
    E = model.num_exits
    chooser = bl.BudgetChooser([E] * len(clients), participation)  # every client runs the full model
    trainer = bl.FlameTrainer(
        patience=patience, forward_flops=[c["flops"] for c in exit_costs(model)], grouping=options["grouping"],
        group_step=options["group_step"], optimizer=options["optimizer"], **sgd
    )
    terms = {  # FLAME's rules; weights Lambda~ do not apply
        "fedavg": lambda c, e, size: fedavg_term(size),
        "patience": lambda c, e, size: patience_term(patience[c.id]),
        "exit-conscious": lambda c, e, size: exit_conscious_term(trainer.last_avg_exit[c.id]),
        "exit-based": lambda c, e, size: exit_based_term(trainer.last_avg_exit[c.id]),
    }
    return chooser, trainer, bl.MaskedAggregator(terms[rule])


def _check(method: str) -> None:
    if method not in EARLY_EXIT_METHODS:
        raise ValueError(f"method {method!r}: expected one of {EARLY_EXIT_METHODS}")
