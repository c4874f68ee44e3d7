"""The summary of a list of :class:`~cis.runtime.client.Result` (what ``cis infer``, ``cis demo`` and the
Python API report): accuracy, served shares, latency, errors with their first messages, capped and retried."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from cis.core.records import latency_summary
from cis.runtime import protocol as P

if TYPE_CHECKING:
    from cis.runtime.client import Result


def summarize(results: Sequence[Result | None], labels: np.ndarray | None = None) -> dict:
    """Accuracy, served share per exit and per node, latency (cis.core.records.latency_summary, seconds), errors
    by code with each code's first message, the capped samples per node that capped them, and the requests
    retried (their entry node died: cis.runtime.entries)."""
    ok = [r for r in results if r is not None and r.error is None]
    errors: dict[str, int] = {}
    for r in results:
        if r is None or r.error is not None:
            code = "timeout" if r is None or r.error is None else r.error.code
            errors[code] = errors.get(code, 0) + (1 if r is None else len(r))
    n_ok = sum(len(r) for r in ok)
    retried = sum(1 for r in results if r is not None and r.retried)
    out: dict = {"requests": len(results), "samples_answered": n_ok, "errors": errors,
                 "error_messages": _first_messages(results), "retried": retried}
    if not ok:
        return out
    cls = np.concatenate([r.cls for r in ok])
    ex = np.concatenate([r.exit for r in ok])
    flags = np.concatenate([r.flags for r in ok])
    nodes = [s for r in ok for s in r.served_by]
    if labels is not None:
        lab = np.concatenate(
            [labels[i : i + len(r)] for i, r in _positions(results) if r is not None and r.error is None]
        )
        out["accuracy"] = float((cls == lab).mean())
    out["served_share_per_exit"] = {str(e): float((ex == e).mean()) for e in sorted(set(ex.tolist()))}
    out["served_share_per_node"] = {k: nodes.count(k) / n_ok for k in sorted(set(nodes))}
    out["degraded"] = int((flags & P.FLAG_DEGRADED).astype(bool).sum())
    capped = (flags & P.FLAG_CAPPED).astype(bool)
    out["capped"] = int(capped.sum())
    out["capped_per_node"] = {k: int(v) for k, v in zip(*np.unique(np.array(nodes)[capped], return_counts=True))}
    out["nonfinite"] = int((flags & P.FLAG_NONFINITE).astype(bool).sum())
    out["latency"] = latency_summary([r.latency for r in ok])
    return out


def _first_messages(results: Sequence[Result | None]) -> dict[str, str]:
    """Each error code's first message (what the node said, e.g. why a stage could not take the input)."""
    out: dict[str, str] = {}
    for r in results:
        if r is None:
            out.setdefault("timeout", "no reply")
        elif r.error is not None:
            out.setdefault(r.error.code, r.error.message)
    return out


def _positions(results: Sequence[Result | None]):
    pos = 0
    for r in results:
        yield pos, r
        pos += len(r) if r is not None else 1
