"""The statistics of the paper tables: mean and sd over seeds, paired differences, the paired t-test, Holm's
adjustment, and their markdown cell."""

from __future__ import annotations

import numpy as np


def stats(values: list[float]) -> dict:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0, "n": len(a)}


def paired(values: list[float], base: list[float]) -> dict:
    """The per-seed difference against a baseline: mean, sd, the sign per seed and the paired t-test's p."""
    d = np.asarray(values, dtype=float) - np.asarray(base, dtype=float)
    return {
        **stats(d.tolist()),
        "per_seed": [round(float(x), 2) for x in d],
        "signs": "".join("+" if x > 0 else "-" if x < 0 else "0" for x in d),
        "t_test_p": paired_t_p(d),
    }


def paired_t_p(d: np.ndarray) -> float | None:
    """Two-sided p of the paired t-test on the differences ``d`` (None below 2 pairs; 1.0 when all are 0)."""
    if len(d) < 2:
        return None
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        return 1.0 if float(np.mean(d)) == 0.0 else 0.0
    from scipy.stats import t as student_t

    t = float(np.mean(d)) / (sd / np.sqrt(len(d)))
    return float(2 * student_t.sf(abs(t), len(d) - 1))


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-Bonferroni adjusted p-values over one family of comparisons (None stays None)."""
    named = sorted(((p, k) for k, p in pvalues.items() if p is not None))
    m, out, running = len(named), dict.fromkeys(pvalues), 0.0
    for rank, (p, k) in enumerate(named):
        running = max(running, min(1.0, (m - rank) * p))
        out[k] = running
    return out


def add_holm(comparisons: dict[str, dict]) -> None:
    """Write ``holm_p`` into every comparison of a table (one family), from its ``t_test_p``."""
    adjusted = holm({k: c.get("t_test_p") for k, c in comparisons.items()})
    for k, c in comparisons.items():
        c["holm_p"] = adjusted[k]


def fmt_p(p: float | None, digits: int = 3) -> str:
    """A p-value for a table or a sentence; '–' where there is no test (fewer than 2 pairs)."""
    return "–" if p is None else f"{p:.{digits}f}"


def fmt_test(c: dict) -> str:
    """'+2.0 ± 0.9 (+++++) p 0.01 / Holm 0.05' for a markdown table."""
    p, h = fmt_p(c.get("t_test_p")), fmt_p(c.get("holm_p"))
    return f"{c['mean']:+.1f} ± {c['sd']:.1f} ({c['signs']}) p {p} / Holm {h}"
