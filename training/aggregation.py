"""The server update of Algorithm 1 (line 12) as small pure functions over state dicts.

    w <- Pi_W( w + eta_s * sum_{(i,e)} c_ie * (w_ie - w) ),
    c_ie = Lambda~_e * |S_i| / (|S_{e,p}| * p_ie)        (paper, default)
    c_ie = Lambda~_e * |S_i| * p_ie / |S_{e,p}|          (authors' code, option "multiply")

Not renormalised per parameter: a parameter that only the pairs of exit 3 touch
moves by Lambda~_3 times their average pseudo-gradient. BatchNorm running
statistics (``running_mean``, ``running_var``) are floating-point buffers and
get exactly the same update; Pi_W is applied only where a value leaves its
domain: ``running_var`` is clipped at 0. ``num_batches_tracked`` (an integer
count, only used by BatchNorm with ``momentum=None``) is not a weighted sum: the
server takes the largest count among the contributing copies, i.e. the global
count advances by the local steps of the pair that trained that layer longest.

``p_ie`` here is the probability that the pair (i, e) is in the round's sample:
p from the sampling matrix times the participation probability of node i.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

P_MODES = ("divide", "multiply")


def pair_coefficient(weight_e: float, size_i: float, exit_size_e: float, p_ie: float, mode: str = "divide") -> float:
    """c_ie = Lambda~_e |S_i| / (|S_{e,p}| p_ie) (mode "divide") or with p_ie multiplied ("multiply")."""
    if mode not in P_MODES:
        raise ValueError(f"p mode {mode!r}: expected one of {P_MODES}")
    if p_ie <= 0 or exit_size_e <= 0:
        raise ValueError(f"pair with p_ie={p_ie}, |S_e,p|={exit_size_e}: cannot have been sampled")
    base = weight_e * size_i / exit_size_e
    return base / p_ie if mode == "divide" else base * p_ie


def is_averaged(name: str, t: Tensor) -> bool:
    """Tensors that get the weighted update: every floating-point entry of the state."""
    return t.is_floating_point()


def zeros_like_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An accumulator for :func:`accumulate`: zeros for averaged tensors, copies of the counts."""
    return {k: (torch.zeros_like(v) if is_averaged(k, v) else v.clone()) for k, v in state.items()}


@torch.no_grad()
def accumulate(acc: dict[str, Tensor], local: Mapping[str, Tensor], global_state: Mapping[str, Tensor], coef: float) -> None:
    """acc += coef * (local - global) in place; integer counts keep their maximum."""
    for k, a in acc.items():
        lv, gv = local[k], global_state[k]
        if is_averaged(k, a):
            if coef != 0.0:
                a.add_(lv, alpha=coef).sub_(gv, alpha=coef)  # two in-place ops, no temporary
        else:
            torch.maximum(a, lv, out=a)


@torch.no_grad()
def apply_update(global_state: dict[str, Tensor], acc: Mapping[str, Tensor], server_lr: float = 1.0) -> None:
    """global += server_lr * acc in place, then the projection Pi_W (running_var >= 0); counts take acc's value."""
    for k, g in global_state.items():
        a = acc[k]
        if is_averaged(k, g):
            g.add_(a, alpha=server_lr)
            if k.endswith("running_var"):
                g.clamp_(min=0.0)
        else:
            g.copy_(a)


def aggregate(
    global_state: Mapping[str, Tensor],
    updates: Sequence[tuple[Mapping[str, Tensor], float]],
    server_lr: float = 1.0,
) -> dict[str, Tensor]:
    """Line 12 as one pure function: a new state from the global one and [(local state, c_ie)]."""
    out = {k: v.clone() for k, v in global_state.items()}
    acc = zeros_like_state(global_state)
    for local, coef in updates:
        accumulate(acc, local, global_state, coef)
    apply_update(out, acc, server_lr)
    return out
