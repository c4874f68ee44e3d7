"""The server update of Algorithm 1 (line 12) as small pure functions over state dicts.

    w <- Pi_W( w + eta_s * sum_{(i,e)} c_ie * (w_ie - w) ),
    c_ie = Lambda~_e * |S_i| / (|S_{e,p}| * p_ie)        (paper, default)
    c_ie = Lambda~_e * |S_i| * p_ie / |S_{e,p}|          (authors' code, option "multiply")

Not renormalised per parameter: a parameter that only the pairs of exit 3 touch
moves by Lambda~_3 times their average pseudo-gradient. BatchNorm running
statistics (``running_mean``, ``running_var``) are floating-point buffers and
get the same update where it stays a convex combination (``bn_rule`` below);
Pi_W is applied only where a value leaves its domain: ``running_var`` is
clipped at 0. ``num_batches_tracked`` (an integer
count, only used by BatchNorm with ``momentum=None``) is not a weighted sum: the
server takes the largest count among the contributing copies, i.e. the global
count advances by the local steps of the pair that trained that layer longest.

``p_ie`` here is the probability that the pair (i, e) is in the round's sample:
p from the sampling matrix times the participation probability of node i.

Two diagnostic departures from line 12 (options, not defaults; bench/table2.py
compares them, docs/training.md says when each helps):

- coefficient rule ``capped``: c_ie <- min(c_ie, 1), so no pair moves the global
  model past its own local model;
- coefficient rule ``self-normalised``: c_ie = Lambda~_e |S_i| / sum of |S_j| over the
  round's pairs (j, e) at the same exit, i.e. a FedAvg-style data-weighted mean per
  exit, scaled by Lambda~_e (p_ie no longer enters: the estimator is biased but its
  total per exit is Lambda~_e in every round in which exit e was trained).

The authors' code (``--algorithm authors-code``, :func:`aliased_update`) does not
run line 12 as printed: the global model IS the root's model object, which the root
trains in place, so the round's reference is the root's trained weights, not the
round's start:

    w <- w_root + sum over the other pairs (c, e) of c_ce * (w_ce - w_root)   on the parts c trained,
    c_ce = Lambda~_e |S_c| p_ce / |S_{e,p}|

(the root's own update enters with weight 1 whatever Lambda~ and p are; a pair moves
only the bodies of stages 1..e and head e, which is all the authors' loop touches;
BatchNorm statistics get the same update; ``num_batches_tracked`` is the root's).
Their released loop writes head e's difference into ``classifiers[L_e - 1]`` but applies
``classifiers[L_k]`` (L_k: the layers with an exit), so a non-root pair's head update never
reaches the model; ``head_update`` "released-code" drops it the same way (a diagnostic; the
default applies it, as the loop's comment and the paper intend; docs/training.md).

BatchNorm running statistics (``bn_rule``; the project's choice, issue 17):

- ``convex`` (default): line 12's step, shortened where it would overshoot. With
  C = eta_s * sum of c_ie over the pairs whose copy of the statistic moved (they ran
  that layer), a running statistic becomes s + C' / C * sum c_ie (s_ie - s) / sum c_ie
  with C' = min(C, 1): exactly line 12 wherever C <= 1 (always at p = 0, where the
  coefficients of the pairs sharing a layer sum to at most 1), and the
  coefficient-weighted mean of the moved copies where C > 1. Either way a convex
  combination of measured statistics, so a variance can never turn negative. Weights
  keep line 12 as written: the paper's update is unbiased for them; a statistic is a
  mean of measurements, and an extrapolated variance below 0 is no variance at all
  (the literal rule clamped 32 of them in a 60-round p = 0.2 run).
- ``literal``: the same update as the weights (the notes; the authors' code), then
  the projection running_var >= 0.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from cis.training.cis_options import BN_RULES, COEFFICIENT_RULES, P_MODES

OVERSHOOT_TOL = (
    1e-9  # a total coefficient of 1 summed in floating point is not an overshoot (p = 0 stays line 12 exactly)
)


def pair_coefficient(weight_e: float, size_i: float, exit_size_e: float, p_ie: float, mode: str = "divide") -> float:
    """c_ie = Lambda~_e |S_i| / (|S_{e,p}| p_ie) (mode "divide") or with p_ie multiplied ("multiply")."""
    if mode not in P_MODES:
        raise ValueError(f"p mode {mode!r}: expected one of {P_MODES}")
    if p_ie <= 0 or exit_size_e <= 0:
        raise ValueError(f"pair with p_ie={p_ie}, |S_e,p|={exit_size_e}: cannot have been sampled")
    base = weight_e * size_i / exit_size_e
    return base / p_ie if mode == "divide" else base * p_ie


def round_coefficients(
    pairs: Sequence[tuple[int, int]],
    weights: Sequence[float] | np.ndarray,
    sizes: Sequence[float],
    exit_sizes: Sequence[float] | np.ndarray,
    p_pair: Sequence[float],
    mode: str = "divide",
    rule: str = "literal",
) -> list[float]:
    """c_ie of every (node i, exit e) pair of a round (``p_pair[k]`` is p_ie of ``pairs[k]``)."""
    if rule not in COEFFICIENT_RULES:
        raise ValueError(f"coefficient rule {rule!r}: expected one of {COEFFICIENT_RULES}")
    if rule == "self-normalised":
        trained: dict[int, float] = {}
        for i, e in pairs:
            trained[e] = trained.get(e, 0.0) + float(sizes[i])
        return [float(weights[e - 1]) * float(sizes[i]) / trained[e] for i, e in pairs]
    coefs = [
        pair_coefficient(float(weights[e - 1]), float(sizes[i]), float(exit_sizes[e - 1]), float(p), mode)
        for (i, e), p in zip(pairs, p_pair)
    ]
    return [min(c, 1.0) for c in coefs] if rule == "capped" else coefs


def coefficient_totals(
    pairs: Sequence[tuple[int, int]], coefs: Sequence[float], num_exits: int
) -> dict[str, list[float]]:
    """How far a round moves each part of an early-exit model, as a total coefficient.

    ``stage[k-1]``: sum of c_ie over the pairs with e >= k (they all train the body of
    stage k); ``head[k-1]``: sum over the pairs with e == k (only they train head k).
    Line 12 at p = 0 gives head k a total of Lambda~_k; a total above 1 moves that part
    past the average local model.
    """
    stage, head = [0.0] * num_exits, [0.0] * num_exits
    for (_, e), c in zip(pairs, coefs):
        head[e - 1] += c
        for k in range(e):
            stage[k] += c
    return {"stage": stage, "head": head}


def is_running_stat(name: str) -> bool:
    """BatchNorm running statistics: measured on the data, not trained."""
    return name.endswith(("running_mean", "running_var"))


def is_averaged(name: str, t: Tensor) -> bool:
    """Tensors that get the weighted update: every floating-point entry of the state."""
    return t.is_floating_point()


def zeros_like_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An accumulator for :func:`accumulate`: zeros for averaged tensors, copies of the counts."""
    return {k: (torch.zeros_like(v) if is_averaged(k, v) else v.clone()) for k, v in state.items()}


