"""The built-in early-exit CNNs, cut into stages at their exits.

Every model here is an :class:`~cis.training.models.contract.EarlyExitNet` (the public model contract,
cis/training/models/contract.py): a list of stages, where stage k is
the blocks between exit k-1 and exit k followed by exit head k (adaptive average
pool + linear). ``stage_k(carry) -> (logits_k, carry_out)``; stage 1's carry is
the input image, every later stage's carry is the previous stage's feature map.
``forward(x, upto=e)`` runs stages 1..e and nothing beyond, so the federated
trainer, the offline evaluation and the exporter all use one code path.

Architectures (factories in cis/training/architectures.py, like any user's;
``cis.training.models.model_ref.build_model``
rebuilds every model, these and the methods', from ``model.config()``):

- ``resnet18``: ResNet-18 for 32x32 inputs (3x3 stem, no max-pool), BasicBlocks
  [2, 2, 2, 2] = 8 residual blocks. ``exits`` are 1-based residual-block indices
  after which an exit sits; the last must be 8. Defaults follow the authors'
  code: (1, 4, 8) for CIFAR-10 and (4, 6, 8) for CIFAR-100, which their code
  calls "after conv layers 3, 9, 17" and "9, 13, 17" (counting the stem conv).
- ``digits-cnn``: a small CNN for 8x8 digits with 3 blocks (two 3x3 convs each;
  the 2nd and 3rd halve the resolution) and exits after each by default.

``width`` scales every channel count (base channels 64 * width for ResNet-18,
16 * width for the digits CNN, never below 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.training.models.contract import EarlyExitNet, ExitHead, Stage
from cis.training.models.contract import is_int as _is_int

CIFAR10_EXITS = (1, 4, 8)
CIFAR100_EXITS = (4, 6, 8)
DIGITS_EXITS = (1, 2, 3)
_MIN_CHANNELS = 4


def _channels(base: int, width: float) -> int:
    return max(_MIN_CHANNELS, round(base * width))


def _group_into_stages(
    blocks: list[nn.Module], channels: list[int], exits: Sequence[int], num_classes: int
) -> list[Stage]:
    """Cut a block list after each exit; ``channels[b]`` is block b's output channel count."""
    stages, start = [], 0
    for e in exits:
        stages.append(Stage(nn.Sequential(*blocks[start:e]), ExitHead(channels[e - 1], num_classes)))
        start = e
    return stages


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BatchNorm and an identity (or 1x1) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU()]


_DEFAULT: Any = object()  # a field the caller did not give: the architecture's default (None stays an error)


class ConvEarlyExitNet(EarlyExitNet):
    """An early-exit CNN: its config checked, its ``num_blocks`` blocks (:meth:`build_blocks`) cut after the exits.

    A subclass names its architecture and block count, builds its blocks, and gives the ``defaults``
    (exits, in_channels, input_size) of the inputs it is made for.
    """

    num_blocks: int
    defaults: dict[str, Any]

    def __init__(
        self,
        num_classes: int = 10,
        exits: Sequence[int] = _DEFAULT,
        width: float = 1.0,
        in_channels: int = _DEFAULT,
        input_size: int = _DEFAULT,
    ) -> None:
        given: dict[str, Any] = {"exits": exits, "in_channels": in_channels, "input_size": input_size}
        f = {k: self.defaults[k] if v is _DEFAULT else v for k, v in given.items()}
        config = _validated(
            self.arch, self.num_blocks, num_classes, f["exits"], width, f["in_channels"], f["input_size"]
        )
        blocks, channels = self.build_blocks(width, f["in_channels"])
        super().__init__(_group_into_stages(blocks, channels, f["exits"], num_classes), config)

    def build_blocks(self, width: float, in_channels: int) -> tuple[list[nn.Module], list[int]]:
        """The blocks in order and each one's output channel count."""
        raise NotImplementedError


