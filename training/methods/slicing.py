"""Sub-models as index selections of a global state dict, and their aggregation.

Every width-scaled method here (NeFL, HeteroFL, FjORD, FedRolex, Federated
Dropout, small model, SLT) trains a *compact* network whose tensors are pieces
of the server's tensors. A :data:`Selection` says which piece: for every compact
key, the global key it comes from and, per dimension, the kept indices (``None``
keeps the whole dimension). Ordered (prefix) selections are NeFL / HeteroFL /
FjORD / small model / SLT; a rolling window is FedRolex; random indices are
Federated Dropout.

Aggregation is one rule for all of them: every element of a global tensor
becomes the weighted average of the copies that the round's clients trained,
over exactly the clients whose selection contains it; an element nobody
trained keeps its value. For nested prefix selections this is NeFedAvg's
ring-wise average (Algorithm 2, the ">=" reading): a ring that sub-models
k, k+1, .. contain is averaged over all of their clients. Per-sub-model
(decoupled) tensors live under their own global keys, so the same rule is
FedAvg over that sub-model's clients. Integer buffers (BatchNorm's
``num_batches_tracked``) take the largest contributed value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

Index = Tensor | int | None
Selection = dict[str, tuple[str, tuple[Index, ...]]]
"""compact key -> (global key, kept indices per dimension; None = all, an int drops the dimension)."""


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


def _index_tuple(index: Sequence[Index], shape: Sequence[int]) -> tuple:
    """Advanced-indexing tuple that selects the outer product of the per-dimension indices."""
    nd = len(shape)
    out = []
    for d in range(nd):
        idx = index[d] if d < len(index) else None
        if idx is None:
            idx = torch.arange(shape[d])
        view = [1] * nd
        view[d] = -1
        out.append(idx.reshape(view))
    return tuple(out)


def _select_ints(t: Tensor, index: Sequence[Index]) -> tuple[Tensor, list[Tensor | None]]:
    """A view of ``t`` with the integer-indexed dimensions dropped, and the remaining indices."""
    rest: list[Tensor | None] = []
    for d in reversed(range(len(index))):
        if isinstance(index[d], int):
            t = t.select(d, index[d])
        else:
            rest.insert(0, index[d])  # type: ignore[arg-type]
    return t, rest


def take(t: Tensor, index: Sequence[Index]) -> Tensor:
    """The sub-tensor of ``t`` at the outer product of ``index`` (a copy)."""
    t, index = _select_ints(t, index)
    if t.dim() == 0 or all(i is None for i in index):
        return t.clone()
    return t[_index_tuple(index, t.shape)].clone()


def put_(t: Tensor, index: Sequence[Index], value: Tensor) -> None:
    """Write ``value`` into ``t`` at the outer product of ``index`` (in place)."""
    t, index = _select_ints(t, index)
    if t.dim() == 0 or all(i is None for i in index):
        t.copy_(value.reshape(t.shape))
    else:
        t[_index_tuple(index, t.shape)] = value.to(t.dtype)


@torch.no_grad()
def gather(global_state: Mapping[str, Tensor], selection: Selection) -> dict[str, Tensor]:
    """The compact state a selection describes (copies of the selected pieces)."""
    return {ck: take(global_state[gk], idx) for ck, (gk, idx) in selection.items()}


@torch.no_grad()
def scatter_(global_state: Mapping[str, Tensor], compact_state: Mapping[str, Tensor], selection: Selection) -> None:
    """Write a compact state back into the global tensors it was taken from (in place)."""
    for ck, (gk, idx) in selection.items():
        put_(global_state[gk], idx, compact_state[ck])


class SelectionAverager:
    """Element-wise weighted average over the clients whose selection holds each element.

    ``add`` accumulates weight * value and weight into per-key buffers the size of
    the global tensor (allocated on first use, so keys nobody touched cost
    nothing); ``apply_`` writes the averages into the global state.
    """

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}

    @torch.no_grad()
    def add(self, global_state: Mapping[str, Tensor], compact_state: Mapping[str, Tensor], selection: Selection, weight: float) -> None:
        for ck, (gk, idx) in selection.items():
            g, v = global_state[gk], compact_state[ck]
            if gk not in self.sums:
                self.sums[gk] = torch.zeros_like(g, dtype=torch.float64) if g.is_floating_point() else g.clone()
                self.weights[gk] = torch.zeros(g.shape, dtype=torch.float64)
            if g.is_floating_point():
                put_(self.sums[gk], idx, take(self.sums[gk], idx) + weight * v.double())
            else:
                put_(self.sums[gk], idx, torch.maximum(take(self.sums[gk], idx), v))
            put_(self.weights[gk], idx, take(self.weights[gk], idx) + weight)

    @torch.no_grad()
    def apply_(self, global_state: Mapping[str, Tensor]) -> None:
        for gk, s in self.sums.items():
            g, w = global_state[gk], self.weights[gk]
            if g.is_floating_point():
                avg = s / w.clamp(min=1e-300)
                g.copy_(torch.where(w > 0, avg, g.double()).to(g.dtype))
            else:
                g.copy_(s)
        self.sums, self.weights = {}, {}


def average_selections(
    global_state: Mapping[str, Tensor], updates: Sequence[tuple[Mapping[str, Tensor], Selection, float]]
) -> dict[str, Tensor]:
    """Pure form of :class:`SelectionAverager`: a new global state from [(compact state, selection, weight)]."""
    out = {k: v.clone() for k, v in global_state.items()}
    avg = SelectionAverager()
    for compact, selection, weight in updates:
        avg.add(out, compact, selection, weight)
    avg.apply_(out)
    return out
