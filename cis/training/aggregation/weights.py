"""Aggregation weights Lambda~ (one per exit, summing to 1) for Algorithm 1.

- ``equal``: 1/E each.
- ``flops``: weight_e = min(t/T, flops_e / flops_E) for round t of T (Kaya et
  al.'s SDN schedule as the authors' code uses it), renormalised: equal weights
  in the first round, growing into FLOPs proportions by the last.
- ``serving-rate``: Lambda~ = Lambda (the spec's exit serving rates), normalised.
- ``serving-ramp`` / ``balanced-ramp`` (beyond the paper; issue 22): flops's schedule with the
  serving-rate (balanced-adj) weights as its target: weight_e = min(t/T, target_e / max target),
  renormalised, so training starts at equal weights (every exit supervises the shared early
  stages) and ends at the target weights.
- ``balanced-adj``: the mean of the normalised serving rates and of
  opt_e proportional to 1 / (sigma_e * sqrt(sum_{i in C_e} (|S_i| / |S_{e,p}|)^2)),
  where sigma_e^2 is the per-exit gradient variance (cis/training/grad_variance.py).
  Under ``--algorithm authors-code`` the authors' own formula (their ERR_MIN_BIAS_OPT_MEAN):
  opt_e = 1 / (sigma_e^2 * sum_{i: E_i = e} (|S_i| / sum_{j: E_j = e} |S_j|)^2), over the nodes
  whose own exit is e, with their hard-coded Appendix-C constants as sigma where the exits sit
  after conv layers 3, 9, 17 or 9, 13, 17 of ResNet-18 (:data:`APPENDIX_C_SIGMA`).
- an explicit vector (``explicit`` with ``vector=[...]``), normalised.
- ``auto`` (beyond the paper; issue 22): a rule on the serving rates (:func:`auto_choice`):
  ``flops`` where the last exit serves more requests than the first, the ``serving-ramp`` schedule
  otherwise; each is what the development seeds' validation splits picked in such a cell
  (docs/training.md). No pilots: it costs exactly one run, and at 33-33-33 it IS equal weighting.

A :class:`Weights` object answers ``at(t)`` (1-based round) so that
round-dependent schedules (flops) and constant ones share one interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np

from cis.core.errors import CisError

STRATEGIES = ("equal", "flops", "serving-rate", "balanced-adj", "serving-ramp", "balanced-ramp", "explicit", "auto")
RAMPS = {"serving-ramp": "serving-rate", "balanced-ramp": "balanced-adj"}  # a ramp strategy -> its target's
BALANCED_RULES = ("printed", "authors-code")
APPENDIX_C_SIGMA = {  # the authors' code: ResNet-18 exits (residual blocks) -> the constants it squares as sigma_e
    (1, 4, 8): (0.00374, 0.00224, 0.00101),  # "layers 3, 9, 17" (CIFAR-10)
    (4, 6, 8): (0.00216, 0.00126, 0.00101),  # "layers 9, 13, 17" (CIFAR-100)
}


def normalise(v: Sequence[float] | np.ndarray, what: str = "weights") -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.ndim != 1 or not len(a) or (a < 0).any() or not np.isfinite(a).all() or a.sum() <= 0:
        raise CisError(f"{what} {list(map(float, a.ravel()))}: expected non-negative finite values with a positive sum")
    return a / a.sum()


def equal_weights(num_exits: int) -> np.ndarray:
    return np.full(num_exits, 1.0 / num_exits)


FLAT_TOLERANCE = 1e-6  # auto: shares of the first and last exit closer than this are one split (equal)


def auto_choice(exit_serving_rate: Sequence[float]) -> str:
    """What ``auto`` runs for these serving rates: ``flops`` where the last exit serves more than the first
    (back-heavy), else ``serving-ramp``.

    The rule is the development seeds' validation pick per Table 1 cell (issue 22; 2 seeds, seeds 6-7):
    serving-ramp at 80-15-5, flops at 5-15-80, and at 33-33-33 both ramps are near equal (serving-ramp IS
    equal there). Why: where the cheap exit serves most, its weight must grow (serving-rate's gain); where
    the last exit serves most, in our optimisation-limited regime, the last exit is trained best by keeping
    the lower exits' supervision of the shared stages (flops ends at about 0.09/0.31/0.59 on paper-7), not by
    giving it 0.8 (serving-rate's exit 3 is the worst of the four strategies at 5-15-80).
    """
    lam = serving_rate_weights(exit_serving_rate)
    # a flat split is not back-heavy: 33-33-33's rates come out of the rate recurrence a few 1e-11 apart
    return "flops" if lam[-1] > lam[0] + FLAT_TOLERANCE else "serving-ramp"


def ramp_weights(
    target: Sequence[float] | np.ndarray, t: int, total_rounds: int, what: str = "ramp weights"
) -> np.ndarray:
    """min(t/T, target_e / max target), renormalised (t is 1-based): equal at first, the target's shape at t = T."""
    f = np.asarray(target, dtype=np.float64)
    tau = min(1.0, max(t, 1) / max(total_rounds, 1))
    return normalise(np.minimum(tau, f / f.max()), what)


def flops_weights(flops: Sequence[float], t: int, total_rounds: int) -> np.ndarray:
    """min(t/T, flops_e/flops_E), renormalised (t is 1-based)."""
    return ramp_weights(flops, t, total_rounds, "flops weights")


def serving_rate_weights(exit_serving_rate: Sequence[float]) -> np.ndarray:
    return normalise(exit_serving_rate, "exit serving rates")


def balanced_adj_weights(
    exit_serving_rate: Sequence[float], sigma: Sequence[float], matrix: np.ndarray, sizes: Sequence[int]
) -> np.ndarray:
    """(Lambda/sum Lambda + opt/sum opt) / 2 with opt_e = 1 / (sigma_e sqrt(sum_{i in C_e} (|S_i|/|S_e,p|)^2))."""
    lam = serving_rate_weights(exit_serving_rate)
    sig = np.asarray(sigma, dtype=np.float64)
    if len(sig) != len(lam) or (sig <= 0).any():
        raise CisError(f"balanced-adj sigma {sig.tolist()}: expected {len(lam)} positive standard deviations")
    s = np.asarray(sizes, dtype=np.float64)
    member = np.asarray(matrix) > 0  # (N, E): i in C_e
    opt = np.zeros(len(lam))
    for e in range(len(lam)):
        se = s[member[:, e]]
        if len(se):
            opt[e] = 1.0 / (sig[e] * np.sqrt(((se / se.sum()) ** 2).sum()))
    return (lam + normalise(opt, "balanced-adj opt")) / 2.0


def authors_balanced_weights(
    exit_serving_rate: Sequence[float], sigma: Sequence[float], node_exits: Sequence[int], sizes: Sequence[int]
) -> np.ndarray:
    """The authors' code: (Lambda/sum + opt/sum)/2, opt_e = 1 / (sigma_e^2 sum_{i: E_i = e} share_i^2), share_i =
    |S_i| / sum_{j: E_j = e} |S_j| (on paper-7 with equal layers: 0.25^2 x 4, 0.5^2 x 2, 1)."""
    lam = serving_rate_weights(exit_serving_rate)
    sig = np.asarray(sigma, dtype=np.float64)
    if len(sig) != len(lam) or (sig <= 0).any():
        raise CisError(f"balanced-adj sigma {sig.tolist()}: expected {len(lam)} positive standard deviations")
    s, own = np.asarray(sizes, dtype=np.float64), np.asarray(node_exits)
    opt = np.zeros(len(lam))
    for e in range(len(lam)):
        se = s[own == e + 1]
        if len(se):
            opt[e] = 1.0 / (sig[e] ** 2 * ((se / se.sum()) ** 2).sum())
    return (lam + normalise(opt, "balanced-adj opt")) / 2.0


@dataclass
class Weights:
    """Lambda~ for every round."""

    strategy: str
    num_exits: int
    constant: np.ndarray | None = None
    flops: list[float] | None = None
    total_rounds: int = 1
    details: dict = field(default_factory=dict)
    ramp_to: np.ndarray | None = None  # serving-ramp / balanced-ramp: the weights the ramp ends at

    def at(self, t: int) -> np.ndarray:
        if self.flops is not None:
            return flops_weights(self.flops, t, self.total_rounds)
        if self.ramp_to is not None:
            return ramp_weights(self.ramp_to, t, self.total_rounds)
        return cast(np.ndarray, self.constant)  # make_weights sets constant wherever flops and ramp_to are None

    def describe(self) -> dict:
        """JSON for the run: the strategy, its first- and last-round weights and its inputs."""
        return {
            "strategy": self.strategy,
            "first_round": self.at(1).tolist(),
            "last_round": self.at(self.total_rounds).tolist(),
            **self.details,
        }


def make_weights(
    strategy: str,
    num_exits: int,
    *,
    total_rounds: int = 1,
    exit_serving_rate: Sequence[float] | None = None,
    flops: Sequence[float] | None = None,
    sigma: Sequence[float] | None = None,
    matrix: np.ndarray | None = None,
    sizes: Sequence[int] | None = None,
    vector: Sequence[float] | None = None,
    balanced_rule: str = "printed",
    node_exits: Sequence[int] | None = None,
) -> Weights:
    """The Weights of ``strategy``; ``balanced_rule`` "authors-code" takes the authors' balanced-adj formula
    (it needs ``node_exits``, each node's own exit)."""
    if strategy == "auto":
        choice = auto_choice(_given(exit_serving_rate, "exit_serving_rate", strategy))
        chosen = make_weights(
            choice, num_exits, total_rounds=total_rounds, exit_serving_rate=exit_serving_rate, flops=flops
        )
        chosen.strategy, chosen.details["auto"] = "auto", choice
        return chosen
    if strategy == "equal":
        return Weights(strategy, num_exits, equal_weights(num_exits), total_rounds=total_rounds)
    if strategy in RAMPS:
        try:
            target = make_weights(
                RAMPS[strategy], num_exits, exit_serving_rate=exit_serving_rate, sigma=sigma, matrix=matrix,
                sizes=sizes, balanced_rule=balanced_rule, node_exits=node_exits,
            )
        except CisError as exc:
            raise CisError(f"strategy {strategy} (a ramp to {RAMPS[strategy]}): {exc}") from None
        return _ramp(strategy, num_exits, total_rounds, target)
    if strategy == "flops":
        if flops is None or len(flops) != num_exits:
            raise CisError(f"strategy flops: expected {num_exits} per-exit FLOPs")
        return Weights(
            strategy, num_exits, None, [float(f) for f in flops], total_rounds, {"flops": [float(f) for f in flops]}
        )
    if strategy == "serving-rate":
        rates = _given(exit_serving_rate, "exit_serving_rate", strategy)
        lam = serving_rate_weights(rates)
        return Weights(
            strategy,
            num_exits,
            lam,
            total_rounds=total_rounds,
            details={"exit_serving_rate": list(map(float, rates))},
        )
    if strategy == "balanced-adj":
        return _balanced_adj(
            num_exits, total_rounds, exit_serving_rate, sigma, matrix, sizes, balanced_rule, node_exits
        )
    if strategy == "explicit":
        if vector is None or len(vector) != num_exits:
            raise CisError(f"strategy explicit: weights {vector!r}, expected {num_exits} values (one per exit)")
        return Weights(strategy, num_exits, normalise(vector, "explicit weights"), total_rounds=total_rounds)
    raise CisError(f"strategy {strategy!r}: unknown, expected one of {', '.join(STRATEGIES)}")


T = TypeVar("T")


def _given(value: T | None, name: str, strategy: str) -> T:
    """``value``, which ``strategy`` needs: one clear error where a caller left it out (cis train always gives it)."""
    if value is None:
        raise CisError(f"strategy {strategy}: needs {name} (make_weights(..., {name}=...))")
    return value


def _ramp(strategy: str, num_exits: int, total_rounds: int, target: Weights) -> Weights:
    """A ramp from equal weights towards ``target``'s shape, reached at the last round (:func:`ramp_weights`)."""
    return Weights(
        strategy, num_exits, None, total_rounds=total_rounds, ramp_to=target.constant,
        # the target is serving-rate's or balanced-adj's Weights, which always have a constant
        details={**target.details, "ramp_to": cast(np.ndarray, target.constant).tolist()},
    )


def _balanced_adj(
    num_exits: int,
    total_rounds: int,
    exit_serving_rate: Sequence[float] | None,
    sigma: Sequence[float] | None,
    matrix: np.ndarray | None,
    sizes: Sequence[int] | None,
    balanced_rule: str,
    node_exits: Sequence[int] | None,
) -> Weights:
    """balanced-adj as printed, or the authors' formula (``balanced_rule`` "authors-code")."""
    rates, sig = _given(exit_serving_rate, "exit_serving_rate", "balanced-adj"), _given(sigma, "sigma", "balanced-adj")
    n_sizes = _given(sizes, "sizes", "balanced-adj")
    if balanced_rule == "authors-code":
        w = authors_balanced_weights(rates, sig, _given(node_exits, "node_exits", "balanced-adj"), n_sizes)
    else:
        w = balanced_adj_weights(rates, sig, _given(matrix, "matrix", "balanced-adj"), n_sizes)
    return Weights(
        "balanced-adj",
        num_exits,
        w,
        total_rounds=total_rounds,
        details={
            "exit_serving_rate": list(map(float, rates)),
            "sigma": list(map(float, sig)),
            **({"rule": balanced_rule} if balanced_rule != "printed" else {}),
        },
    )
