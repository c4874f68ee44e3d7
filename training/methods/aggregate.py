"""Aggregation rules of ReeFL, FLAME and the baselines, as pure functions over state dicts.

Every rule is a weighted average per state entry over the clients that hold the
entry. What a rule says about one client is its :data:`Term`: the client's weight
and what it holds (:data:`~training.methods.slicing.Holds`). The pure functions
below state each rule on lists of states; the engine's aggregator
(:class:`training.methods.baselines.MaskedAggregator`) takes the same terms one
client at a time (the engine keeps no per-client copies), and both add up through
the one accumulator :class:`~training.methods.slicing.SelectionAverage`, so the rule
that runs is the rule these functions state (Flower's strategies over pure
``aggregate`` functions, streamed).

- FedAvg (:func:`fedavg_term`): weight |D_m|, every client holds everything;
- ReeFL and the depth baselines (:func:`held_term`): weight |D_m| over the clients whose
  sub-model holds the parameter (stage k's entries are held by clients of exit >= k;
  Ree, the shared classifier and anything outside a stage by all);
- FLAME patience-conscious (:func:`patience_term`): weight p_m; exit-conscious
  (:func:`exit_conscious_term`): weight e_m (the client's average training exit);
- FLAME exit-based (:func:`exit_based_term`): layer l averaged over the clients with e_m >= l,
  equal weights;
- ScaleFL: entrywise over the clients whose width-sliced sub-model contains the entry
  (:func:`training.methods.baselines.width_holds`).

An entry no client holds keeps its global value. Integer entries (BatchNorm
counts) take the largest count among the holders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from training.methods.slicing import Holds, SelectionAverage, holds_all

_STAGE_KEY = re.compile(r"^stage_list\.(\d+)\.")

Term = tuple[float, Holds]
"""One client's part in a rule: its weight and what it holds."""


def key_exit(key: str) -> int | None:
    """The exit whose stage owns ``key`` (1-based), or None for entries outside every stage (shared)."""
    m = _STAGE_KEY.match(key)
    return int(m.group(1)) + 1 if m else None


def held_by_exit(max_exit: float) -> Holds:
    """Entries of stages 1..floor(max_exit) plus the shared ones."""
    return lambda key, value: (key_exit(key) or 1) <= max_exit


def fedavg_term(size: float) -> Term:
    return float(size), holds_all


def held_term(size: float, max_exit: float) -> Term:
    return float(size), held_by_exit(max_exit)


def patience_term(patience: int) -> Term:
    return float(patience), holds_all


def exit_conscious_term(avg_exit: float) -> Term:
    return float(avg_exit), holds_all


def exit_based_term(avg_exit: float) -> Term:
    return 1.0, held_by_exit(avg_exit)


@torch.no_grad()
def average_terms(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], terms: Sequence[Term]
) -> dict[str, Tensor]:
    """sum_m w_m [m holds] W_m / sum_m w_m [m holds] per entry; entries nobody holds keep the global value."""
    avg = SelectionAverage()
    for state, (weight, holds) in zip(states, terms):
        avg.add_masked(global_state, state, weight, holds)
    out = {k: v.clone() for k, v in global_state.items()}
    avg.write(out)
    return out


def masked_average(
    global_state: Mapping[str, Tensor],
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    holds: Sequence[Holds] | None = None,
) -> dict[str, Tensor]:
    """:func:`average_terms` with the weights and holds given apart (every client holds all by default)."""
    return average_terms(global_state, states, list(zip(weights, holds or [holds_all] * len(states))))


def fedavg(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], sizes: Sequence[float]
) -> dict[str, Tensor]:
    return average_terms(global_state, states, [fedavg_term(s) for s in sizes])


def held_average(
    global_state: Mapping[str, Tensor],
    states: Sequence[Mapping[str, Tensor]],
    sizes: Sequence[float],
    max_exits: Sequence[int],
) -> dict[str, Tensor]:
    """ReeFL: per parameter over the clients that hold it, weighted by their samples."""
    return average_terms(global_state, states, [held_term(s, e) for s, e in zip(sizes, max_exits)])


def patience_conscious(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], patiences: Sequence[int]
) -> dict[str, Tensor]:
    return average_terms(global_state, states, [patience_term(p) for p in patiences])


def exit_conscious(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], avg_exits: Sequence[float]
) -> dict[str, Tensor]:
    return average_terms(global_state, states, [exit_conscious_term(e) for e in avg_exits])


def exit_based(
    global_state: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], avg_exits: Sequence[float]
) -> dict[str, Tensor]:
    """Layer l (the stage of exit l, its head included) over the clients whose average exit e_m >= l."""
    return average_terms(global_state, states, [exit_based_term(e) for e in avg_exits])


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
