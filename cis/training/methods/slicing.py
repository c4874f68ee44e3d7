"""The width rules of the nested methods: which channels a sub-model keeps.

Ordered (prefix) selections are NeFL / HeteroFL / FjORD / small model / SLT; a rolling window is
FedRolex; random indices are Federated Dropout. The selections themselves (where a compact tensor
sits in the server's) are :mod:`cis.training.selection`; their aggregation is the aggregation wing's
per-entry average (:mod:`cis.training.aggregation.averages`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def kept_channels(channels: int, ratio: float) -> int:
    """floor(ratio * channels), at least 1 (the papers' ``floor(s M_k)``); the epsilon
    keeps exact products such as 0.5 * 16 from rounding down to 7."""
    return max(1, min(channels, math.floor(ratio * channels + 1e-9)))


def width_ratio(param_ratio: float) -> float:
    """Channel keep-ratio of a NeFL width factor: gamma_W counts parameters, which scale
    with the square of the channel ratio, so channels keep sqrt(gamma_W)."""
    if not 0 < param_ratio <= 1:
        raise ValueError(f"width ratio {param_ratio!r}: expected a fraction in (0, 1]")
    return math.sqrt(param_ratio)


def prefix(n: int) -> Tensor:
    """The first n indices (ordered dropout / HeteroFL / NeFL-W)."""
    return torch.arange(n)


def rolling(total: int, keep: int, round: int) -> Tensor:
    """FedRolex, SLT paper Eq. 3: ``keep`` consecutive indices starting at r mod M, wrapping."""
    start = round % total
    return (torch.arange(keep) + start) % total


def random_indices(total: int, keep: int, gen: torch.Generator) -> Tensor:
    """Federated Dropout: ``keep`` of ``total`` indices drawn without replacement, kept sorted."""
    return torch.randperm(total, generator=gen)[:keep].sort().values
