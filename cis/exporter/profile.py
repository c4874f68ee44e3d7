"""The two profiles a bundle carries for the simulator.

- confidence profile: per validation sample and exit, the confidence (the
  spec's measure, on the logits the bundle's graphs produce) and whether the
  exit's prediction is correct;
- latency profile: onnxruntime seconds per call of each stage at batch sizes
  1, 8 and 32 on the exporting machine (median over repeats).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np

from cis.core.bundle import TensorInfo
from cis.core.policy.exit_policy import confidence
from cis.core.stages.runner import StageRunner, stage_inputs

LATENCY_BATCHES = (1, 8, 32)


def confidence_profile(
    logits: Mapping[int, np.ndarray], labels: np.ndarray, measure: str
) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct), each (N, E), exits in order."""
    exits = sorted(logits)
    conf = np.stack([confidence(logits[e], measure) for e in exits], axis=1)
    correct = np.stack([np.asarray(logits[e]).argmax(-1) == labels for e in exits], axis=1)
    return conf, correct


def random_feeds(inputs: Sequence[TensorInfo], batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs of the right names, shapes and dtypes (values do not matter for timing). Wider integers are
    indices (token ids: an embedding's table has a row 0 whatever its size), so they are 0."""
    feeds = {}
    for t in inputs:
        shape = tuple(int(d) for d in (batch, *t.shape[1:]) if d is not None)  # a stage's sample shape is static
        dt = np.dtype(t.dtype)
        if dt.kind in "iu" and dt.itemsize > 1:
            feeds[t.name] = np.zeros(shape, dt)
        elif dt.kind == "i":
            feeds[t.name] = rng.integers(-128, 128, size=shape).astype(dt)
        else:
            feeds[t.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def median_seconds(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def latency_profile(
    runners: Sequence[StageRunner], batches: Sequence[int] = LATENCY_BATCHES, repeats: int = 20, seed: int = 0,
    x: np.ndarray | None = None,
) -> dict[int, dict[int, float]]:
    """{stage: {batch: median seconds per call}} with onnxruntime: on the carries of real samples ``x`` (a
    stage's time can depend on its values: a later stage ran 1.3-1.6 times longer on real carries than on
    random ones in bench/twin_spans.py), else on random inputs of the right shapes."""
    rng = np.random.default_rng(seed)
    real = {b: stage_inputs(runners, x, b) for b in batches} if x is not None and len(x) else None
    out: dict[int, dict[int, float]] = {}
    for k, runner in enumerate(runners):
        out[runner.index] = {}
        for b in batches:
            feeds = real[b][k] if real is not None else random_feeds(runner.info.inputs, b, rng)
            out[runner.index][b] = median_seconds(partial(runner.run, feeds), repeats)
    return out