class ResNet18EE(ConvEarlyExitNet):
    """Early-exit ResNet-18 for 32x32 images; the stem belongs to stage 1."""

    arch = "resnet18"
    num_blocks = 8
    defaults = {"exits": CIFAR10_EXITS, "in_channels": 3, "input_size": 32}

    def build_blocks(self, width: float, in_channels: int) -> tuple[list[nn.Module], list[int]]:
        base = _channels(64, width)
        stem = nn.Sequential(*_conv_bn_relu(in_channels, base, 1))
        blocks: list[nn.Module] = []
        channels: list[int] = []
        c_in = base
        for layer in range(4):
            c_out = base * 2**layer
            for i in range(2):
                blocks.append(BasicBlock(c_in, c_out, 2 if layer > 0 and i == 0 else 1))
                channels.append(c_out)
                c_in = c_out
        blocks[0] = nn.Sequential(stem, blocks[0])
        return blocks, channels


class DigitsCNN(ConvEarlyExitNet):
    """Small early-exit CNN for 8x8 digits: three conv blocks at 8x8, 4x4 and 2x2."""

    arch = "digits-cnn"
    num_blocks = 3
    defaults = {"exits": DIGITS_EXITS, "in_channels": 1, "input_size": 8}

    def build_blocks(self, width: float, in_channels: int) -> tuple[list[nn.Module], list[int]]:
        channels = [_channels(16 * 2**b, width) for b in range(self.num_blocks)]
        blocks: list[nn.Module] = []
        c_in = in_channels
        for b, c_out in enumerate(channels):
            stride = 1 if b == 0 else 2
            blocks.append(nn.Sequential(*_conv_bn_relu(c_in, c_out, stride), *_conv_bn_relu(c_out, c_out, 1)))
            c_in = c_out
        return blocks, channels


def _validated(
    arch: str, num_blocks: int, num_classes: int, exits: Sequence[int], width: float, in_channels: int, input_size: int
) -> dict[str, Any]:
    where = f"model config ({arch})"
    try:
        exits = list(exits)
    except TypeError:
        exits = None  # type: ignore[assignment]
    if (
        exits is None
        or not exits
        or not all(_is_int(e) for e in exits)
        or any(b <= a for a, b in zip(exits, exits[1:]))
        or exits[0] < 1
        or exits[-1] != num_blocks
    ):
        raise CisError(
            f"{where}: field 'exits' is {exits!r}, "
            f"expected increasing block indices in 1..{num_blocks} ending at {num_blocks}"
        )
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise CisError(f"{where}: field 'width' is {width!r}, expected a positive number")
    for field, value, low in (
        ("num_classes", num_classes, 2),
        ("in_channels", in_channels, 1),
        ("input_size", input_size, 1),
    ):
        if not _is_int(value) or value < low:
            raise CisError(f"{where}: field {field!r} is {value!r}, expected an integer >= {low}")
    return {
        "arch": arch,
        "exits": [int(e) for e in exits],
        "width": float(width),
        "num_classes": int(num_classes),
        "in_channels": int(in_channels),
        "input_size": int(input_size),
    }


def default_model_config(dataset: str, width: float = 1.0) -> dict[str, Any]:
    """The model used for a dataset name (``digits``, ``cifar10``, ``cifar100``) with the paper's exits."""
    if dataset == "digits":
        return _validated(DigitsCNN.arch, DigitsCNN.num_blocks, 10, DIGITS_EXITS, width, 1, 8)
    if dataset == "cifar10":
        return _validated(ResNet18EE.arch, ResNet18EE.num_blocks, 10, CIFAR10_EXITS, width, 3, 32)
    if dataset == "cifar100":
        return _validated(ResNet18EE.arch, ResNet18EE.num_blocks, 100, CIFAR100_EXITS, width, 3, 32)
    raise CisError(f"model for dataset {dataset!r}: unknown dataset, expected 'digits', 'cifar10' or 'cifar100'")
