"""Sub-models as index selections of a global state dict, and their aggregation.

Every width-scaled method here (NeFL, HeteroFL, FjORD, FedRolex, Federated
Dropout, small model, SLT) trains a *compact* network whose tensors are pieces
of the server's tensors. A :data:`Selection` says which piece: for every compact
key, the global key it comes from and, per dimension, the kept indices (``None``
keeps the whole dimension). Ordered (prefix) selections are NeFL / HeteroFL /
FjORD / small model / SLT; a rolling window is FedRolex; random indices are
Federated Dropout.

Aggregation is one rule for all of them, and for the early-exit methods too
(:mod:`training.methods.aggregate`): every element of a global tensor becomes the
weighted average of the copies that the round's clients trained, over exactly the
clients that hold it; an element nobody trained keeps its value. What a client
holds is a selection (a compact state: the width-scaled methods) or a mask over
the full state (:data:`Holds`: the early-exit methods; a mask is a selection of
the whole tensor with some elements left out); :class:`SelectionAverage` is the
one accumulator of both. For nested prefix selections this is NeFedAvg's
ring-wise average (Algorithm 2, the ">=" reading): a ring that sub-models
k, k+1, .. contain is averaged over all of their clients. Per-sub-model
(decoupled) tensors live under their own global keys, so the same rule is
FedAvg over that sub-model's clients. Integer buffers (BatchNorm's
``num_batches_tracked``) take the largest contributed value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

Index = Tensor | int | None
Selection = dict[str, tuple[str, tuple[Index, ...]]]
"""compact key -> (global key, kept indices per dimension; None = all, an int drops the dimension)."""
Holds = Callable[[str, Tensor], "bool | Tensor"]
"""(key, value) -> does a client hold this entry of a full-size state: True, False or an entrywise mask."""


def holds_all(key: str, value: Tensor) -> bool:
    return True


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


class SelectionAverage:
    """Element-wise weighted average over the contributions that hold each element.

    Per global key, buffers of sum(weight * value) and sum(weight), allocated on first use (keys
    nobody touched cost nothing). A contribution is a full-size state with a holds-mask
    (:meth:`add_masked`) or a compact state with its selection (:meth:`add_selection`);
    :meth:`write` puts the averages into the global state and starts over. Floating entries add up
    in ``dtype`` (None: each tensor's own); integer entries (counts) keep the largest value.
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}

    def _buffers(self, key: str, g: Tensor) -> tuple[Tensor, Tensor]:
        if key not in self.sums:
            if g.is_floating_point():
                dtype = self.dtype or g.dtype
                self.sums[key] = torch.zeros_like(g, dtype=dtype)
                self.weights[key] = torch.zeros_like(g, dtype=dtype)
            else:
                self.sums[key] = g.clone()
                self.weights[key] = torch.zeros(g.shape, dtype=torch.float64)
        return self.sums[key], self.weights[key]

    @torch.no_grad()
    def add_masked(self, global_state: Mapping[str, Tensor], state: Mapping[str, Tensor], weight: float,
                   holds: Holds = holds_all) -> None:
        """A full-size state, weighted, over the entries ``holds`` says the client holds."""
        for k, g in global_state.items():
            v = state[k]
            held = holds(k, v)
            if held is False:
                continue
            s, w = self._buffers(k, g)
            if not g.is_floating_point():
                torch.maximum(s, v.to(s.dtype), out=s)
                w.fill_(1.0)
                continue
            mask = held.to(s.dtype) if isinstance(held, Tensor) else 1.0
            s.add_(v * mask, alpha=weight)
            w.add_(mask * weight if isinstance(mask, Tensor) else torch.full_like(w, weight))

    @torch.no_grad()
    def add_selection(self, global_state: Mapping[str, Tensor], compact_state: Mapping[str, Tensor],
                      selection: Selection, weight: float) -> None:
        """A compact state, weighted, at the elements its selection took from the global tensors."""
        for ck, (gk, idx) in selection.items():
            g, v = global_state[gk], compact_state[ck]
            s, w = self._buffers(gk, g)
            if g.is_floating_point():
                put_(s, idx, take(s, idx) + weight * v.to(s.dtype))
            else:
                put_(s, idx, torch.maximum(take(s, idx), v))
            put_(w, idx, take(w, idx) + weight)

    @torch.no_grad()
    def write(self, global_state: Mapping[str, Tensor]) -> None:
        """Averages into the global tensors (an element nobody contributed keeps its value); then start over."""
        for k, s in self.sums.items():
            g, w = global_state[k], self.weights[k]
            if g.is_floating_point():
                avg = s / w.clamp(min=torch.finfo(w.dtype).tiny)
                g.copy_(torch.where(w > 0, avg, g.to(s.dtype)).to(g.dtype))
            else:
                g.copy_(s)
        self.sums, self.weights = {}, {}


def average_selections(
    global_state: Mapping[str, Tensor], updates: Sequence[tuple[Mapping[str, Tensor], Selection, float]]
) -> dict[str, Tensor]:
    """Pure form of :class:`SelectionAverage`: a new global state from [(compact state, selection, weight)]."""
    out = {k: v.clone() for k, v in global_state.items()}
    avg = SelectionAverage(torch.float64)
    for compact, selection, weight in updates:
        avg.add_selection(out, compact, selection, weight)
    avg.write(out)
    return out
