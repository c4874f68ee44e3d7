"""The ``--strategy`` aggregation weights Lambda~ of a run (every method's, and ``--centralised``'s loss weights)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from cis.core.errors import CisError
from cis.core.rates import compute_rates
from cis.core.spec import CisSpec
from cis.training.aggregation.weights import Weights, make_weights
from cis.training.config import SIGMA_STRATEGIES, RunConfig
from cis.training.grad_variance import gradient_variance
from cis.training.models.contract import EarlyExitNet
from cis.training.models.flops import exit_costs


def run_weights(
    config: RunConfig,
    spec: CisSpec,
    model: EarlyExitNet,
    matrix: np.ndarray,
    sizes: list[int],
    train,
    log: Callable[[str], None],
) -> Weights:
    """The ``--strategy`` aggregation weights Lambda~ for this model and sampling matrix."""
    lam = config.exit_rates or [compute_rates(spec).exit_serving_rate[e] for e in range(1, spec.num_exits + 1)]
    if len(lam) != spec.num_exits:
        raise CisError(f"config: exit_rates has {len(lam)} values; spec {spec.name!r} has {spec.num_exits} exits")
    sigma = config.sigma
    needs_sigma = config.strategy in SIGMA_STRATEGIES
    if sigma is not None and len(sigma) != spec.num_exits:
        raise CisError(f"config: sigma has {len(sigma)} values; strategy {config.strategy!r} takes one gradient std "
                       f"per exit, and spec {spec.name!r} has {spec.num_exits} exits")
    authors = config.algorithm == "authors-code"
    if needs_sigma and sigma is None and authors:
        sigma = appendix_c_sigma(model)
        log(
            f"{config.strategy} (authors-code): "
            + (
                "the Appendix-C constants " + ", ".join(map(str, sigma))
                if sigma
                else "exits not after conv layers 3, 9, 17 (or 9, 13, 17) of ResNet-18: sigma measured"
            )
        )
    if needs_sigma and sigma is None:
        sigma = measured_sigma(config, model, train, log)
    flops = [c["flops"] for c in exit_costs(model)] if config.strategy in ("flops", "auto") else None
    return make_weights(
        config.strategy,
        spec.num_exits,
        total_rounds=cast(int, config.rounds),  # resolved() set it
        exit_serving_rate=lam,
        flops=flops,
        sigma=sigma,
        matrix=matrix,
        sizes=sizes,
        vector=config.weights,
        balanced_rule=config.algorithm,
        node_exits=[n.exit for n in spec.nodes],
    )


def measured_sigma(config: RunConfig, model: EarlyExitNet, train, log: Callable[[str], None]) -> list[float]:
    """sigma_e measured on the initial model (Appendix C), for the strategy's one line where it cannot be."""
    if not model_has_exit_gradients(model):
        raise CisError(
            f"--strategy {config.strategy}: method {config.method!r} trains nested sub-models, whose per-exit "
            "gradient variance cannot be measured on one shared graph; give 'sigma' in the config file or pick "
            "another strategy"
        )
    batch = cast(int, config.batch_size)  # resolved() set it
    try:
        var = gradient_variance(model, train.x, train.y, batch, config.sigma_batches, config.seed,
                                f"--strategy {config.strategy}: the per-exit gradient variance (Appendix C)")
    except CisError as exc:
        raise CisError(f"{exc} (or give 'sigma' in the config file)") from None
    log("gradient variance per exit (Appendix C): " + ", ".join(f"{v:.3g}" for v in var))
    return [float(np.sqrt(v)) for v in var]


def appendix_c_sigma(model: EarlyExitNet) -> list[float] | None:
    """The authors' hard-coded sigma_e for a ResNet-18 whose exits sit where theirs do, else None."""
    from cis.training.aggregation.weights import APPENDIX_C_SIGMA

    cfg = model.config()
    found = APPENDIX_C_SIGMA.get(tuple(cfg.get("exits", ()))) if cfg.get("arch") == "resnet18" else None
    return list(found) if found else None


def model_has_exit_gradients(model: EarlyExitNet) -> bool:
    """False for nested models, whose forward runs detached copies of the sub-models."""
    return not hasattr(model, "submodel")
