"""The stage contract: the names every stage graph, the manifest, the runtime and the simulator share.

**The contract**, which the models' stage plans (cis/training/models/stage_plan.py), the
exporter, the bundle, the runtime node and the simulator all follow: a model is
cut at its exits into stages 1..E; each stage is a graph of named tensors.

- stage 1 reads the request, :data:`INPUT` (``"input"``);
- stage k returns :data:`LOGITS` (``"logits"``) for exit k and, except the last
  stage, its *carry*: the tensors stage k+1 reads. A carry tensor ``name``
  leaving stage k is called :func:`carry_name` ``(name, k)`` (``features_1``):
  one ONNX graph names each tensor once, so a stage's inputs and outputs must
  differ. The early-exit default carries :data:`FEATURES`; other models carry
  what they need (ReeFL: ``tokens_k``, ``history_k``; nested models the raw
  input, ``input_k``). A FLAME request's patience state travels beside the
  carry (:data:`cis.core.policy.patience.LABEL`, :data:`cis.core.policy.patience.COUNT`).

The manifest records every stage's input and output names, so a node or the
simulator never needs to know the method: it moves carries and reads logits.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

INPUT = "input"
LOGITS = "logits"
FEATURES = "features"


def carry_name(name: str, stage: int) -> str:
    """The name of carry tensor ``name`` leaving stage ``stage`` (e.g. ``features_1``)."""
    return f"{name}_{stage}"


def carry_of(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a stage forwards: its outputs without the logits."""
    return {k: v for k, v in outputs.items() if k != LOGITS}
