"""FLAME: sample-adaptive multi-exit training (patience exits during local training).

One local step on a batch of b samples (Algorithm 2):

1. every sample runs forward stage by stage; after each exit the patience state
   (cis/core/policy/patience.py, the same rule the runtime applies) decides whether it exits
   there. An exited sample leaves the batch, so the stages past its exit are
   never computed for it;
2. samples are grouped (:func:`group_samples`); each non-empty group's mean
   cross-entropy at its samples' own exits is backpropagated on its own and gives
   one SGD update. All groups' gradients are taken at the weights of the forward
   pass, as in the paper's pseudocode (forward for all b samples, then one update per group).
   With b = 1 this is Algorithm 1 (plain per-sample FLAME).

How big each group's step is (``group_step``, :func:`group_losses`) is our choice,
named here because the paper's two statements do not fit our optimizer:

- ``mean``: Algorithm 2 line 39 literally: each group's *mean* loss, a full step.
  The paper fine-tunes with AdamW (appendix A.2), whose step size hardly depends
  on the gradient's scale. With our momentum SGD a group of one sample takes as
  big a step as the whole batch, and a batch split into k groups moves k full
  steps: after a warm start training collapses (results/flame.md of session 2).
- ``share`` (default): each group's mean loss times its share of the batch
  |g| / b. The group gradients of a batch then add up to the gradient of the
  batch's mean loss, so a batch moves as far as one SGD step of every other
  trainer here, still split into one backpropagation per group. With plain
  SGD (no momentum, no weight decay) the group steps then add up exactly to
  the ``full`` grouping's one step; momentum and weight decay, applied per
  group step, are what still tell the groupings apart.

``optimizer=adamw`` (FLAME's option) trains with the paper's AdamW (betas
0.9/0.999, eps 1e-8) instead; with it ``group_step=mean`` is the paper's setup
as written. The paper decays its lr linearly; ours follows the project's one
cosine schedule.

Training FLOPs of a sample that exits at e are 3x the forward FLOPs of
``forward(x, upto=e)`` (cis/training/models/flops.py): the stages run plus the exit heads
consulted on the way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from cis.core.policy import patience as pt
from cis.training.methods.registry import FLAME_GROUP_STEPS, FLAME_GROUPINGS
from cis.training.models.contract import EarlyExitNet

ADAMW_BETAS, ADAMW_EPS = (0.9, 0.999), 1e-8  # the paper's fine-tuning optimizer (appendix A.2)
TRAIN_FLOPS_FACTOR = 3


def _select(carry: Tensor | dict[str, Tensor], keep: Tensor) -> Tensor | dict[str, Tensor]:
    if isinstance(carry, Tensor):
        return carry[keep]
    return {k: v[keep] for k, v in carry.items()}


def patience_forward(model: EarlyExitNet, x: Tensor, patience: int) -> tuple[Tensor, np.ndarray]:
    """Run each sample up to its patience exit; returns (logits at each sample's exit (N, C), exits (N,) 1-based).

    Stages past a sample's exit are not run for it; the returned logits carry the
    graph of exactly the layers the sample went through.
    """
    n = x.shape[0]
    stages = model.stages()
    rows: list[Tensor] = []
    owners: list[Tensor] = []
    exits = np.zeros(n, dtype=np.int64)
    active = torch.arange(n)
    state = pt.initial_state(n)
    carry: Tensor | dict[str, Tensor] = x
    for e, stage in enumerate(stages, start=1):
        logits, carry = stage(carry)
        state, done = pt.step(state, logits.detach().cpu().numpy(), patience, last=e == len(stages))
        if done.any():
            done_t = torch.from_numpy(done)
            rows.append(logits[done_t])
            owners.append(active[done_t])
            exits[active[done_t].numpy()] = e
        if done.all():
            break
        keep = torch.from_numpy(~done)
        active, carry = active[keep], _select(carry, keep)
        state = pt.PatienceState(state.label[~done], state.count[~done])
    order = torch.argsort(torch.cat(owners))
    return torch.cat(rows)[order], exits


def fixed_exit_forward(model: EarlyExitNet, x: Tensor, exit: int) -> tuple[Tensor, np.ndarray]:
    """Every sample trains at ``exit`` (the fixed-exit baseline): stages 1..exit only; same returns as
    :func:`patience_forward`."""
    carry: Tensor | dict[str, Tensor] = x
    logits = None
    for stage in model.stages()[:exit]:
        logits, carry = stage(carry)
    assert logits is not None
    return logits, np.full(x.shape[0], exit, dtype=np.int64)


def round_summary(pairs: Sequence[dict]) -> dict:
    """What a round's FLAME statistics add up to, for metrics.jsonl (``pairs``: the engine's per-client records).

    ``avg_train_exit``: the mean training exit over every sample trained this round;
    ``train_flops``: the round's training FLOPs (3 x the forward FLOPs of the layers run), summed over clients;
    ``avg_exit_per_node`` / ``train_flops_per_node``: the same per client. Empty when no record has FLAME's fields.
    """
    recs = [r for r in pairs if "exit_counts" in r and "train_flops" in r]
    if not recs:
        return {}
    counts = np.sum([np.asarray(r["exit_counts"], dtype=np.int64) for r in recs], axis=0)
    exits = np.arange(1, len(counts) + 1)
    return {
        "avg_train_exit": float((counts * exits).sum() / max(counts.sum(), 1)),
        "train_flops": int(sum(int(r["train_flops"]) for r in recs)),
        "avg_exit_per_node": {str(r["node"]): float(r["avg_exit"]) for r in recs},
        "train_flops_per_node": {str(r["node"]): int(r["train_flops"]) for r in recs},
    }


def group_samples(
    exits: np.ndarray, strategy: str, num_exits: int, gen: torch.Generator | None = None
) -> list[np.ndarray]:
    """Sample indices per backpropagation group (non-empty groups only, in group order).

    - ``exit`` (the paper's proposal): one group per exit layer;
    - ``full``: everything in one group;
    - ``random``: each sample to one of E groups uniformly at random;
    - ``binary``: exits 1..E/2 and E/2+1..E;
    - ``distant``: pairs (1, E/2+1), (2, E/2+2), ...;
    - ``close``: pairs (1, 2), (3, 4), ...
    """
    exits = np.asarray(exits)
    half = (num_exits + 1) // 2
    if strategy == "exit":
        label = exits - 1
    elif strategy == "full":
        label = np.zeros_like(exits)
    elif strategy == "random":
        label = torch.randint(num_exits, (len(exits),), generator=gen).numpy()
    elif strategy == "binary":
        label = (exits > half).astype(np.int64)
    elif strategy == "distant":
        label = (exits - 1) % half
    elif strategy == "close":
        label = (exits - 1) // 2
    else:
        raise ValueError(f"grouping {strategy!r}: expected one of {FLAME_GROUPINGS}")
    return [np.flatnonzero(label == g) for g in np.unique(label)]


def group_losses(exit_logits: Tensor, y: Tensor, groups: Sequence[np.ndarray], step: str = "share") -> list[Tensor]:
    """Each group's loss: its mean cross-entropy at its samples' exits (``mean``), times |g| / b (``share``)."""
    if step not in FLAME_GROUP_STEPS:
        raise ValueError(f"group step {step!r}: expected one of {FLAME_GROUP_STEPS}")
    n = len(y)
    out = []
    for g in groups:
        loss = F.cross_entropy(exit_logits[torch.from_numpy(g)], y[torch.from_numpy(g)])
        out.append(loss * (len(g) / n) if step == "share" else loss)
    return out


def group_gradients(losses: Sequence[Tensor], params: Sequence[Tensor]) -> list[list[Tensor | None]]:
    """Gradients of each group's loss, all at the current weights (None where a group does not reach a parameter)."""
    out: list[list[Tensor | None]] = []
    for k, loss in enumerate(losses):
        out.append(list(torch.autograd.grad(loss, params, retain_graph=k < len(losses) - 1, allow_unused=True)))
    return out


def training_flops(exits: np.ndarray, forward_flops: Sequence[int]) -> int:
    """3 x the forward FLOPs of the layers each sample ran (``forward_flops[e-1]``: forward up to exit e)."""
    counts = np.bincount(np.asarray(exits), minlength=len(forward_flops) + 1)[1:]
    return int(TRAIN_FLOPS_FACTOR * sum(int(c) * int(f) for c, f in zip(counts, forward_flops)))


def fixed_exit_flops(exit: int, num_samples: int, forward_flops: Sequence[int]) -> int:
    """Training FLOPs when every sample trains at one exit (no-exit training: the last)."""
    return TRAIN_FLOPS_FACTOR * num_samples * int(forward_flops[exit - 1])
