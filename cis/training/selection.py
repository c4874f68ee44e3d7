"""Sub-models as index selections of a global state dict: take a piece out, put it back.

Every width-scaled method (NeFL, HeteroFL, FjORD, FedRolex, Federated Dropout, small model, SLT)
trains a *compact* network whose tensors are pieces of the server's tensors. A :data:`Selection`
says which piece: for every compact key, the global key it comes from and, per dimension, the kept
indices (``None`` keeps the whole dimension, an int drops it). :func:`gather` makes the compact
state, :func:`scatter_` writes it back; the aggregation wing averages uploads at the same indices
(:class:`cis.training.aggregation.averages.SelectionAverage`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

Index = Tensor | int | None
Selection = dict[str, tuple[str, tuple[Index, ...]]]
"""compact key -> (global key, kept indices per dimension; None = all, an int drops the dimension)."""


def _index_tuple(index: Sequence[Tensor | None], shape: Sequence[int]) -> tuple:
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
        i = index[d]
        if isinstance(i, int):
            t = t.select(d, i)
        else:
            rest.insert(0, i)
    return t, rest


def take(t: Tensor, index: Sequence[Index]) -> Tensor:
    """The sub-tensor of ``t`` at the outer product of ``index`` (a copy)."""
    t, rest = _select_ints(t, index)
    if t.dim() == 0 or all(i is None for i in rest):
        return t.clone()
    return t[_index_tuple(rest, t.shape)].clone()


def put_(t: Tensor, index: Sequence[Index], value: Tensor) -> None:
    """Write ``value`` into ``t`` at the outer product of ``index`` (in place)."""
    t, rest = _select_ints(t, index)
    if t.dim() == 0 or all(i is None for i in rest):
        t.copy_(value.reshape(t.shape))
    else:
        t[_index_tuple(rest, t.shape)] = value.to(t.dtype)


@torch.no_grad()
def gather(global_state: Mapping[str, Tensor], selection: Selection) -> dict[str, Tensor]:
    """The compact state a selection describes (copies of the selected pieces)."""
    return {ck: take(global_state[gk], idx) for ck, (gk, idx) in selection.items()}


@torch.no_grad()
def scatter_(global_state: Mapping[str, Tensor], compact_state: Mapping[str, Tensor], selection: Selection) -> None:
    """Write a compact state back into the global tensors it was taken from (in place)."""
    for ck, (gk, idx) in selection.items():
        put_(global_state[gk], idx, compact_state[ck])
