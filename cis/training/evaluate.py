"""Offline evaluation of an early-exit model: per-exit logits, and CIS accuracy under a spec.

The serving decision itself is the one exit policy in ``cis.core.policy.exit_policy``; this
module only runs the model and hands the logits over.
"""

from __future__ import annotations

import numpy as np
import torch

from cis.training.device import module_device
from cis.training.models.contract import EarlyExitNet


@torch.no_grad()
def predict_exits(model: EarlyExitNet, x: np.ndarray, batch_size: int = 512) -> dict[int, np.ndarray]:
    """Logits of every exit for inputs ``x`` (N, C, H, W): {exit: (N, classes) float32}. Eval mode,
    on the model's device (batches go there, logits come back)."""
    was_training = model.training
    model.eval()
    device = module_device(model)
    outs: dict[int, list[np.ndarray]] = {e: [] for e in range(1, model.num_exits + 1)}
    try:
        for start in range(0, len(x), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(x[start : start + batch_size])).to(device)
            for e, logits in enumerate(model(batch), start=1):
                outs[e].append(logits.float().cpu().numpy())
    finally:
        model.train(was_training)
    return {e: np.concatenate(v) if v else np.zeros((0, 0), np.float32) for e, v in outs.items()}


def cis_report(
    spec,
    val_logits: dict[int, np.ndarray],
    val_labels: np.ndarray,
    test_logits: dict[int, np.ndarray],
    test_labels: np.ndarray,
    measure: str | None = None,
    seed: int = 0,
) -> dict:
    """Per-exit and CIS accuracy on the test split, as the paper's Table 1 (by quota),
    plus thresholds calibrated on the validation split and how far the shares they
    serve on the test split drift from the spec's targets.

    All decisions go through the one exit policy in :mod:`cis.core.policy.exit_policy`.
    """
    from cis.core.policy.exit_policy import calibrate_thresholds, evaluate_cis, exit_confidences
    from cis.core.rates import compute_rates

    measure = measure or spec.confidence
    rates = compute_rates(spec)
    target_exit = rates.exit_share
    target_node = {n: s / rates.total if rates.total > 0 else 0.0 for n, s in rates.serving_rate.items()}
    quota = evaluate_cis(spec, test_logits, test_labels, measure=measure, seed=seed)
    val_quota = evaluate_cis(spec, val_logits, val_labels, measure=measure, seed=seed)
    policy = calibrate_thresholds(spec, exit_confidences(val_logits, measure), seed=seed, measure=measure)
    thresh = evaluate_cis(spec, test_logits, test_labels, policy=policy, seed=seed)
    return {
        "measure": measure,
        "exit_accuracy": {str(e): v for e, v in quota.exit_accuracy.items()},
        "cis_accuracy": quota.accuracy,
        "val_cis_accuracy": val_quota.accuracy,  # the same on the validation split: what choices may look at
        "served_share_per_exit": {str(e): v for e, v in quota.exit_shares.items()},
        "target_share_per_exit": {str(e): v for e, v in target_exit.items()},
        "calibrated": {
            "policy": policy.to_json(),
            "cis_accuracy": thresh.accuracy,
            "served_share_per_exit": {str(e): v for e, v in thresh.exit_shares.items()},
            "drift_per_exit": {str(e): thresh.exit_shares[e] - target_exit[e] for e in target_exit},
            "drift_per_node": {n: thresh.node_shares[n] - target_node[n] for n in target_node},
            "max_abs_drift": max(abs(thresh.exit_shares[e] - target_exit[e]) for e in target_exit),
        },
    }


def format_cis_report(report: dict) -> str:
    """A few human lines for :func:`cis_report`."""
    exits = sorted(report["exit_accuracy"], key=int)
    lines = [
        "exit accuracy   " + "  ".join(f"e{e} {100 * report['exit_accuracy'][e]:.1f}%" for e in exits),
        f"CIS accuracy    {100 * report['cis_accuracy']:.2f}% ({report['measure']}, quota)  served "
        + "-".join(f"{100 * report['served_share_per_exit'][e]:.0f}" for e in exits),
        f"calibrated      {100 * report['calibrated']['cis_accuracy']:.2f}% (val thresholds)  served "
        + "-".join(f"{100 * report['calibrated']['served_share_per_exit'][e]:.1f}" for e in exits)
        + f"  (max drift {100 * report['calibrated']['max_abs_drift']:.1f} pp)",
    ]
    return "\n".join(lines)
