"""Measured per-exit costs of an early-exit model (FLOPs and parameters).

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` while the model
really runs ``forward(x, upto=e)`` on one sample, so they follow the code rather
than a hand formula. The counter counts matrix multiplications and convolutions
(2 FLOPs per multiply-add); BatchNorm, activations and pooling are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from cis.core.errors import CisError, error_line
from cis.training.models.contract import EarlyExitNet


def exit_costs(model: EarlyExitNet, input_shape: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One dict per exit e = 1..E.

    - ``flops``: forward FLOPs of ``forward(x, upto=e)`` for one sample, i.e.
      stages 1..e including the heads of exits 1..e-1 (what a request served at
      exit e has cost in a CIS);
    - ``params``: parameters of stages 1..e (what a node whose largest exit is e holds);
    - ``exit_params``: parameters exit e's loss touches (stage bodies 1..e and head e).

    ``input_shape`` is the shape of one sample ((C, H, W) for images), default ``model.input_shape``; the
    sample is zeros of the model's ``input_dtype`` (floats in the parameters' dtype; token ids 0).
    """
    shape = tuple(model.input_shape if input_shape is None else input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise CisError(f"exit_costs input_shape {shape}: expected the positive dimensions of one sample")
    param = next(model.parameters())
    dtype = getattr(model, "input_dtype", torch.float32)
    x = torch.zeros((1, *shape), dtype=param.dtype if dtype.is_floating_point else dtype, device=param.device)
    was_training = model.training
    model.eval()
    costs = []
    try:
        with torch.no_grad():
            for e in range(1, model.num_exits + 1):
                counter = FlopCounterMode(display=False)
                with counter:
                    try:
                        model(x, upto=e)
                    except (RuntimeError, ValueError, IndexError) as exc:
                        what = f"exit_costs: the model cannot take one sample of shape {shape} ({error_line(exc)})"
                        raise CisError(what) from None

                costs.append(
                    {
                        "exit": e,
                        "flops": int(counter.get_total_flops()),
                        "params": sum(p.numel() for s in model.stages()[:e] for p in s.parameters()),
                        "exit_params": sum(p.numel() for p in model.exit_params(e)),
                    }
                )
    finally:
        model.train(was_training)
    return costs
