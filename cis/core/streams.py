"""Random streams for the simulator and the load generator: independent per purpose, drawn in chunks.

A SimPy model (or the load generator, :mod:`cis.runtime.loadgen`) asks for one number at a time;
asking numpy for one number per call costs more than the event itself. These generators draw a chunk at once
and hand out plain Python floats. Each node and purpose gets its own
``numpy.random.Generator`` spawned from the run's seed, so a run is repeatable
and changing one stream (say, the service distribution) leaves the arrivals alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CHUNK = 4096


def spawn(seed: int, count: int) -> list[np.random.Generator]:
    """``count`` independent generators from one seed."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def unit_exponentials(rng: np.random.Generator) -> Iterator[float]:
    """Exponential draws with mean 1, forever."""
    while True:
        yield from rng.standard_exponential(CHUNK).tolist()


def uniforms(rng: np.random.Generator) -> Iterator[float]:
    """Uniform draws on [0, 1), forever."""
    while True:
        yield from rng.random(CHUNK).tolist()


def indices(rng: np.random.Generator, n: int) -> Iterator[int]:
    """Uniform integers in [0, n), forever."""
    while True:
        yield from rng.integers(0, n, CHUNK).tolist()
