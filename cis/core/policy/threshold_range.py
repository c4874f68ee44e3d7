"""What a confidence threshold may be, for every place one is typed (``cis serve --threshold``, ``cis simulate
--threshold``): every confidence measure (:mod:`cis.core.policy.confidence`) lies in [0, 1], so a threshold is
in [0, 1], or ``inf`` (forward everything) or ``-inf`` (serve everything); NaN would answer nothing the same way
twice. No numpy here: the command line checks a flag before it loads anything.
"""

from __future__ import annotations

import math

THRESHOLD_EXPECTED = "a confidence in [0, 1], or inf (forward everything) or -inf (serve everything)"


def is_threshold(value: float) -> bool:
    """Whether ``value`` is a threshold a node can use: in [0, 1], or infinite."""
    return 0 <= value <= 1 or math.isinf(value)
