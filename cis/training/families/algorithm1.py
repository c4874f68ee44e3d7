"""The builder of Algorithm 1 (``--method cis``): the dataset's early-exit CNN and line 12.

    record = model_config(config, options, num_exits, train)   # digits-cnn or resnet18 (a user's: --model)
    setup = build_pieces(config, spec, model, clients, sgd, options, weights_for, log)

Each node draws an exit from its row of the sampling matrix (:class:`cis.training.federated.ExitSampler`, line 3),
trains it with :class:`cis.training.local.ExitSGDTrainer`, and
:class:`~cis.training.aggregation.aggregators.CisAggregator`
applies line 12 (``--algorithm authors-code``: :class:`~cis.training.aggregation.aggregators.AuthorsCodeAggregator`,
into the root's model).
"""

from __future__ import annotations

from typing import Any

from cis.core.errors import CisError
from cis.training.aggregation.aggregators import AuthorsCodeAggregator, CisAggregator
from cis.training.data.loading import image_family
from cis.training.federated import ExitSampler, MethodSetup
from cis.training.local import Client, ExitSGDTrainer
from cis.training.models.cnns import default_model_config
from cis.training.models.contract import EarlyExitNet
from cis.training.models.flops import exit_costs
from cis.training.sampling import sampling_matrix


def model_config(config, options: dict[str, Any] | None, num_exits: int, train) -> dict[str, Any]:
    """The config of the dataset's early-exit CNN at ``config.width`` (its exits are fixed: the spec must match
    them); the user's images get the CNN of the built-in data set their size suits
    (:func:`cis.training.data.loading.image_family`). ``cis.training.models.model_ref.build_model`` builds it."""
    config_ = default_model_config(image_family(config.dataset_name, train.input_shape), config.width)
    channels, size = train.input_shape[0], train.input_shape[1]
    return {**config_, "num_classes": train.num_classes, "in_channels": channels, "input_size": size}


def build_pieces(config, spec, model: EarlyExitNet, clients: list[Client], sgd: dict, options: dict[str, Any] | None,
                 weights_for, log) -> MethodSetup:
    """The sampling matrix of ``--p``, the ExitSampler, the ExitSGDTrainer and line 12's aggregator."""
    if model.num_exits != spec.num_exits:
        raise CisError(
            f"spec {spec.name!r}: has {spec.num_exits} exits; the {model.config().get('arch', 'given')} model has "
            f"{model.num_exits}"
        )
    matrix = sampling_matrix([n.exit for n in spec.nodes], spec.num_exits, config.p, config.p_rule, config.p_matrix)
    weights = weights_for(model, matrix)
    sampler = ExitSampler(matrix, config.participation)
    sizes = [c.size for c in clients]
    if config.algorithm == "authors-code":
        aggregator: CisAggregator | AuthorsCodeAggregator = AuthorsCodeAggregator(
            weights, matrix, sizes, root_index(spec), model.exit_state_keys, config.server_lr, config.head_update
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
