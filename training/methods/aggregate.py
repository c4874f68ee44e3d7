"""Aggregation rules of ReeFL, FLAME and the baselines.

Every rule is a weighted average per state entry over the clients that hold the
entry, so one streaming :class:`MaskedAverage` aggregator (weights and a
holds-mask per client) runs them all in the engine, and the pure functions
below state each rule on small dicts:

- FedAvg: weight |D_m|, every client holds everything;
- ReeFL (and the depth baselines): weight |D_m| over the clients whose sub-model
  holds the parameter (stage k's entries are held by clients of exit >= k; Ree,
  the shared classifier and anything outside a stage by all);
- FLAME patience-conscious: weight p_m; exit-conscious: weight e_m (the client's
  average training exit);
- FLAME exit-based: layer l averaged over the clients with e_m >= l, equal weights;
- ScaleFL: entrywise over the clients whose width-sliced sub-model contains the entry.

An entry no client holds keeps its global value. Integer entries (BatchNorm
counts) take the largest count among the holders.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

_STAGE_KEY = re.compile(r"^stage_list\.(\d+)\.")

Holds = Callable[[str, Tensor], "bool | Tensor"]  # (key, value) -> held? (or an entrywise mask)


def key_exit(key: str) -> int | None:
    """The exit whose stage owns ``key`` (1-based), or None for entries outside every stage (shared)."""
    m = _STAGE_KEY.match(key)
    return int(m.group(1)) + 1 if m else None


def held_by_exit(max_exit: float) -> Holds:
    """Entries of stages 1..floor(max_exit) plus the shared ones."""
    return lambda key, value: (key_exit(key) or 1) <= max_exit


def holds_all(key: str, value: Tensor) -> bool:
    return True


@torch.no_grad()
def masked_average(
    global_state: Mapping[str, Tensor],
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    holds: Sequence[Holds] | None = None,
) -> dict[str, Tensor]:
    """sum_m w_m [m holds] W_m / sum_m w_m [m holds] per entry; entries nobody holds keep the global value."""
    agg = MaskedAverage()
    agg.start(global_state)
    for k, (state, w) in enumerate(zip(states, weights)):
        agg.add_state(state, w, holds[k] if holds else holds_all)
    out = {k: v.clone() for k, v in global_state.items()}
    agg.write(out)
    return out


def fedavg(global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], sizes: Sequence[float]) -> dict[str, Tensor]:
    return masked_average(global_state, states, sizes)


def held_average(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], sizes: Sequence[float], max_exits: Sequence[int]
) -> dict[str, Tensor]:
    """ReeFL: per parameter over the clients that hold it, weighted by their samples."""
    return masked_average(global_state, states, sizes, [held_by_exit(e) for e in max_exits])


def patience_conscious(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], patiences: Sequence[int]
) -> dict[str, Tensor]:
    return masked_average(global_state, states, [float(p) for p in patiences])


def exit_conscious(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], avg_exits: Sequence[float]
) -> dict[str, Tensor]:
    return masked_average(global_state, states, [float(e) for e in avg_exits])


def exit_based(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], avg_exits: Sequence[float]
) -> dict[str, Tensor]:
    """Layer l (the stage of exit l, its head included) over the clients whose average exit e_m >= l."""
    return masked_average(global_state, states, [1.0] * len(states), [held_by_exit(e) for e in avg_exits])


class MaskedAverage:
    """Streaming form of :func:`masked_average`: ``start``, ``add_state`` per client, ``write``."""

    def __init__(self) -> None:
        self._num: dict[str, Tensor] = {}
        self._den: dict[str, Tensor] = {}

    @torch.no_grad()
    def start(self, global_state: Mapping[str, Tensor]) -> None:
        for k, v in global_state.items():
            if k not in self._num:
                self._num[k] = torch.zeros_like(v, dtype=v.dtype if v.is_floating_point() else torch.float64)
                self._den[k] = torch.zeros_like(v, dtype=torch.float64 if not v.is_floating_point() else v.dtype)
            self._num[k].zero_()
            self._den[k].zero_()

    @torch.no_grad()
    def add_state(self, state: Mapping[str, Tensor], weight: float, holds: Holds = holds_all) -> None:
        for k, num in self._num.items():
            v = state[k]
            held = holds(k, v)
            if held is False:
                continue
            mask = held.to(num.dtype) if isinstance(held, Tensor) else 1.0
            if v.is_floating_point():
                num.add_(v * mask, alpha=weight)
                self._den[k].add_(mask * weight if isinstance(mask, Tensor) else torch.full_like(self._den[k], weight))
            else:  # integer counts: the largest among holders
                torch.maximum(num, v.to(num.dtype), out=num)
                self._den[k].fill_(1.0)

    @torch.no_grad()
    def write(self, global_state: dict[str, Tensor]) -> None:
        for k, g in global_state.items():
            den = self._den[k]
            held = den > 0
            if g.is_floating_point():
                g.copy_(torch.where(held, self._num[k] / den.clamp(min=1e-12), g))
            elif bool(held.any()):
                g.copy_(self._num[k].to(g.dtype))


def block_deltas_distilled(
    delta: Mapping[str, Tensor], block_prefixes: Sequence[str], boundaries: Sequence[int], beta: float
) -> dict[str, Tensor]:
    """InclusiveFL's momentum distillation on the server's update ``delta`` (new global - old global).

    For each sub-model whose top block is ``b`` (0-based index into ``block_prefixes``,
    every exit but the last), block b's update gets beta times the mean update of
    the same parameter over the deeper blocks b+1..L-1: the deeper layers' knowledge
    pushed into the small model's top layer. Blocks must share parameter names and shapes.
    """
    out = dict(delta)
    for b in boundaries:
        deeper = block_prefixes[b + 1 :]
        if not deeper:
            continue
        top = block_prefixes[b]
        for key in [k for k in delta if k.startswith(top)]:
            suffix = key[len(top) :]
            mean = torch.stack([delta[p + suffix] for p in deeper]).mean(dim=0)
            out[key] = delta[key] + beta * mean
    return out
