"""One vocabulary for what the runtime, the client, the simulator, the reports and the benchmarks measure.

- **Latency summary** (:func:`latency_summary`): seconds in, seconds out, one format everywhere::

      {"count": 359, "mean_s": 0.0018, "p50_s": 0.0014, "p95_s": 0.0038, "p99_s": 0.0052, "max_s": 0.0070}

  (every value but ``count`` None when there is no sample). Seconds because every other time
  the project writes is in seconds (``horizon_s``, ``wall_s``, ``latency_s``, SimPy's clock,
  ``time.monotonic``); people read milliseconds, so text output goes through :func:`format_ms`.
  :class:`LatencyWindow` keeps the last results' latencies (a node's ``status``).
- **requests.csv** (:data:`REQUEST_COLUMNS`, :func:`write_requests`, :func:`read_requests`): one
  row per request, the same layout and cell rules for the simulator (``cis simulate --out``), a load
  (``cis bench --out``) and a runtime replay (``cis demo``'s ``runtime/``).
  :func:`percentile_all` takes the same percentile over every request, an unanswered one (inf) the latest.
- **JSON numbers** (:func:`json_float`): JSON has no infinity; +-inf are written "inf" / "-inf".
- **Latency CDF** (:func:`draw_latency_cdf`): the one plot of latency distributions.

numpy only (matplotlib is the caller's: it hands in the axes), no torch.
"""

from __future__ import annotations

import collections
import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import CisError

PERCENTILES = (50, 95, 99)
LATENCY_KEYS = ("count", "mean_s", *(f"p{q}_s" for q in PERCENTILES), "max_s")


