"""Offline evaluation of an early-exit model: per-exit logits, and CIS accuracy under a spec.

The serving decision itself is the one exit policy in ``cis.policy``; this
module only runs the model and hands the logits over.
"""

from __future__ import annotations

import numpy as np
import torch

from training.models import EarlyExitNet


@torch.no_grad()
def predict_exits(model: EarlyExitNet, x: np.ndarray, batch_size: int = 512) -> dict[int, np.ndarray]:
    """Logits of every exit for inputs ``x`` (N, C, H, W): {exit: (N, classes) float32}. Eval mode."""
    was_training = model.training
    model.eval()
    outs: dict[int, list[np.ndarray]] = {e: [] for e in range(1, model.num_exits + 1)}
    try:
        for start in range(0, len(x), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(x[start : start + batch_size]))
            for e, logits in enumerate(model(batch), start=1):
                outs[e].append(logits.float().numpy())
    finally:
        model.train(was_training)
    return {e: np.concatenate(v) if v else np.zeros((0, 0), np.float32) for e, v in outs.items()}