@torch.no_grad()
def accumulate(
    acc: dict[str, Tensor],
    local: Mapping[str, Tensor],
    global_state: Mapping[str, Tensor],
    coef: float,
    stat_weight: dict[str, float] | None = None,
) -> None:
    """acc += coef * (local - global) in place; integer counts keep their maximum.

    With ``stat_weight`` (bn_rule ``convex``), also adds ``coef`` to the running
    statistics' total coefficient wherever this pair's copy moved (it ran that layer).
    """
    for k, a in acc.items():
        lv, gv = local[k], global_state[k]
        if is_averaged(k, a):
            if coef != 0.0:
                a.add_(lv, alpha=coef).sub_(gv, alpha=coef)  # two in-place ops, no temporary
            if stat_weight is not None and is_running_stat(k) and not torch.equal(lv, gv):
                stat_weight[k] = stat_weight.get(k, 0.0) + coef
        else:
            torch.maximum(a, lv, out=a)


@torch.no_grad()
def apply_update(
    global_state: dict[str, Tensor],
    acc: Mapping[str, Tensor],
    server_lr: float = 1.0,
    stat_weight: Mapping[str, float] | None = None,
) -> int:
    """global += server_lr * acc in place, then the projection Pi_W (running_var >= 0); counts take acc's value.

    With ``stat_weight`` (bn_rule ``convex``) a running statistic's step is
    shortened to min(server_lr, 1 / total coefficient) where the total exceeds 1, so it
    stays a convex combination. Returns how many running_var entries the projection
    clamped at 0.
    """
    clamped = 0
    for k, g in global_state.items():
        a = acc[k]
        if is_averaged(k, g):
            step = server_lr
            if (
                stat_weight is not None
                and is_running_stat(k)
                and server_lr * stat_weight.get(k, 0.0) > 1.0 + OVERSHOOT_TOL
            ):
                step = 1.0 / stat_weight[k]
            g.add_(a, alpha=step)
            if k.endswith("running_var"):
                clamped += int((g < 0).sum())
                g.clamp_(min=0.0)
        else:
            g.copy_(a)
    return clamped


