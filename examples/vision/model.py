"""The vision example's model: torchvision's MobileNetV3-Small with three exits.

``cis train --model examples/vision/model.py:make`` calls ``make``; cis fills ``num_classes`` and
``input_shape`` (one sample's shape, (C, H, W)) from the data, ``--model-arg width=0.5`` sets ``width``.
The backbone helper cuts the network after three of its blocks and puts a pooled linear head on each
(docs/your-model.md, "Exits on an existing backbone"). Random weights: nothing is downloaded
(``--weights FILE`` starts from a local state dict).

GroupNorm replaces torchvision's BatchNorm: federated averaging mixes each node's BatchNorm running statistics
with weights that moved differently, and torchvision's MobileNetV3 updates those statistics slowly (momentum
0.01), so after a few hundred steps the evaluated model sits at chance. GroupNorm keeps no running statistics.
"""

from __future__ import annotations

from torch import nn

from cis.training.models.backbone import torchvision_model, with_exits

AFTER = ["features.3", "features.8", "features.12"]  # exit 1 after block 3, exit 2 after 8, exit 3 at the end


def group_norm(channels: int) -> nn.Module:
    """The norm layer for ``channels`` (MobileNetV3's channel counts are multiples of 8)."""
    return nn.GroupNorm(8, channels)


def make(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0) -> list:
    """Three ``(body, head)`` stages of a MobileNetV3-Small of channel width ``width``."""
    net = torchvision_model("mobilenet_v3_small", num_classes=num_classes, width_mult=width, norm_layer=group_norm)
    return with_exits(net, after=AFTER, num_classes=num_classes, input_shape=input_shape)
