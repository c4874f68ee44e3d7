"""Every model architecture by name: the one table :func:`build_model` reads.

Explicit, not registration as a side effect of importing: training/models.py (the
early-exit base class and the CNNs) and training/methods (the methods' models)
never import each other, and this module, above both, names them all.

    arch            model                                              defined in
    resnet18        ResNet18EE: early-exit ResNet-18 for 32x32 inputs  training/models.py
    digits-cnn      DigitsCNN: small early-exit CNN for 8x8 digits     training/models.py
    vit             ViTEE: early-exit ViT (per-exit heads or Ree)      training/methods/vit.py
    nested-resnet   NestedNet: nested sub-models (NeFL, SLT, ...)      training/methods/nested.py
"""

from __future__ import annotations

from typing import Any

from cis.errors import CisError
from training.methods.nested import NestedNet, build_nested
from training.methods.vit import ViTEE
from training.models import DigitsCNN, EarlyExitNet, ResNet18EE

ARCHITECTURES: dict[str, type[EarlyExitNet]] = {cls.arch: cls for cls in (ResNet18EE, DigitsCNN, ViTEE)}
"""Architectures rebuilt from their flat ``config()`` fields (``cls.config_fields``)."""


def build_model(config: dict[str, Any]) -> EarlyExitNet:
    """Rebuild a model from ``model.config()``; missing fields take the architecture's defaults."""
    if not isinstance(config, dict):
        raise CisError(f"model config: got {type(config).__name__}, expected a dict with an 'arch' field")
    arch = config.get("arch")
    if arch == NestedNet.arch:  # nested sub-models: a layout and one spec per sub-model, not flat fields
        return build_nested(config)
    if arch not in ARCHITECTURES:
        raise CisError(f"model config: field 'arch' is {arch!r}, expected one of {sorted(ARCHITECTURES)}")
    cls = ARCHITECTURES[arch]
    unknown = sorted(set(config) - set(cls.config_fields))
    if unknown:
        raise CisError(f"model config ({arch}): unknown fields {unknown}, expected only {list(cls.config_fields)}")
    return cls(**{k: v for k, v in config.items() if k != "arch"})
