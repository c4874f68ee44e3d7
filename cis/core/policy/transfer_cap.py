"""The transfer cap (the paper's mu_max) enforced in time: a node forwards at most ``rate`` requests/s.

The runtime node and the simulator each hold one :class:`TokenBucket` per node.
"""

from __future__ import annotations

import math

DEFAULT_BURST_SECONDS = 10.0


class TokenBucket:
    """A token bucket that caps a node's forwarding at ``rate`` requests/s.

    ``burst`` tokens may be spent at once; a forward that finds no token is
    served locally instead (the paper's lambda_t <= mu_max). ``rate = inf``
    never limits; ``rate = 0`` never forwards.

    The default depth is ``DEFAULT_BURST_SECONDS`` of the cap (our choice; the
    paper constrains only the mean rate). Thresholds are calibrated so that a
    node's demand to forward equals its cap, and with Poisson arrivals a bucket
    of B tokens then refuses about 1/(B+1) of the forwards: one token would
    halve the designed forwarding, ten seconds of the cap keeps the loss near
    1 % at 10 requests/s while still bounding the long-run rate.
    """

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, self.rate * DEFAULT_BURST_SECONDS))
        self.tokens = self.burst
        self.stamp = now

    def take(self, now: float, n: float = 1.0) -> bool:
        if math.isinf(self.rate):
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def grant(self, now: float, n: int) -> int:
        """Take up to ``n`` tokens, one per sample: how many of the n samples may go (``take`` n times at once)."""
        if math.isinf(self.rate):
            return n
        self.take(now, 0.0)  # refill
        k = min(n, int(self.tokens))
        self.tokens -= k
        return k
