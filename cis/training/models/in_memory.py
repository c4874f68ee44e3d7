"""Models made of in-memory torch modules (the Python API: ``cis.train(stages, ...)``), as a model reference.

A run rebuilds its model from a record (cis/training/models/model_ref.py): a factory reference and its arguments.
Modules held in memory have no file to name, so :func:`register` keeps a copy of them in this process under a
key, and the record names this module's factory, :data:`REFERENCE`, with ``{"key": KEY}``: the run trains,
checkpoints, evaluates and exports through the one path every model takes. In another process the key means
nothing, and the factory says so in one line (a run meant to be exported elsewhere passes a factory reference,
``PATH.py:NAME`` or ``pkg.module:NAME``, instead).

What is registered: ``(body, head)`` pairs or an :class:`~cis.training.models.contract.EarlyExitNet` (copied when
registered and again for each build, so neither the caller's modules nor an earlier build change), or a factory
callable, called as a ``--model`` factory is (the context arguments it names filled from the data and the spec).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from torch import nn

from cis.core.errors import CisError
from cis.training.models.contract import EarlyExitNet, as_early_exit
from cis.training.models.model_ref import factory_args

REFERENCE = "cis.training.models.in_memory:model"
_REGISTERED: dict[str, Any] = {}


def register(stages: Any) -> str:
    """Keep ``stages`` (pairs, an EarlyExitNet, or a factory callable) in this process; the key that names it."""
    is_factory = callable(stages) and not isinstance(stages, (nn.Module, list, tuple))
    if not is_factory:
        as_early_exit(stages, "cis.train(stages)")  # one line now for what is not a model
    key = uuid.uuid4().hex[:16]
    _REGISTERED[key] = stages if is_factory else copy.deepcopy(stages)
    return key


def model(key: str, num_classes: int | None = None, num_exits: int | None = None,
          input_shape: tuple[int, ...] | None = None) -> EarlyExitNet:
    """The registered model of ``key``, a fresh copy (a factory: called with the context it names)."""
    made = _REGISTERED.get(key)
    where = f"model {REFERENCE} (key {key})"
    if made is None:
        raise CisError(
            f"{where}: the run's model was made of in-memory modules (cis.train) in another process; rebuild it "
            "where it was trained, or train from a factory reference (PATH.py:NAME or pkg.module:NAME) to use "
            "the run anywhere"
        )
    if isinstance(made, (nn.Module, list, tuple)):
        return as_early_exit(copy.deepcopy(made), where)
    context = {k: v for k, v in (("num_classes", num_classes), ("num_exits", num_exits),
                                 ("input_shape", input_shape)) if v is not None}
    try:
        built = made(**factory_args(made, {}, context, where))
    except CisError:
        raise
    except Exception as exc:  # the caller's factory: one line
        raise CisError(f"{where}: the factory raised {type(exc).__name__}: {exc}") from None
    return as_early_exit(built, where)
