"""The comparison maths of ``cis demo``'s three views (offline, runtime, simulator): small pure functions.

Views are ``{name: {key: value}}`` (served share per exit) or ``{name: value}`` (accuracy);
a missing value (None) makes a gap infinite, so a view that failed never looks like agreement.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

SHARE_TOLERANCE = 0.03  # served share per exit: views agree within 3 points
ACCURACY_TOLERANCE = 0.03
VIEW_LABELS = {
    "calculus": "rate calculus",
    "offline": "offline (thresholds)",
    "runtime": "runtime",
    "sim": "simulator",
    "sim_bundle_profile": "simulator, bundle profile (ref.)",
}
CHECKED_SHARE_VIEWS = ("calculus", "offline", "runtime", "sim")  # shown
MEASURED_VIEWS = ("offline", "runtime", "sim")  # checked
CHECKED_ACCURACY_VIEWS = ("offline", "runtime", "sim")


def max_gap(views: Mapping[str, Mapping[str, float | None]], names: tuple[str, ...] | None = None) -> float:
    """Largest difference between any two views at any key (exit); views as {name: {key: value}}."""
    names = tuple(n for n in (names or tuple(views)) if n in views)
    gap = 0.0
    for a, b in itertools.combinations(names, 2):
        for k in set(views[a]) | set(views[b]):
            va, vb = views[a].get(k), views[b].get(k)
            if va is None or vb is None:
                return float("inf")
            gap = max(gap, abs(float(va) - float(vb)))
    return gap


def value_gap(values: Mapping[str, float | None], names: tuple[str, ...]) -> float:
    """Largest difference between any two of the named scalar views (inf when one is missing)."""
    got = [values.get(n) for n in names if n in values]
    known = [v for v in got if v is not None]
    if len(known) < len(got) or not known:
        return float("inf")
    return float(max(known) - min(known))


def agreement(
    comparison: Mapping[str, Any], share_tol: float = SHARE_TOLERANCE, acc_tol: float = ACCURACY_TOLERANCE
) -> dict:
    """Do the views agree? The measured views (offline, runtime, simulator) on served shares and
    accuracies, each within its tolerance. The rate calculus is the design target: its gap to the
    measured shares is the thresholds' drift from the validation split they were calibrated on
    to the test samples (reported, with the gap of the simulator on the bundle's own profile)."""
    measured = max_gap(comparison["served_share"], MEASURED_VIEWS)
    acc = value_gap(comparison["accuracy"], CHECKED_ACCURACY_VIEWS)
    return {
        "share_max_gap": measured,
        "calculus_gap": max_gap(comparison["served_share"], ("calculus", "runtime")),
        "calculus_gap_bundle_profile": max_gap(comparison["served_share"], ("calculus", "sim_bundle_profile")),
        "accuracy_max_gap": acc,
        "share_tolerance": share_tol,
        "accuracy_tolerance": acc_tol,
        "ok": bool(measured <= share_tol and acc <= acc_tol),
    }
