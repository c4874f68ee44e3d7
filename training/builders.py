"""``--method NAME`` -> the model and the engine pieces a run trains with; every method, ``cis`` included.

    setup = build_method_setup(config, spec, train, clients, sgd, weights_for, log)
    engine = FederatedEngine(setup.model, clients, setup.chooser, setup.trainer, setup.aggregator, seed=config.seed)

The registry names each family's builder (:data:`training.methods.registry.FAMILY_BUILDERS`); this module
imports it and hands it the method's options, every default filled
(:func:`~training.methods.registry.effective_options`). The builder (training/families/) builds down
from there: algorithm1.py, early_exit.py, nested.py.

Inference-aware weighting (the CIS paper's point, for every method where it applies): a client's weight in
the methods' per-entry averages is ``Lambda~_e(t) * |S_i|``, ``e`` the exit (sub-model) it trained,
``Lambda~`` the ``--strategy`` weights; ``--strategy equal`` gives back the papers' ``|S_i|`` weighting.
FLAME is the exception: every client trains the full model, and ``flame_aggregation`` sets its weights.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

from cis.errors import CisError
from training.engine import MethodSetup
from training.methods.registry import FAMILY_BUILDERS, effective_options, family_of
from training.models import EarlyExitNet

BUILDERS: dict[str, ModuleType] = {family: importlib.import_module(m) for family, m in FAMILY_BUILDERS.items()}
"""Each method family's builder module (the registry names it)."""

WeightsFor = Callable[[Any, np.ndarray], Any]
"""(model, matrix) -> Weights: the run's ``--strategy`` weights for this model."""


def method_model(config, num_exits: int, train) -> EarlyExitNet:
    """The model a method trains for a dataset (shape and classes from the data), ``num_exits`` exits."""
    options = effective_options(config.method, config.options)
    torch.manual_seed(config.seed)
    return BUILDERS[family_of(config.method)].build_model(config, options, num_exits, train)


def build_method_setup(
    config, spec, train, clients, sgd: dict, weights_for: WeightsFor, log: Callable[[str], None]
) -> MethodSetup:
    """Model and engine pieces of ``config.method`` for the spec's nodes (``clients``)."""
    builder = BUILDERS[family_of(config.method)]
    options = effective_options(config.method, config.options)
    try:
        model = method_model(config, spec.num_exits, train)
        return builder.build_pieces(config, spec, model, clients, sgd, options, weights_for, log)
    except ValueError as exc:  # the methods' own checks of user input
        raise CisError(f"--method {config.method}: {exc}") from None
