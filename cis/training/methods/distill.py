"""Knowledge-distillation terms of ReeFL and the early-exit baselines.

ReeFL (Eq. 5-6 and the binding notes): a client keeps an exponential moving
average (zeta = 0.2) of each exit's cross-entropy, reset at the start of each
local training call; the exit with the lowest average is the teacher, and every
other exit e in the client's budget gets tau^2 KL(softmax(y_t / tau) || softmax(y_e / tau))
against the detached teacher logits y_t (the KL of Eq. 6: teacher distribution
first). The weight eta ramps up as exp(-5 (1 - min(r, R)/R)^2), R = 300 rounds.

DepthFL: mutual self-distillation, every exit learns from each other exit
(teachers detached), averaged over the others. ScaleFL: the deepest exit of the
sub-model teaches the shallower ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from cis.training.methods.registry import KD_RAMP_ROUNDS

EMA_ZETA = 0.2


class RunningLoss:
    """L <- (1 - zeta) L + zeta L_new per exit; the first measurement initialises L."""

    def __init__(self, zeta: float = EMA_ZETA) -> None:
        self.zeta = zeta
        self.value: Tensor | None = None

    def update(self, losses: Sequence[float] | Tensor) -> Tensor:
        new = torch.as_tensor(losses, dtype=torch.float64).detach()
        self.value = new.clone() if self.value is None else ema(self.value, new, self.zeta)
        return self.value

    def teacher(self) -> int:
        """0-based index of the exit with the lowest running loss."""
        if self.value is None:
            raise RuntimeError("RunningLoss.teacher() before any update")
        return int(torch.argmin(self.value))


def ema(old: Tensor, new: Tensor, zeta: float) -> Tensor:
    return (1.0 - zeta) * old + zeta * new


def ramp_weight(round: int, ramp_rounds: int = KD_RAMP_ROUNDS, max_weight: float = 1.0) -> float:
    """eta at round r: max_weight * exp(-5 (1 - min(r, R)/R)^2)."""
    frac = min(max(round, 0), ramp_rounds) / ramp_rounds
    return max_weight * math.exp(-5.0 * (1.0 - frac) ** 2)


def kl_to_teacher(student: Tensor, teacher: Tensor, tau: float = 1.0) -> Tensor:
    """tau^2 * mean over samples of KL(softmax(teacher / tau) || softmax(student / tau)); the teacher is detached."""
    log_p_teacher = F.log_softmax(teacher.detach() / tau, dim=-1)
    log_p_student = F.log_softmax(student / tau, dim=-1)
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * tau**2


def best_exit_kd(logits: Sequence[Tensor], teacher: int, tau: float = 1.0) -> Tensor:
    """ReeFL's Eq. 6: the KL of every exit but the teacher, summed."""
    terms = [kl_to_teacher(z, logits[teacher], tau) for e, z in enumerate(logits) if e != teacher]
    return torch.stack(terms).sum() if terms else logits[0].new_zeros(())


def mutual_kd(logits: Sequence[Tensor], tau: float = 1.0) -> Tensor:
    """DepthFL: sum over exits k of the mean over j != k of KL(p_j || p_k), p_j detached."""
    n = len(logits)
    if n < 2:
        return logits[0].new_zeros(())
    terms = [
        torch.stack([kl_to_teacher(logits[k], logits[j], tau) for j in range(n) if j != k]).mean() for k in range(n)
    ]
    return torch.stack(terms).sum()


def deepest_exit_kd(logits: Sequence[Tensor], tau: float = 3.0) -> Tensor:
    """ScaleFL: the sub-model's deepest exit teaches each shallower exit (summed)."""
    return best_exit_kd(logits, len(logits) - 1, tau)


def exit_cross_entropies(logits: Sequence[Tensor], y: Tensor) -> Tensor:
    """(E,) cross-entropy of each exit on the batch."""
    return torch.stack([F.cross_entropy(z, y) for z in logits])