def latency_summary(seconds: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """count, mean, p50/p95/p99 and max of latencies in seconds; NaN and inf (unknown) are left out."""
    s = np.asarray(seconds, dtype=float)
    s = s[np.isfinite(s)]
    if not len(s):
        return {"count": 0, **{k: None for k in LATENCY_KEYS[1:]}}
    pct = np.percentile(s, PERCENTILES)
    return {
        "count": int(len(s)),
        "mean_s": float(s.mean()),
        **{f"p{q}_s": float(v) for q, v in zip(PERCENTILES, pct)},
        "max_s": float(s.max()),
    }


def percentile_all(seconds: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile of every request's latency, taken as :func:`latency_summary` takes its own (numpy's
    linear interpolation between ranks), a request without an answer (inf) later than any: inf once the two
    ranks it falls between reach one; with every latency finite, exactly ``latency_summary``'s. NaN: none."""
    s = np.sort(np.asarray(seconds, dtype=float))
    if not len(s):
        return math.nan
    hi = s[math.ceil(q / 100 * (len(s) - 1))]
    return float(np.percentile(np.minimum(s, hi), q)) if math.isfinite(hi) else math.inf


class LatencyWindow:
    """Seconds from a request's arrival at the node to its result, over the last ``size`` results."""

    def __init__(self, size: int = 4096):
        self.values: collections.deque[float] = collections.deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    def summary(self) -> dict[str, float | None]:
        """The one latency summary of cis.core.records (seconds: count, mean_s, p50_s, p95_s, p99_s, max_s)."""
        return latency_summary(np.fromiter(self.values, float, len(self.values)))


def format_ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds for people ("-" when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{1000 * seconds:.{digits}f}"


def json_float(value: float) -> float | str:
    """A float JSON can hold: finite values as they are, +-inf as "inf" / "-inf"."""
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


# ---------------------------------------------------------------- requests.csv

REQUEST_COLUMNS = ("id", "entry", "node", "exit", "outcome", "correct", "arrive_s", "finish_s", "latency_s", "flags")
"""id: the request (a runtime replay: the sample's index); entry: the node it arrived at; node: where it was
served (or dropped); exit: the exit that served it (empty unless served); outcome: served | dropped (a full
queue, simulator) | error (no answer, runtime); correct: 1 or 0 (empty when unknown); arrive_s, finish_s: the
simulator's clock (a runtime replay: arrive_s is the send time from the first send, finish_s empty);
latency_s: end to end (to the drop for a dropped request; empty when unknown); flags: a served request's reply
flags as an integer (1 degraded, 2 capped, 3 both, 0 none), empty for a request with no answer (dropped, error):
:func:`write_requests` writes them so whatever a writer hands in."""
OUTCOMES = ("served", "dropped", "error")
_TIME_COLUMNS = frozenset(c for c in REQUEST_COLUMNS if c.endswith("_s"))


def write_requests(path: str | Path, columns: Mapping[str, Sequence[Any]]) -> None:
    """Write requests.csv from columns of equal length (a missing column or a None value: an empty cell; the
    ``flags`` of a ``served`` row an integer, 0 for none or None, and of any other row empty)."""
    unknown = sorted(set(columns) - set(REQUEST_COLUMNS))
    if unknown:
        raise ValueError(f"requests.csv: unknown columns {unknown}; expected some of {REQUEST_COLUMNS}")
    n = len(next(iter(columns.values()))) if columns else 0
    flags, outcomes = columns.get("flags", [None] * n), columns.get("outcome", [None] * n)
    columns = {**columns, "flags": [int(f or 0) if o == "served" else None for f, o in zip(flags, outcomes)]}
    cols = [columns.get(c, [None] * n) for c in REQUEST_COLUMNS]
    times = [c in _TIME_COLUMNS for c in REQUEST_COLUMNS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for row in zip(*cols):
            w.writerow(["" if v is None else (f"{v:.9f}" if t else v) for v, t in zip(row, times)])


def read_requests(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of a requests.csv as arrays: ``exit`` int (0: not served), ``correct`` int (-1: unknown),
    ``flags`` int (0 when empty), the ``_s`` columns float (NaN: unknown), the others str. A file without the
    header row, or a cell that is not what its column holds: a :class:`CisError` of one line naming the file, the
    line and the column."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUEST_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise CisError(f"{path}: line 1 has no column {', '.join(missing)}; expected the header row "
                           f"{','.join(REQUEST_COLUMNS)}")
        rows = list(reader)
    kinds = {**{c: float for c in _TIME_COLUMNS}, "exit": int, "flags": int, "correct": int}
    empty = {"exit": 0, "flags": 0, "correct": -1}
    out: dict[str, np.ndarray] = {}
    for name in REQUEST_COLUMNS:
        cells = [r.get(name) or "" for r in rows]
        kind = kinds.get(name)
        if kind is None:
            out[name] = np.array(cells, dtype=str)
            continue
        values = []
        for k, v in enumerate(cells):
            try:
                values.append(kind(v) if v else empty.get(name, np.nan))
            except ValueError:
                raise CisError(f"{path}: line {k + 2}: {name} is {v!r}; expected "
                               f"{'seconds' if kind is float else 'an integer'} or an empty cell") from None
        out[name] = np.array(values, dtype=kind)
    return out


def served_latencies(requests: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(latency in seconds, exit) of the served requests of :func:`read_requests`' columns."""
    served = (requests["exit"] > 0) & np.isfinite(requests["latency_s"])
    return requests["latency_s"][served], requests["exit"][served]


# ---------------------------------------------------------------- the latency CDF


def draw_latency_cdf(ax: Any, curves: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str = "latency CDF") -> None:
    """Draw on matplotlib axes the latency CDF of each named view, ``{name: (latency_s, exit)}``: all its
    requests (thick) and per exit (thin), milliseconds on a log axis."""
    styles = (":", "--", "-.")
    for k, (name, (latency, exits)) in enumerate(curves.items()):
        color = f"C{k}"
        latency, exits = np.asarray(latency, float), np.asarray(exits)
        ms = np.sort(latency) * 1000
        if len(ms):
            ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), color=color, lw=2, label=f"{name}, all")
        for j, e in enumerate(sorted(set(exits.tolist()))):
            le = np.sort(latency[exits == e]) * 1000
            ax.plot(le, np.arange(1, len(le) + 1) / len(le), color=color, ls=styles[j % len(styles)], lw=1,
                    label=f"{name}, exit {e}")
    ax.set_xscale("log")
    ax.set(xlabel="end-to-end latency (ms, log)", ylabel="fraction of requests", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
