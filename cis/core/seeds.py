"""The one range of seeds that every part of cis takes (flags, config files, the Python API).

numpy's legacy ``RandomState`` and scikit-learn take unsigned 32-bit seeds, and a negative one is a numpy traceback
deep inside a run; so a seed is checked where it comes in, against this range. No numpy here: the command line
imports this module before it knows whether it needs numpy.
"""

from __future__ import annotations

MAX_SEED = 2**32 - 1


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed: an integer (not a bool) in 0..MAX_SEED."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED
