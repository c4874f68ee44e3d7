"""The simulator's arrivals: the times (seconds) of one node's local requests.

- ``poisson``, ``deterministic``, ``mmpp``: the arrival processes of :mod:`cis.core.arrivals` (written once:
  the load generator, ``cis bench``, draws its send times from the same ones);
- a trace: timestamps read from a file, one per line, either ``timestamp`` or
  ``node_id,timestamp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cis.core.arrivals import deterministic, mmpp, mmpp_rates, poisson
from cis.core.errors import CisError

ARRIVALS = ("poisson", "deterministic", "mmpp")
__all__ = ["ARRIVALS", "assign_trace", "deterministic", "mmpp", "mmpp_rates", "parse_trace", "poisson", "read_trace"]


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
