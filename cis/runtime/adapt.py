"""Online threshold control (``cis serve --adapt``).

A node should forward a target share of what reaches it (from the rate
calculus: transfer_rate / incoming). When the confidence distribution of the
traffic changes, fixed thresholds drift away from that share. This controller
watches the forwarded share (an exponential moving average over decided
samples) and moves the threshold against the error: forwarding too much lowers
the threshold, too little raises it. Pure and clock-free, so it is tested alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ThresholdController:
    target: float  # wanted forwarded share in [0, 1]
    threshold: float  # current threshold on the confidence measure
    gain: float = 0.05  # threshold change per unit of share error per update
    smoothing: float = 0.01  # EMA weight of one decided sample
    low: float = 0.0
    high: float = 1.0
    share: float | None = None  # EMA of the forwarded share
    updates: int = 0

    def update(self, forwarded: int, decided: int) -> float:
        """Feed one batch's counts (forwarded of decided samples); returns the new threshold."""
        if decided <= 0:
            return self.threshold
        alpha = 1.0 - (1.0 - self.smoothing) ** decided
        observed = forwarded / decided
        self.share = observed if self.share is None else (1 - alpha) * self.share + alpha * observed
        if not math.isfinite(self.threshold):
            self.threshold = self.high if self.threshold > 0 else self.low
        self.threshold = min(
            self.high, max(self.low, self.threshold - self.gain * (self.share - self.target) * min(decided, 32) / 8)
        )
        self.updates += 1
        return self.threshold

    def to_json(self) -> dict:
        return {
            "target_forwarded_share": self.target,
            "threshold": self.threshold,
            "forwarded_share_ema": self.share,
            "updates": self.updates,
        }
