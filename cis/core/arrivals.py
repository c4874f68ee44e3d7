"""Arrival processes, written once: each yields the absolute times (seconds, increasing) of one stream of requests.

The simulator draws a node's local requests from them (:mod:`cis.sim.arrivals` adds traces read from files) and
the load generator its send times (``cis bench --arrivals``, :mod:`cis.runtime.loadgen`):

- ``poisson``: exponential gaps with mean 1/rate;
- ``deterministic``: one request every 1/rate seconds (the load generator's ``uniform``);
- ``mmpp``: a two-state Markov-modulated Poisson process (bursty): the stream alternates between a quiet and a
  busy state, each held for an exponential time with mean ``dwell`` seconds; the busy rate is ``ratio`` times
  the quiet rate and the long-run mean is ``rate``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from cis.core.streams import uniforms, unit_exponentials


def poisson(rate: float, rng: np.random.Generator) -> Iterator[float]:
    t = 0.0
    for gap in unit_exponentials(rng):
        t += gap / rate
        yield t


def deterministic(rate: float) -> Iterator[float]:
    k = 0
    while True:
        k += 1
        yield k / rate


def mmpp_rates(rate: float, ratio: float) -> tuple[float, float]:
    """(quiet, busy) rates with busy = ratio * quiet and, with equal mean dwell times, mean ``rate``."""
    quiet = 2.0 * rate / (1.0 + ratio)
    return quiet, quiet * ratio


def mmpp(rate: float, ratio: float, dwell: float, rng: np.random.Generator) -> Iterator[float]:
    """Arrivals of a two-state MMPP. Both the gaps and the dwell times are
    memoryless, so at a state switch the next gap is simply drawn afresh."""
    rates = mmpp_rates(rate, ratio)
    draws = unit_exponentials(rng)
    state = int(next(uniforms(rng)) < 0.5)
    t, switch = 0.0, next(draws) * dwell
    while True:
        gap = next(draws) / rates[state]
        if t + gap < switch:
            t += gap
            yield t
        else:
            t, state = switch, 1 - state
            switch = t + next(draws) * dwell


def send_offsets(times: Iterator[float], count: int | None = None, until: float | None = None) -> Iterator[float]:
    """Offsets from the first arrival (request 0 goes at 0) of the first ``count`` arrivals of a process, or of
    those less than ``until`` seconds after the first (give one of the two), one at a time as they are asked for
    (a long ``until`` holds none ahead)."""
    if (count is None) == (until is None):
        raise ValueError("send_offsets: give count or until")
    first = next(times)
    if count is not None:
        rest: Iterator[float] = itertools.islice(times, count - 1)
    else:
        end = first + float(until or 0.0)
        rest = itertools.takewhile(lambda t: t < end, times)
    return itertools.chain([0.0], (t - first for t in rest))


def send_times(times: Iterator[float], count: int | None = None, until: float | None = None) -> np.ndarray:
    """All of :func:`send_offsets` in one array."""
    return np.fromiter(send_offsets(times, count, until), dtype=float)
