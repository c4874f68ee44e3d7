"""HeteroFL's static BatchNorm (sBN), as the NeFL paper runs its HeteroFL baseline.

HeteroFL (Diao et al., ICLR 2021, "Static Batch Normalization") tracks no running
statistics while training and, after training, has "the server sequentially query
local clients and cumulatively update global BN statistics"; the NeFL paper
(appendix "HeteroFL & FjORD"): "HeteroFL employs static batch normalization, where
BN statistics are updated using the entire dataset after the training process".
``--method heterofl`` does this by default (option ``static_bn``; ``false`` gives the
shared running statistics tracked and averaged during training, as before).

While training, a client's compact network keeps no running statistics: every batch
is normalised with its own mean and variance, and the client neither loads nor
uploads statistics (:meth:`NestedNet.trainee`). The trained parameters are the same
as with tracked statistics (train-mode BatchNorm normalises with the batch's own
statistics either way); only the statistics differ.

After training, :func:`recompute_statistics_` runs each sub-model k in train mode over
the nodes' training data with PyTorch's cumulative average (BatchNorm ``momentum=None``,
as HeteroFL's code does): running_mean = the mean over batches of the batch means,
running_var = the mean over batches of the unbiased batch variances. Choices:

- **per sub-model**: the BatchNorm affine parameters are shared slices, but channel c
  of sub-model k normalises another input than channel c of sub-model k+1, so each
  sub-model gets its own statistics (``NestedNet.sub_stats``), stored, evaluated and
  exported like NeFL's per-sub-model BatchNorm. HeteroFL's code computes them for the
  global model only; NeFL (and a CIS tier) serves every sub-model.
- **the entire dataset**: every node's data for every sub-model, so a node of a lower
  tier runs the larger sub-models forward (no gradient) in this pass; node by node,
  each node's data in the order it holds it, in batches of the run's training batch
  size (a node's last batch may be smaller and counts as one batch, as in PyTorch),
  without augmentation (the statistics serve un-augmented inputs at inference;
  HeteroFL's code passes its training transform).
- **federated**: batches never mix nodes and a batch's statistics do not depend on the
  running ones (train mode), so the result equals each node's sum of batch statistics
  added up over the nodes and divided by the total number of batches (nodes weigh by
  their batch counts, i.e. their data sizes): HeteroFL's sequential query. The nodes
  of a simulated run are in-process, so one process runs their passes in turn; a
  deployment would have each node send its sums and its batch count.
- **when**: statistics belong to one set of weights. The nested aggregator marks them
  stale after every round (counters ``num_batches_tracked`` at 0) and
  :func:`refresh_statistics` recomputes stale ones before the global model is
  evaluated, checkpointed or summarised (cis/training/run.py ``served_model``). So the
  per-round validation accuracy, summary.json, the checkpoint and what ``cis evaluate``,
  ``cis export`` and ``cis serve`` read all hold statistics of the weights beside them.
  Cost: one forward pass per sub-model over the training data per evaluated round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from cis.training.methods.nested import BN_STATISTICS, STATISTICS_MODULE, NestedNet
from cis.training.selection import gather, scatter_

_COUNTER = "num_batches_tracked"


def _counters(state: Mapping[str, Tensor]) -> list[str]:
    return [k for k in state if k.startswith(STATISTICS_MODULE + ".") and k.endswith("." + _COUNTER)]


@torch.no_grad()
def mark_stale_(global_state: Mapping[str, Tensor]) -> None:
    """The weights changed: their per-sub-model statistics no longer hold (counters to 0)."""
    for k in _counters(global_state):
        global_state[k].zero_()


def is_stale(model: Any) -> bool:
    """True for a static-BN model whose statistics were not computed for its current weights."""
    if not getattr(model, "static_bn", False):
        return False
    state = model.state_dict()
    return any(int(state[k]) == 0 for k in _counters(state))


@torch.no_grad()
def recompute_statistics_(model: NestedNet, node_data: Sequence[Tensor], batch_size: int) -> dict[str, Tensor]:
    """Each sub-model's running statistics: a cumulative average over every node's training data
    (``node_data``, one tensor of inputs per node) in batches of ``batch_size``; written into
    ``model`` in place and returned (state key -> tensor)."""
    state = model.state_dict()  # shares storage with the model
    for k in range(1, model.num_exits + 1):
        selection = model.selection(k)
        net = model.compact(k)
        net.load_state_dict(gather(state, selection))
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = None  # cumulative average over the batches
                m.reset_running_stats()
        net.train()
        for x in node_data:
            for i in range(0, len(x), batch_size):
                net(x[i : i + batch_size])
        stats = {ck: v for ck, v in selection.items() if ck.rsplit(".", 1)[-1] in BN_STATISTICS}
        scatter_(state, net.state_dict(), stats)
    return {k: v for k, v in state.items() if k.startswith(STATISTICS_MODULE + ".")}


def refresh_statistics(engine: Any, node_data: Sequence[Tensor], batch_size: int) -> Any:
    """The engine's working model holding the global weights (``engine.sync_model()``); a static-BN
    model's stale statistics recomputed first and kept in the engine's global state too (training
    never reads them, so this changes nothing in later rounds)."""
    model = engine.sync_model()
    if is_stale(model):
        for k, v in recompute_statistics_(model, node_data, batch_size).items():
            engine.global_state[k].copy_(v)
    return model
