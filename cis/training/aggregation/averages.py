"""Per-entry weighted averages: the rules of ReeFL, FLAME, the baselines and the nested methods.

Every rule here is a weighted average per state entry over the clients that hold the entry, and
every one adds up through the one accumulator :class:`SelectionAverage`. What a client holds is
either a mask over the full state (:data:`Holds`: the early-exit methods) or a selection of the
server's tensors (:data:`cis.training.selection.Selection`: the width-scaled methods; a mask is a
selection of the whole tensor with some elements left out). What a rule says about one client is
its :data:`Term`: the client's weight and what it holds. The pure functions below state each rule
on lists of states; the aggregators (:mod:`cis.training.aggregation.aggregators`) take the same terms
one client at a time (the engine keeps no per-client copies), so the rule that runs is the rule
these functions state (Flower's strategies over pure ``aggregate`` functions, streamed).

- FedAvg (:func:`fedavg_term`): weight |D_m|, every client holds everything;
- ReeFL and the depth baselines (:func:`held_term`): weight |D_m| over the clients whose
  sub-model holds the parameter (stage k's entries are held by clients of exit >= k;
  Ree, the shared classifier and anything outside a stage by all);
- FLAME patience-conscious (:func:`patience_term`): weight p_m; exit-conscious
  (:func:`exit_conscious_term`): weight e_m (the client's average training exit);
- FLAME exit-based (:func:`exit_based_term`): layer l averaged over the clients with e_m >= l,
  equal weights;
- ScaleFL: entrywise over the clients whose width-sliced sub-model contains the entry
  (:func:`cis.training.methods.baselines.width_holds`);
- the nested methods (:func:`average_selections`): every uploaded element over the clients that
  uploaded it. For nested prefix selections this is NeFedAvg's ring-wise average (Algorithm 2, the
  ">=" reading): a ring that sub-models k, k+1, .. contain is averaged over all of their clients.
  Per-sub-model (decoupled) tensors live under their own global keys, so the same rule is FedAvg
  over that sub-model's clients.

An entry no client holds keeps its global value. Integer entries (BatchNorm counts) take the
largest count among the holders. InclusiveFL's momentum distillation of the server's update is
:func:`block_deltas_distilled`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from cis.training.selection import Selection, put_, take

Holds = Callable[[str, Tensor], "bool | Tensor"]
"""(key, value) -> does a client hold this entry of a full-size state: True, False or an entrywise mask."""


def holds_all(key: str, value: Tensor) -> bool:
    return True


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
