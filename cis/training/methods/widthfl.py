"""Sub-model selection of the width-scaling baselines, as the SLT and NeFL papers describe them.

Channels are chosen per *channel group*: every conv whose output joins a residual
stream (the stem and each block's second conv and shortcut in a stage) shares
the stage's stream indices, and each block's first conv has its own group, so a
selection always yields a consistent dense sub-network (identity shortcuts need
the same indices on both sides).

- small model / HeteroFL / FjORD: ordered indices {0 .. floor(s M)-1} (:func:`ordered_groups`);
  HeteroFL keeps one static width per device tier, FjORD samples a width <= the
  device's per mini-batch (:func:`fjord_width`), the small model gives every
  device the smallest width.
- FedRolex: a window of floor(s M) consecutive indices starting at r mod M, wrapping (Eq. 3).
- Federated Dropout: floor(s M) random indices per device per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cis.training.methods.nested import compact_selection
from cis.training.methods.resnet import ResNetLayout
from cis.training.methods.slicing import kept_channels, prefix, random_indices, rolling
from cis.training.selection import Selection

GROUP_STREAM = "stream"
GROUP_MID = "mid"


def channel_groups(layout: ResNetLayout) -> dict[str, int]:
    """Group name -> full channel count: ``stream.l`` per stage, ``mid.b`` per block."""
    groups = {f"{GROUP_STREAM}.{s}": c for s, c in enumerate(layout.channels)}
    for b, s in enumerate(layout.block_stage()):
        groups[f"{GROUP_MID}.{b}"] = layout.channels[s]
    return groups


def conv_groups(layout: ResNetLayout) -> list[str]:
    """The channel group of every conv layer's output (stem, then conv1/conv2 of each block)."""
    out = [f"{GROUP_STREAM}.0"]
    for b, s in enumerate(layout.block_stage()):
        out += [f"{GROUP_MID}.{b}", f"{GROUP_STREAM}.{s}"]
    return out


def group_selection(layout: ResNetLayout, indices: dict[str, Tensor]) -> Selection:
    """The dense sub-network keeping ``indices[group]`` of every group (shared, sliced BatchNorm)."""
    return compact_selection(layout, [indices[g] for g in conv_groups(layout)])


def group_widths(layout: ResNetLayout, indices: dict[str, Tensor]) -> list[int]:
    """Per-conv widths of the sub-network :func:`group_selection` describes."""
    return [len(indices[g]) for g in conv_groups(layout)]


def ordered_groups(layout: ResNetLayout, s: float) -> dict[str, Tensor]:
    """Small model / HeteroFL / FjORD: I_k = {i : 0 <= i < floor(s M_k)}."""
    return {g: prefix(kept_channels(m, s)) for g, m in channel_groups(layout).items()}


def fedrolex_groups(layout: ResNetLayout, s: float, round: int) -> dict[str, Tensor]:
    """FedRolex (Eq. 3): the window of floor(s M_k) indices starting at r mod M_k."""
    return {g: rolling(m, kept_channels(m, s), round) for g, m in channel_groups(layout).items()}


def fd_groups(layout: ResNetLayout, s: float, gen: torch.Generator) -> dict[str, Tensor]:
    """Federated Dropout: floor(s M_k) indices drawn at random (per device, per round)."""
    return {g: random_indices(m, kept_channels(m, s), gen) for g, m in channel_groups(layout).items()}


def fjord_width(allowed: Sequence[float], gen: torch.Generator) -> float:
    """FjORD's ordered dropout: a width drawn uniformly among those the device can train, per mini-batch."""
    return float(allowed[int(torch.randint(len(allowed), (1,), generator=gen))])


def heterogeneous_widths(levels: Sequence[float], num_devices: int) -> list[float]:
    """Constraint levels split equally over the devices (SLT Section 3.4): device i gets levels[i mod L]
    after sorting, so each level holds the same share of devices."""
    per = [sorted(levels)[i * len(levels) // num_devices] for i in range(num_devices)]
    return per


def small_model_width(levels: Sequence[float]) -> float:
    """Small model under heterogeneous constraints: the smallest width every device can train."""
    return min(levels)


GroupRule = Callable[[ResNetLayout, float, int, torch.Generator], dict[str, Tensor]]
RULES: dict[str, GroupRule] = {
    "ordered": lambda layout, s, r, gen: ordered_groups(layout, s),
    "rolling": lambda layout, s, r, gen: fedrolex_groups(layout, s, r),
    "random": lambda layout, s, r, gen: fd_groups(layout, s, gen),
}
