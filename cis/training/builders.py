"""``--method NAME`` (and ``--model``) -> the model and the engine pieces a run trains with; every method, ``cis``
included.

    setup = build_method_setup(config, spec, train, clients, sgd, weights_for, log)
    engine = FederatedEngine(setup.model, clients, setup.chooser, setup.trainer, setup.aggregator, seed=config.seed)

The model comes one way (cis/training/models/model_ref.py): ``--model PATH.py:FACTORY | pkg.module:FACTORY`` where the
method takes a user's model (:data:`cis.training.methods.registry.USER_MODEL_METHODS`), else the config of the
method family's built-in architecture (its builder's ``model_config``); either is built by
:func:`cis.training.models.model_ref.build_model`. ``--weights FILE`` then loads starting weights
(cis/training/weights_file.py), and one small batch of training data runs through every body and head
(:func:`cis.training.models.contract.check_chain`) before anything trains. The family's builder (cis/training/families/,
:data:`BUILDERS`) builds the engine's pieces on that model.

Inference-aware weighting (the CIS paper's point, for every method where it applies): a client's weight in
the methods' per-entry averages is ``Lambda~_e(t) * |S_i|``, ``e`` the exit (sub-model) it trained,
``Lambda~`` the ``--strategy`` weights; ``--strategy equal`` gives back the papers' ``|S_i|`` weighting.
FLAME is the exception: every client trains the full model, and ``flame_aggregation`` sets its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

from cis.core.errors import CisError
from cis.training.data.dataset import Dataset, check_index_range
from cis.training.families import algorithm1, early_exit, nested
from cis.training.federated import MethodSetup
from cis.training.methods.registry import effective_options, family_of
from cis.training.models.contract import EarlyExitNet, check_chain, input_index_range
from cis.training.models.model_ref import build_model, user_model
from cis.training.weights_file import load_weights

BUILDERS: dict[str, ModuleType] = {"cis": algorithm1, "early-exit": early_exit, "nested": nested}
"""Each method family's builder: ``model_config(config, options, num_exits, train)`` and ``build_pieces(...)``."""

WeightsFor = Callable[[Any, np.ndarray], Any]
"""(model, matrix) -> Weights: the run's ``--strategy`` weights for this model."""
_CHECK_BATCH = 2


def method_model(config, num_exits: int, train, log: Callable[[str], None] = lambda s: None,
                 start_weights: bool = True) -> EarlyExitNet:
    """The model a method trains for a dataset (shape and classes from the data), ``num_exits`` exits: the
    user's ``--model`` or the method's built-in, one batch checked through it, and ``--weights`` loaded
    (``start_weights``; a resumed run takes its checkpoint's instead)."""
    options = effective_options(config.method, config.options)
    torch.manual_seed(config.seed)
    if config.model:
        x = torch.from_numpy(np.ascontiguousarray(train.x[:_CHECK_BATCH]))
        context = {"num_classes": int(train.num_classes), "num_exits": int(num_exits),
                   "input_shape": tuple(int(d) for d in train.x.shape[1:])}
        model = user_model(config.model, config.model_args, context, x.dtype, config.model_sha256,
                           config.allow_model_change, config.model_root)
        if model.num_exits != num_exits:
            raise CisError(
                f"model {config.model}: the factory returned {model.num_exits} stages; the spec has {num_exits} exits "
                "(one stage per exit)"
            )
        check_ids(model, train, config.dataset)  # before the check batch: a bad id there would be a bare IndexError
        check_chain(model, x, int(train.num_classes), f"model {config.model}")
    else:
        model = build_model(BUILDERS[family_of(config.method)].model_config(config, options, num_exits, train))
    if config.weights_file and start_weights:
        load_weights(model, config.weights_file, log, config.weights_prefix)
    return model


def check_ids(model: EarlyExitNet, data: Dataset, where: str) -> None:
    """Every integer input of ``data`` within the index range the model declares (its input embedding's
    ``num_embeddings``: :func:`cis.training.models.contract.input_index_range`); one line naming the first sample
    outside it."""
    if not len(data) or data.x.dtype.kind not in "iub":
        return
    declared = input_index_range(model, torch.from_numpy(np.ascontiguousarray(data.x[:1])))
    if declared is not None:
        name, high = declared
        module = ".".join(filter(None, ("stage_list.0.body", name)))
        check_index_range(data, high, f"the model's embedding {module} (num_embeddings {high})", where)


def build_method_setup(
    config, spec, train, clients, sgd: dict, weights_for: WeightsFor, log: Callable[[str], None],
    start_weights: bool = True,
) -> MethodSetup:
    """Model and engine pieces of ``config.method`` for the spec's nodes (``clients``)."""
    builder = BUILDERS[family_of(config.method)]
    options = effective_options(config.method, config.options)
    try:
        model = method_model(config, spec.num_exits, train, log, start_weights)
        return builder.build_pieces(config, spec, model, clients, sgd, options, weights_for, log)
    except ValueError as exc:  # the methods' own checks of user input
        raise CisError(f"--method {config.method}: {exc}") from None