def aggregate(
    global_state: Mapping[str, Tensor],
    updates: Sequence[tuple[Mapping[str, Tensor], float]],
    server_lr: float = 1.0,
    bn_rule: str = "convex",
) -> dict[str, Tensor]:
    """Line 12 as one pure function: a new state from the global one and [(local state, c_ie)]."""
    if bn_rule not in BN_RULES:
        raise ValueError(f"bn rule {bn_rule!r}: expected one of {BN_RULES}")
    out = {k: v.clone() for k, v in global_state.items()}
    acc = zeros_like_state(global_state)
    stat_weight: dict[str, float] | None = {} if bn_rule == "convex" else None
    for local, coef in updates:
        accumulate(acc, local, global_state, coef, stat_weight)
    apply_update(out, acc, server_lr, stat_weight)
    return out


# ---------------------------------------------------------------- the authors' code: the root's model is the reference


def accumulate_aliased(
    acc: dict[str, Tensor], totals: dict[str, float], local: Mapping[str, Tensor], keys: Collection[str], coef: float
) -> None:
    """acc[k] += coef * local[k] and totals[k] += coef for the floating-point entries ``keys`` a pair trained."""
    for k in keys:
        if is_averaged(k, acc[k]):
            acc[k].add_(local[k], alpha=coef)
            totals[k] = totals.get(k, 0.0) + coef


@torch.no_grad()
def apply_aliased(
    global_state: dict[str, Tensor],
    reference: Mapping[str, Tensor],
    acc: Mapping[str, Tensor],
    totals: Mapping[str, float],
    server_lr: float = 1.0,
) -> None:
    """global <- w_ref + server_lr * (acc - K * w_ref) with K the per-tensor total coefficient, i.e.
    w_ref + server_lr * sum c (w_c - w_ref); integer counts take the reference's value."""
    for k, g in global_state.items():
        ref = reference[k]
        if is_averaged(k, g):
            step = acc[k] - totals.get(k, 0.0) * ref
            g.copy_(ref).add_(step, alpha=server_lr)
        else:
            g.copy_(ref)


def aliased_update(
    reference: Mapping[str, Tensor],
    updates: Sequence[tuple[Mapping[str, Tensor], float, Collection[str]]],
    server_lr: float = 1.0,
) -> dict[str, Tensor]:
    """The authors' code's server update as one pure function.

    ``reference`` is the root's model after its local training (the round's start if the root
    did not train); ``updates`` holds every other pair as (local state, c_ce, the state keys it
    trained). Returns w_ref + server_lr * sum c_ce (w_ce - w_ref) over each pair's keys.
    """
    out = {k: v.clone() for k, v in reference.items()}
    acc = {k: torch.zeros_like(v) for k, v in reference.items()}
    totals: dict[str, float] = {}
    for local, coef, keys in updates:
        accumulate_aliased(acc, totals, local, keys, coef)
    apply_aliased(out, reference, acc, totals, server_lr)
    return out


def aliased_totals(
    pairs: Sequence[tuple[int, int]],
    coefs: Sequence[float],
    num_exits: int,
    root: int | None,
    heads_applied: bool = True,
) -> dict[str, list[float]]:
    """:func:`coefficient_totals` of the authors' update: the parts the root trained total 1 (the
    root's own weight is 1 minus the others'), the rest the others' coefficients. ``heads_applied``
    False (head_update "released-code"): the other pairs move no head, so a head totals 1 where the
    root trained it and 0 elsewhere."""
    others = [(p, c) for p, c in zip(pairs, coefs) if p[0] != root]
    out = coefficient_totals([p for p, _ in others], [c for _, c in others], num_exits)
    if not heads_applied:
        out["head"] = [0.0] * num_exits
    for i, e in pairs:
        if i == root:
            for k in range(e):
                out["stage"][k] = 1.0
            out["head"][e - 1] = 1.0
    return out
