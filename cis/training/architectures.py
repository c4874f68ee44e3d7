"""The built-in architectures, as factories like any user's (``cis.training.architectures:resnet18``, ...).

A built-in model's ``config()`` is ``{"arch": NAME, **its factory's arguments}``;
:data:`cis.training.models.model_ref.BUILTIN` maps the name to the factory, and
:func:`cis.training.models.model_ref.build_model`
rebuilds every model, built-in or a user's, through the same reference path. The methods' builders
(cis/training/families/) pick a factory and its arguments; so can a user:
``cis train --model cis.training.architectures:resnet18 --model-arg width=0.5``.

    factory          arch            model                                              defined in
    resnet18         resnet18        ResNet18EE: early-exit ResNet-18 for 32x32 inputs  cis/training/models/cnns.py
    digits_cnn       digits-cnn      DigitsCNN: small early-exit CNN for 8x8 digits     cis/training/models/cnns.py
    vit              vit             ViTEE: early-exit ViT (per-exit heads or Ree)      cis/training/methods/vit.py
    nested_resnet    nested-resnet   NestedNet: nested sub-models (NeFL, SLT, ...)      cis/training/methods/nested.py
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cis.training.methods.nested import NestedNet, build_nested
from cis.training.methods.vit import DEFAULT_EXITS, ViTEE
from cis.training.models.cnns import _DEFAULT, DigitsCNN, ResNet18EE
from cis.training.models.model_ref import build_model

__all__ = ["build_model", "digits_cnn", "nested_resnet", "resnet18", "vit"]


def resnet18(
    num_classes: int = 10, exits: Sequence[int] = _DEFAULT, width: float = 1.0, in_channels: int = _DEFAULT,
    input_size: int = _DEFAULT,
) -> ResNet18EE:
    """Early-exit ResNet-18 for 32x32 images; ``exits`` are residual-block indices ending at 8 (default 1, 4, 8)."""
    return ResNet18EE(num_classes, exits, width, in_channels, input_size)


def digits_cnn(
    num_classes: int = 10, exits: Sequence[int] = _DEFAULT, width: float = 1.0, in_channels: int = _DEFAULT,
    input_size: int = _DEFAULT,
) -> DigitsCNN:
    """Small early-exit CNN for 8x8 digits: three conv blocks, an exit after each by default."""
    return DigitsCNN(num_classes, exits, width, in_channels, input_size)


def vit(
    num_classes: int = 10, exits: Sequence[int] = DEFAULT_EXITS, in_channels: int = 3, input_size: int = 32,
    patch: int = 4, dim: int = 64, depth: int = 6, heads: int = 4, mlp_ratio: float = 2.0, head: str = "exit",
    modulation: bool = True,
) -> ViTEE:
    """Early-exit ViT; ``exits`` are block indices ending at ``depth``; ``head`` ``exit`` or ``ree`` (ReeFL)."""
    return ViTEE(num_classes, exits, in_channels, input_size, patch, dim, depth, heads, mlp_ratio, head, modulation)


def nested_resnet(
    layout: dict[str, Any], specs: list[dict[str, Any]], decoupled_bn: bool, use_steps: bool, learn_steps: bool,
    static_bn: bool = False, **derived: Any,
) -> NestedNet:
    """The nested methods' server model from its layout and sub-model specs (``derived``: the exits, input and
    classes its config repeats from the layout)."""
    return build_nested({
        "layout": layout, "specs": specs, "decoupled_bn": decoupled_bn, "use_steps": use_steps,
        "learn_steps": learn_steps, "static_bn": static_bn,
    })
