"""``cis export RUN --rates-from SOURCE``: thresholds for the rates a running CIS measured.

Each node's threshold is calibrated (:func:`cis.core.policy.exit_policy.calibrate_thresholds`) so that, on the
validation split entering at the nodes in proportion to the *measured* arrival rates, it serves
the fraction of what reaches it that it measurably served (served / (served + forwarded)). The
previous thresholds are those the design spec gives the same model; the report says how far
they were off: per node the threshold change and the share of all requests each set of
thresholds serves there under the measured load (no transfer cap applied: what the thresholds
ask for), per exit the same shares against the measured ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cis.core.policy.exit_policy import ExitPolicy, calibrate_thresholds, evaluate_cis, exit_confidences
from cis.core.rates import Rates
from cis.core.records import json_float
from cis.core.spec import CisSpec


@dataclass(frozen=True)
class Recalibration:
    """What ``--rates-from`` hands the exporter: the measured rates, the design whose thresholds they replace,
    and where the rates came from (the ``measurement`` head of :meth:`cis.core.measurement.Measurement.to_json`)."""

    rates: Rates
    previous: CisSpec
    measurement: dict


def keep_unmeasured(policy: ExitPolicy, rec: Recalibration, conf: dict[int, np.ndarray]) -> ExitPolicy:
    """A node that no measured request reached (served + forwarded = 0, so no share to calibrate to) keeps the
    design's threshold rather than +inf (forward everything): traffic that appears there later is served as
    designed. The root serves everything either way."""
    idle = [i for i, r in rec.rates.incoming.items() if r <= 0 and policy.thresholds.get(i, -math.inf) != -math.inf]
    if not idle:
        return policy
    design = calibrate_thresholds(rec.previous, conf, measure=policy.measure).thresholds
    kept = {i: (design.get(i, t) if i in idle else t) for i, t in policy.thresholds.items()}
    return ExitPolicy(policy.measure, kept, policy.patience)


def previous_thresholds(
    rec: Recalibration, spec: CisSpec, logits: dict[int, np.ndarray], labels: np.ndarray, policy: ExitPolicy,
    measure: str,
) -> dict:
    """How far the design's thresholds are from those calibrated to the measured rates (``calibration.previous``)."""
    old = calibrate_thresholds(rec.previous, exit_confidences(logits, measure), measure=measure)
    ev = evaluate_cis(spec, logits, labels, policy=old)
    total = rec.rates.total
    target_node = {i: (r / total if total > 0 else 0.0) for i, r in rec.rates.serving_rate.items()}
    target_exit = rec.rates.exit_share
    nodes = {}
    for n in spec.nodes:
        a, b = old.thresholds[n.id], policy.thresholds[n.id]
        nodes[n.id] = {
            "previous": json_float(a),
            "threshold": json_float(b),
            "change": b - a if math.isfinite(a) and math.isfinite(b) else None,
            "served_share_previous": ev.node_shares[n.id],
            "served_share_measured": target_node[n.id],
        }
    exits = {str(e): {"previous": ev.exit_shares[e], "measured": s} for e, s in target_exit.items()}
    return {
        "spec": rec.previous.name,
        "nodes": nodes,
        "share_per_exit": exits,
        "max_share_error": max(abs(ev.exit_shares[e] - s) for e, s in target_exit.items()),
        "cis_accuracy": ev.accuracy,
    }


def summary_lines(calibration: dict) -> list[str]:
    """The export summary's lines on the measured rates and the previous thresholds."""
    src, prev = calibration["rates_from"], calibration["previous"]
    lines = [
        "",
        f"thresholds calibrated to the rates measured from {src['source']} ({src['kind']}; {src['window']}, "
        f"{src['served']} samples); the design {prev['spec']!r} gave:",
        f"{'node':<10}{'previous':>10}{'new':>10}{'change':>9}{'served share: previous':>24}{'measured':>10}",
    ]
    for nid, n in prev["nodes"].items():
        cells = [n["previous"], n["threshold"], n["change"]]
        text = [c if isinstance(c, str) else ("-" if c is None else f"{c:.4f}") for c in cells]
        lines.append(f"{nid:<10}{text[0]:>10}{text[1]:>10}{text[2]:>9}"
                     f"{100 * n['served_share_previous']:>23.1f}%{100 * n['served_share_measured']:>9.1f}%")
    shares = "  ".join(
        f"exit {e}: {100 * s['previous']:.1f}% (measured {100 * s['measured']:.1f}%)"
        for e, s in prev["share_per_exit"].items()
    )
    lines.append(f"the previous thresholds on the measured load would serve {shares}: "
                 f"{100 * prev['max_share_error']:.1f} points off at worst (before any cap)")
    return lines
