"""Compact residual networks: the CIFAR-style ResNets every width/depth-scaled method trains.

- :class:`ResNetLayout`: a CIFAR-style ResNet (3x3 stem, stages of basic blocks, the first
  block of every later stage halves the resolution through a 1x1 shortcut conv).
  ``resnet20`` is the SLT paper's network; ``digits`` is a tiny one for 8x8 inputs so tests
  run in milliseconds (:data:`LAYOUTS`).
- :class:`CompactResNet`: a plain network at given per-conv widths with a subset of the
  blocks, an optional step size per block (NeFL-D: Y_{j+1} = shortcut(Y_j) + s_j F_j(Y_j))
  and an optional frozen prefix (SLT: run without autograd, so no activations are stored).
  Its state maps onto the server's tensors by a :data:`~cis.training.methods.slicing.Selection`
  (:mod:`cis.training.methods.nested` holds the server model and the selections).
- :func:`fold_steps`: a served sub-model with its step sizes folded into the BatchNorm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.training.methods.slicing import kept_channels


@dataclass(frozen=True)
class ResNetLayout:
    """Stages of basic blocks; ``channels[l]`` and ``blocks[l]`` per stage."""

    channels: tuple[int, ...] = (16, 32, 64)
    blocks: tuple[int, ...] = (3, 3, 3)
    in_channels: int = 3
    input_size: int = 32
    num_classes: int = 10

    @property
    def num_blocks(self) -> int:
        return sum(self.blocks)

    def block_stage(self) -> list[int]:
        """Stage index of every block."""
        return [s for s, n in enumerate(self.blocks) for _ in range(n)]

    def downsamples(self) -> list[bool]:
        """True for blocks that change shape (first block of stages >= 2): never skippable."""
        return [s > 0 and (b == 0) for s, n in enumerate(self.blocks) for b in range(n)]

    @property
    def num_convs(self) -> int:
        """Conv layers in SLT's sense: the stem plus two per block (a shortcut conv
        belongs to its block's second conv, which has the same output)."""
        return 1 + 2 * self.num_blocks

    def conv_channels(self) -> list[int]:
        """Full output channels M_k of conv layers k = 0..K-1 (stem, then conv1/conv2 of each block)."""
        out = [self.channels[0]]
        for s in self.block_stage():
            out += [self.channels[s], self.channels[s]]
        return out

    def conv_inputs(self) -> list[int]:
        """Full input channels P_k of every conv layer."""
        outs = self.conv_channels()
        return [self.in_channels] + outs[:-1]

    def conv_resolution(self) -> list[int]:
        """Spatial side of every conv layer's output."""
        size, out = self.input_size, [self.input_size]
        for down in self.downsamples():
            if down:
                size = (size + 1) // 2
            out += [size, size]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "channels": list(self.channels),
            "blocks": list(self.blocks),
            "in_channels": self.in_channels,
            "input_size": self.input_size,
            "num_classes": self.num_classes,
        }


LAYOUTS: dict[str, ResNetLayout] = {
    "resnet20": ResNetLayout((16, 32, 64), (3, 3, 3)),
    "resnet56": ResNetLayout((16, 32, 64), (9, 9, 9)),
    "digits": ResNetLayout((8, 16, 32), (1, 1, 1), in_channels=1, input_size=8),
}


