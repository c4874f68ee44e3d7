"""What the Flower apps share: state dicts <-> ArrayRecords, the run config on the wire, node identity.

The RunConfig travels as its resolved JSON in every message's ConfigRecord (key
``cis-config``), so a SuperNode needs no configuration of its own beyond which
CIS node it is (``partition-id``, Flower's node-config key, or ``cis-node``, a
node id of the spec). Each process builds the node side of a run once
(:func:`node_setup`, cached by the config text) with ``cis.training.run.build_setup``:
the same dataset, partition, model and trainer as the built-in engine.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import Tensor

from cis.core.errors import CisError
from cis.training.config import RunConfig

CONFIG_KEY = "cis-config"
ARRAYS_KEY = "arrays"
CONFIG_RECORD = "config"
STATS_RECORD = "cis-stats"
METRICS_RECORD = "metrics"
OPTIMIZER_STATE = "cis-optimizer"
NODE_RECORD = "cis-node"


def state_to_record(state: Mapping[str, Tensor]) -> ArrayRecord:
    """A state dict as an ArrayRecord (numpy .npy bytes per tensor, keys and order kept)."""
    return ArrayRecord.from_torch_state_dict(dict(state))


def record_to_state(record: ArrayRecord) -> dict[str, Tensor]:
    """An ArrayRecord as a state dict of (writable, owned) tensors."""
    out = {}
    for k in record.keys():
        a = record[k].numpy()
        out[k] = torch.from_numpy(a if a.flags.writeable else np.array(a))
    return out


def config_to_text(config: RunConfig) -> str:
    return json.dumps(config.to_json(), sort_keys=True)


def config_from_text(text: str) -> RunConfig:
    try:
        values = json.loads(text)
        return RunConfig(**values).resolved()
    except (json.JSONDecodeError, TypeError) as exc:
        raise CisError(f"flower: cannot read the run config sent by the server ({exc})") from None


@lru_cache(maxsize=4)
def node_setup(config_text: str):
    """The node side of a run (dataset, partition, model, trainer), built once per process.

    The aggregation weights are not needed on a node, so they are built as ``equal``
    (balanced-adj would otherwise measure gradient variance on every node). It stays on
    the CPU: the ClientApp moves its own node's data to the training device per round."""
    from cis.training.run import build_setup

    config = dataclasses.replace(
        config_from_text(config_text), strategy="equal", weights=None, sigma=None, device="cpu"
    )
    return build_setup(config)


def node_index(node_config: Mapping, setup) -> int:
    """Which CIS node this SuperNode is: ``cis-node`` (a node id of the spec) or ``partition-id``."""
    ids = [c.id for c in setup.clients]
    if "cis-node" in node_config:
        name = str(node_config["cis-node"])
        if name not in ids:
            raise CisError(
                f"flower: node-config cis-node={name!r} is not a node of spec {setup.spec.name!r}; expected one "
                f"of {', '.join(ids)}"
            )
        return ids.index(name)
    if "partition-id" in node_config:
        k = int(node_config["partition-id"])
        if not 0 <= k < len(ids):
            raise CisError(
                f"flower: node-config partition-id={k}; spec {setup.spec.name!r} has nodes 0..{len(ids) - 1}"
            )
        return k
    raise CisError(
        "flower: the SuperNode has no 'partition-id' or 'cis-node' in its --node-config; expected e.g. --node-config "
        "'partition-id=0'"
    )
