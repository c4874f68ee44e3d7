"""The confidence measures: how sure an exit is of its answer, per sample, in [0, 1] (higher is surer)."""

from __future__ import annotations

import math

import numpy as np

from cis.core.errors import CisError
from cis.core.spec import CONFIDENCE_MEASURES


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def confidence(logits: np.ndarray, measure: str = "max_softmax") -> np.ndarray:
    """Per-sample confidence in [0, 1] from logits of shape (N, C); higher is surer.

    - ``max_softmax``: the largest class probability;
    - ``entropy``: 1 - H(p) / log C (normalised entropy turned into a confidence);
    - ``margin``: the gap between the two largest probabilities.
    """
    if measure == "max_softmax":  # exp(z - max z) is exactly 1 at the top class, so max p = 1 / sum: fewer passes
        logits = np.asarray(logits)  # the ufuncs' own reductions: numpy's .max()/.sum() add a Python call each
        e = np.subtract(logits, np.maximum.reduce(logits, axis=-1, keepdims=True), dtype=np.float64)
        return 1.0 / np.add.reduce(np.exp(e, out=e), axis=-1)  # the same numbers as softmax(logits).max(-1)
    p = softmax(logits)
    if measure == "entropy":
        h = -(p * np.log(np.clip(p, 1e-12, 1.0))).sum(axis=-1)
        return 1.0 - h / math.log(p.shape[-1])
    if measure == "margin":
        top2 = np.partition(p, -2, axis=-1)[..., -2:]
        return top2[..., 1] - top2[..., 0]
    raise CisError(f"confidence measure {measure!r}: unknown; expected one of {', '.join(CONFIDENCE_MEASURES)}")