def uniform_widths(layout: ResNetLayout, ratio: float) -> list[int]:
    """Per-conv widths when every layer keeps ``ratio`` of its channels."""
    return [kept_channels(m, ratio) for m in layout.conv_channels()]


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN, scaled by an optional step size, plus the shortcut; ReLU after the sum."""

    def __init__(
        self, c_in: int, c_mid: int, c_out: int, stride: int, conv_shortcut: bool, step: float | None, learn_step: bool
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_mid, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_mid)
        self.conv2 = nn.Conv2d(c_mid, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.sc: nn.Sequential | None = None
        if conv_shortcut:
            self.sc = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
        elif c_out > c_in:
            raise CisError(f"block without shortcut conv: output width {c_out} exceeds input width {c_in}")
        self.c_out = c_out
        self.step: Tensor | None
        if step is None:
            self.step = None
        elif learn_step:
            self.step = nn.Parameter(torch.tensor(float(step)))
        else:
            self.register_buffer("step", torch.tensor(float(step)))
        self.frozen1 = self.frozen2 = False

    def forward(self, x: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen1):
            h = F.relu(self.bn1(self.conv1(x)))
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen2):
            f = self.bn2(self.conv2(h))
            if self.step is not None:
                f = self.step * f
            short = self.sc(x) if self.sc is not None else x[:, : self.c_out]
            return F.relu(short + f)


class CompactResNet(nn.Module):
    """A stand-alone (sub-)network: ``widths`` per conv layer, ``kept`` block indices of the layout.

    ``steps``: one initial step size per kept block, or None for plain residual blocks.
    ``frozen``: conv layers 0..frozen-1 run without autograd and keep their BatchNorm
    in eval mode (SLT's frozen part: parameters only loaded, no activations stored).
    """

    def __init__(
        self,
        layout: ResNetLayout,
        widths: Sequence[int],
        kept: Sequence[int] | None = None,
        steps: Sequence[float] | None = None,
        learn_steps: bool = True,
        frozen: int = 0,
    ) -> None:
        super().__init__()
        widths = [int(w) for w in widths]
        if len(widths) != layout.num_convs:
            raise CisError(f"compact network: {len(widths)} widths for {layout.num_convs} conv layers")
        kept = list(range(layout.num_blocks)) if kept is None else [int(b) for b in kept]
        down = layout.downsamples()
        missing = [b for b, d in enumerate(down) if d and b not in kept]
        if missing:
            raise CisError(f"sub-model skips block(s) {missing}, which change the resolution; they must be kept")
        if steps is not None and len(steps) != len(kept):
            raise CisError(f"compact network: {len(steps)} step sizes for {len(kept)} kept blocks")
        self.layout, self.widths, self.kept, self.frozen = layout, widths, kept, int(frozen)
        self.stem = nn.Conv2d(layout.in_channels, widths[0], 3, 1, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(widths[0])
        blocks = []
        c_in = widths[0]
        for j, b in enumerate(kept):
            c_mid, c_out = widths[1 + 2 * b], widths[2 + 2 * b]
            block = BasicBlock(
                c_in, c_mid, c_out, 2 if down[b] else 1, down[b], None if steps is None else steps[j], learn_steps
            )
            block.frozen1 = 1 + 2 * b < self.frozen
            block.frozen2 = 2 + 2 * b < self.frozen
            blocks.append(block)
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c_in, layout.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.frozen < 1):
            h = F.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            h = block(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))

    def train(self, mode: bool = True) -> CompactResNet:
        super().train(mode)
        if self.frozen >= 1:
            self.stem_bn.eval()
        for block in cast(Iterable[BasicBlock], self.blocks):
            if block.frozen1:
                block.bn1.eval()
            if block.frozen2:
                block.bn2.eval()
                if block.sc is not None:
                    block.sc[1].eval()
        return self

    def trainable_keys(self) -> set[str]:
        """State keys of the layers that are trained (everything outside the frozen prefix)."""
        frozen = set()
        if self.frozen >= 1:
            frozen |= {"stem.", "stem_bn."}
        for j, block in enumerate(self.blocks):
            if block.frozen1:
                frozen |= {f"blocks.{j}.conv1.", f"blocks.{j}.bn1."}
            if block.frozen2:
                frozen |= {f"blocks.{j}.conv2.", f"blocks.{j}.bn2.", f"blocks.{j}.sc."}
        return {k for k in self.state_dict() if not any(k.startswith(p) for p in frozen)}

    def freeze_(self) -> None:
        """requires_grad=False on the frozen prefix's parameters (so an optimizer skips them)."""
        keep = self.trainable_keys()
        for name, p in self.named_parameters():
            p.requires_grad_(name in keep)


@torch.no_grad()
def fold_steps(net: CompactResNet) -> CompactResNet:
    """Fold every block's step size into its second BatchNorm (s * BN(z) = BN'(z) with gamma' = s gamma,
    beta' = s beta) and drop the step. Eval-mode equivalent only."""
    for block in cast(Iterable[BasicBlock], net.blocks):
        if block.step is not None:
            s = float(block.step)
            block.bn2.weight.mul_(s)
            block.bn2.bias.mul_(s)
            if isinstance(block.step, nn.Parameter):
                del block.step
            else:
                del block._buffers["step"]
            block.step = None
    return net
