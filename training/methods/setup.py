"""``--method`` -> the engine's (chooser, trainer, aggregator) for a model and its clients.

    model = build_model(method_model_config("reefl", {"arch": "vit", "exits": [2, 4, 6]}))
    chooser, trainer, aggregator = build_method("reefl", model, clients, sgd, MethodOptions())
    engine = FederatedEngine(model, clients, chooser, trainer, aggregator, seed=seed)

``sgd`` holds the keyword arguments of :class:`training.local.ExitSGDTrainer`
(lr, momentum, weight_decay, batch_size, steps, total_rounds, schedule, augment).
A client's budget is ``Client.max_exit`` (the spec node's exit; round-robin in
the ReeFL setup, :func:`training.methods.baselines.round_robin_budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from training.local import Client, ExitSGDTrainer
from training.methods import baselines as bl
from training.methods import flame
from training.methods.aggregate import held_by_exit, holds_all
from training.methods.distill import RAMP_ROUNDS
from training.methods.vit import ViTEE
from training.models import EarlyExitNet

METHODS = ("reefl", "flame", "depthfl", "inclusivefl", "exclusivefl", "scalefl")
FLAME_AGGREGATIONS = ("fedavg", "patience", "exit-conscious", "exit-based")


@dataclass
class MethodOptions:
    participation: float = 1.0
    distill: bool = True  # ReeFL / DepthFL distillation on (the ablation turns it off)
    modulation: bool = True  # ReeFL feature modulation
    patience: Sequence[int] | None = None  # FLAME p_tr per client; default Setting A, cycled
    grouping: str = "exit"
    group_step: str = "share"  # FLAME: each group's step scaled by its share of the batch (flame.py says why)
    optimizer: str = "sgd"  # FLAME: "adamw" is the paper's fine-tuning optimizer
    flame_aggregation: str = "fedavg"
    clip_value: float | None = None  # the ReeFL paper clips gradients by value at 1 (reefl, depthfl, exclusivefl)
    kd_ramp_rounds: int = RAMP_ROUNDS  # the KD weight's ramp R (the notes: 300, of the paper's 1k rounds)


def method_model_config(method: str, base: dict[str, Any]) -> dict[str, Any]:
    """The model config a method trains: ReeFL swaps the per-exit heads for Ree; the rest keep them."""
    _check(method)
    if method == "reefl":
        return {**base, "arch": ViTEE.arch, "head": "ree"}
    if base.get("arch") == ViTEE.arch:
        return {**base, "head": "exit"}
    return dict(base)


def build_method(method: str, model: EarlyExitNet, clients: list[Client], sgd: dict[str, Any], opts: MethodOptions):
    _check(method)
    budgets = [c.max_exit for c in clients]
    E = model.num_exits
    by_size = lambda c, e: float(c.size)  # noqa: E731
    held = lambda c, e: held_by_exit(e)  # noqa: E731
    chooser = bl.BudgetChooser(budgets, opts.participation)
    if method in ("reefl", "depthfl"):
        loss = method if opts.distill else "all"
        trainer = bl.MultiExitTrainer(loss=loss, clip_value=opts.clip_value, ramp_rounds=opts.kd_ramp_rounds, **sgd)
        return chooser, trainer, bl.MaskedAggregator(by_size, held)
    if method == "exclusivefl":
        chooser = bl.BudgetChooser(budgets, opts.participation, only_exit=E)
        return chooser, bl.MultiExitTrainer(loss="all", clip_value=opts.clip_value, **sgd), bl.MaskedAggregator(by_size, held)
    if method == "inclusivefl":
        exits = model.config()["exits"]
        aggregator = bl.MaskedAggregator(
            by_size, held, bl.INCLUSIVEFL_BETA, bl.block_prefixes(model), bl.exit_boundary_blocks(exits)
        )
        return chooser, ExitSGDTrainer(**sgd), aggregator
    if method == "scalefl":
        widths = bl.scalefl_widths(E)
        trainer = bl.MultiExitTrainer(
            loss="scalefl", distill_weight=bl.SCALEFL_KD_WEIGHT, tau=bl.SCALEFL_TAU, widths=widths, **sgd
        )
        return chooser, trainer, bl.MaskedAggregator(by_size, lambda c, e: bl.width_holds(model, e, widths[e - 1]))
    return _flame(model, clients, sgd, opts)


def _flame(model: EarlyExitNet, clients: list[Client], sgd: dict[str, Any], opts: MethodOptions):
    from training.flops import exit_costs

    if opts.flame_aggregation not in FLAME_AGGREGATIONS:
        raise ValueError(f"FLAME aggregation {opts.flame_aggregation!r}: expected one of {FLAME_AGGREGATIONS}")
    p = list(opts.patience or flame.SETTING_A)
    patience = {c.id: int(p[k % len(p)]) for k, c in enumerate(clients)}
    E = model.num_exits
    chooser = bl.BudgetChooser([E] * len(clients), opts.participation)  # every client runs the full model
    trainer = bl.FlameTrainer(
        patience=patience, forward_flops=[c["flops"] for c in exit_costs(model)], grouping=opts.grouping,
        group_step=opts.group_step, optimizer=opts.optimizer, **sgd
    )
    avg_exit = lambda c: trainer.last_avg_exit[c.id]  # noqa: E731
    rule = opts.flame_aggregation
    if rule == "fedavg":
        agg = bl.MaskedAggregator(lambda c, e: float(c.size), lambda c, e: holds_all)
    elif rule == "patience":
        agg = bl.MaskedAggregator(lambda c, e: float(patience[c.id]), lambda c, e: holds_all)
    elif rule == "exit-conscious":
        agg = bl.MaskedAggregator(lambda c, e: avg_exit(c), lambda c, e: holds_all)
    else:
        agg = bl.MaskedAggregator(lambda c, e: 1.0, lambda c, e: held_by_exit(avg_exit(c)))
    return chooser, trainer, agg


def _check(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method {method!r}: expected one of {METHODS}")
