"""Arrival processes: each yields the absolute times (seconds) of one node's local requests.

- ``poisson``: exponential gaps with mean 1/rate;
- ``deterministic``: one request every 1/rate seconds;
- ``mmpp``: a two-state Markov-modulated Poisson process (bursty): the node
  alternates between a quiet and a busy state, each held for an exponential
  time with mean ``dwell`` seconds; the busy rate is ``ratio`` times the quiet
  rate and the long-run mean is ``rate``;
- a trace: timestamps read from a file, one per line, either ``timestamp`` or
  ``node_id,timestamp``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from cis.core.errors import CisError
from cis.sim.streams import uniforms, unit_exponentials

ARRIVALS = ("poisson", "deterministic", "mmpp")


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


def parse_trace(lines: Sequence[str], source: str) -> list[tuple[str | None, float]]:
    """(node id or None, timestamp) per line; blank lines and ``#`` comments are skipped."""
    out: list[tuple[str | None, float]] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        node = parts[0] if len(parts) == 2 else None
        t = _seconds(parts[-1]) if len(parts) <= 2 else None
        if t is None or node == "":
            raise CisError(
                f"trace {source} line {number}: {line!r}; expected 'timestamp' or 'node_id,timestamp' with a "
                "timestamp >= 0 in seconds"
            )
        out.append((node, t))
    if not out:
        raise CisError(f"trace {source}: no timestamps; expected one 'timestamp' or 'node_id,timestamp' per line")
    return out


def _seconds(text: str) -> float | None:
    try:
        t = float(text)
    except ValueError:
        return None
    return t if np.isfinite(t) and t >= 0 else None


def assign_trace(
    entries: Sequence[tuple[str | None, float]], rates: dict[str, float], rng: np.random.Generator, source: str
) -> dict[str, list[float]]:
    """Sorted arrival times per node. Untagged timestamps go to the nodes with
    local arrivals, chosen at random in proportion to their arrival rates."""
    senders = [n for n, r in rates.items() if r > 0]
    weights = np.array([rates[n] for n in senders])
    out: dict[str, list[float]] = {n: [] for n in rates}
    picks = (
        iter(rng.choice(len(senders), size=len(entries), p=weights / weights.sum()).tolist()) if senders else iter(())
    )
    for node, t in entries:
        if node is None:
            if not senders:
                raise CisError(
                    f"trace {source}: untagged timestamps but no node has an arrival_rate > 0; expected "
                    "'node_id,timestamp' lines"
                )
            node = senders[next(picks)]
        elif node not in out:
            raise CisError(f"trace {source}: unknown node {node!r}; expected one of {', '.join(rates)}")
        out[node].append(t)
    return {n: sorted(ts) for n, ts in out.items()}


def read_trace(path: str | Path, rates: dict[str, float], rng: np.random.Generator) -> dict[str, list[float]]:
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CisError(
            f"trace {path}: cannot read ({exc.__class__.__name__}); expected a text file of timestamps"
        ) from None
    return assign_trace(parse_trace(lines, str(path)), rates, rng, str(path))
