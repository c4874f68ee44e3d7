"""A run's data and nodes: the splits of ``config.dataset`` and the training split spread over the spec's nodes.

    splits = run_splits(config)                    # load_dataset + the seeded --train-subset
    clients = make_clients(config, spec, splits.train, device)

How the training samples reach the nodes (``--partition``, ``--dirichlet``; cis/training/data/partition.py):

- ``equal`` / ``biased`` / ``highly-biased`` (or shares per layer): IID, a layer's share split evenly
  among its nodes; with ``--dirichlet ALPHA`` the classes are skewed Dirichlet(ALPHA) at the same sizes;
- ``node``: each sample's node from the data's own ``node`` column;
- ``--centralised``: one node, ``pooled``, holds every sample (cis/training/centralised.py).
"""

from __future__ import annotations

import numpy as np
import torch

from cis.core.spec import CisSpec
from cis.training.centralised import pooled_client
from cis.training.config import RunConfig
from cis.training.data.dataset import Dataset, DataSplits
from cis.training.data.loading import load_dataset
from cis.training.data.partition import node_column_index, node_sizes, partition, partition_by_column
from cis.training.local import Client, local_steps


def run_splits(config: RunConfig, splits: DataSplits | None = None, num_classes: int | None = None) -> DataSplits:
    """The run's train/val/test splits (loaded unless given); ``train_subset`` keeps a seeded subset of the
    training split. ``num_classes``: the class count the spec states, for data that names no classes."""
    splits = splits or load_dataset(config.dataset, seed=config.seed, val_size=config.val_size,
                                    num_classes=num_classes)
    if config.train_subset is not None and config.train_subset < len(splits.train):
        keep = np.sort(np.random.default_rng(config.seed).permutation(len(splits.train))[: config.train_subset])
        splits = DataSplits(splits.train.subset(keep), splits.val, splits.test, splits.sha256)
    return splits


def check_node_column(config: RunConfig, spec: CisSpec, splits: DataSplits) -> None:
    """With ``--partition node``, every sample's node must be one of the spec's, in every split (a typo in a
    validation or test row is as much a mistake as one in a training row, which :func:`node_parts` would meet)."""
    parts = [p.node for p in (splits.train, splits.val, splits.test) if p.node is not None and len(p.node)]
    if config.partition == "node" and parts:
        node_column_index(np.concatenate(parts), [n.id for n in spec.nodes], config.dataset)


def node_parts(config: RunConfig, spec: CisSpec, train: Dataset) -> dict[str, np.ndarray]:
    """``{node_id: indices}`` of the training samples each node holds (the module doc's rules)."""
    if config.partition == "node":
        return partition_by_column(train.node, spec.nodes, config.dataset)
    return partition(train.y, spec.nodes, config.partition, config.dirichlet, seed=config.seed)


def make_clients(config: RunConfig, spec: CisSpec, train: Dataset, device: torch.device) -> list[Client]:
    """The nodes' local data on ``device``: one client per spec node, or the pooled one (``--centralised``)."""
    xt, yt = torch.from_numpy(train.x), torch.from_numpy(train.y)
    if config.centralised:
        return [pooled_client(xt.to(device), yt.to(device), spec.num_exits)]
    parts = {i: torch.from_numpy(idx) for i, idx in node_parts(config, spec, train).items()}
    return [
        Client(n.id, k, n.exit, xt[parts[n.id]].to(device), yt[parts[n.id]].to(device))
        for k, n in enumerate(spec.nodes)
    ]


def weight_sizes(config: RunConfig, spec: CisSpec, clients: list[Client], num_samples: int) -> list[int]:
    """The node sizes the aggregation weights see (balanced-adj): the clients', or for a centralised run the
    sizes its federated twin would give the spec's nodes."""
    if not config.centralised:
        return [c.size for c in clients]
    if num_samples < len(spec.nodes):
        return [1] * len(spec.nodes)
    shares = config.partition if config.partition != "node" else "equal"
    return list(node_sizes(num_samples, spec.nodes, shares).values())


def federated_steps(config: RunConfig, spec: CisSpec, num_samples: int) -> dict[str, int]:
    """What the federated run of a centralised ``config`` would take (the same flags without --centralised):
    every node J_fed local steps a round (J_fed from the sizes its partition would give the nodes), so
    ``{"per_round": len(nodes) * J_fed, "total": rounds * that}``; a centralised round takes J (``--local-steps``,
    else ``--local-epochs`` over the pooled data), so at the same ``--local-steps`` it takes 1/len(nodes) of them."""
    sizes = weight_sizes(config, spec, [], num_samples)
    per_node = local_steps(sizes, int(config.batch_size or 1), config.local_epochs, config.local_steps)
    per_round = len(spec.nodes) * per_node
    return {"per_round": per_round, "total": int(config.rounds or 0) * per_round}
