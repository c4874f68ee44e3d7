"""Per-exit gradient variance, measured as in the CIS paper's Appendix C.

On the model at the start of training: iterate over the training data in
mini-batches; for each exit e compute the gradient of exit e's loss with
respect to the parameters it depends on (``model.exit_params(e)``); take the
point-wise mean and variance of that gradient over the mini-batches; average the
point-wise variance over all parameters -> one value sigma_e^2 per exit.
(The paper reports 0.00374, 0.00224, 0.00101 for ResNet-18 on CIFAR-10.)

The model is measured in training mode (batch statistics, as in training) on a
copy, so its BatchNorm running statistics are untouched.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from cis.core.errors import CisError
from cis.training.models.contract import EarlyExitNet


def gradient_variance(
    model: EarlyExitNet,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 128,
    max_batches: int | None = 50,
    seed: int = 0,
    what: str = "the per-exit gradient variance (Appendix C)",
) -> list[float]:
    """sigma_e^2 for e = 1..E (mean point-wise variance of the mini-batch gradient). A variance needs at least two
    full mini-batches: fewer (little data, a large batch) is one line saying ``what`` needs them."""
    n_batches = len(y) // batch_size
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    if n_batches < 2:
        raise CisError(
            f"{what} needs at least 2 mini-batches of the training data; its {len(y)} samples at batch size "
            f"{batch_size} give {len(y) // batch_size}"
            + (f" (sigma_batches {max_batches})" if max_batches is not None and max_batches < 2 else "")
            + "; expected a smaller --batch-size or more data"
        )
    work = copy.deepcopy(model).train()
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y), generator=gen)
    params = [work.exit_params(e) for e in range(1, work.num_exits + 1)]
    sums = [[torch.zeros_like(p) for p in ps] for ps in params]
    sqs = [[torch.zeros_like(p) for p in ps] for ps in params]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for b in range(n_batches):
        idx = order[b * batch_size : (b + 1) * batch_size]
        logits = work(xt[idx])
        for e in range(work.num_exits):
            loss = F.cross_entropy(logits[e], yt[idx])
            grads = torch.autograd.grad(loss, params[e], retain_graph=e < work.num_exits - 1)
            for s, q, g in zip(sums[e], sqs[e], grads):
                s.add_(g)
                q.add_(g * g)
    out = []
    for e in range(work.num_exits):
        total, count = 0.0, 0
        for s, q in zip(sums[e], sqs[e]):
            mean = s / n_batches
            var = (q / n_batches - mean * mean).clamp_(min=0)
            total += float(var.sum())
            count += var.numel()
        out.append(total / max(count, 1))
    return out
