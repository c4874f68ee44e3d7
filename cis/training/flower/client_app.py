"""The ClientApp every SuperNode runs: one CIS node, its partition, the shared local trainer.

A SuperNode says which CIS node it is in its node config (``partition-id=K``,
the K-th node of the spec, or ``cis-node=ID``). The ClientApp is stateless
between messages apart from ``context.state``, which Flower keeps per node and
run; the node's optimizer state (SGD momentum buffers) lives there (ArrayRecord ``cis-optimizer``)
and go back into the trainer before each round, so every node keeps its own
optimizer state across rounds as in the built-in engine. They never leave the node.

Training runs on the run config's ``device`` as this node resolves it (``auto``: its
own GPU when it has one) with its ``amp``; the node's data and optimizer state are kept
on the CPU between messages and go to the device for the round.

On the deployment engine every message runs in a fresh ``flwr-clientapp``
process, so the first message of a run (the server's QUERY) builds the node's
side with ``cis.training.run.build_setup`` and keeps the node's partition in
``context.state`` (``cis-data``); TRAIN messages then only import torch and build
the model and the shared ``ExitSGDTrainer`` from the parameters the server's own
Setup holds (sent as ``model`` / ``trainer`` in the ConfigRecord).

TRAIN message in:  arrays (global state), config {server-round, node-index, exit, cis-config}
TRAIN reply:       arrays (the node's trained state), metrics {num-examples, loss, steps, lr},
                   cis-stats {node-index, exit, json: the trainer's statistics}
QUERY message:     answers cis-node {index, id, size} (the server maps Flower node ids to CIS nodes)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from cis.core.errors import CisError
from cis.training.device import resolve_device, with_amp
from cis.training.federated import derived_generator
from cis.training.flower.records import (
    ARRAYS_KEY,
    CONFIG_KEY,
    CONFIG_RECORD,
    METRICS_RECORD,
    NODE_RECORD,
    OPTIMIZER_STATE,
    STATS_RECORD,
    node_index,
    node_setup,
    record_to_state,
    state_to_record,
)
from cis.training.local import Client, ExitSGDTrainer
from cis.training.models.model_ref import build_model

DATA_STATE = "cis-data"
NODE_STATE = "cis-node"

app = ClientApp()


def node_client(config_text: str, context: Context) -> Client:
    """This node's data: from context.state after the first message of the run, else built and kept there."""
    st = context.state
    if DATA_STATE in st and NODE_STATE in st:
        # what the lines below put there: an ArrayRecord and a ConfigRecord
        data, meta = record_to_state(cast(ArrayRecord, st[DATA_STATE])), cast(Mapping[str, Any], st[NODE_STATE])
        return Client(str(meta["id"]), int(meta["index"]), int(meta["max_exit"]), data["x"], data["y"])
    s = node_setup(config_text)
    c = s.clients[node_index(context.node_config, s)]
    st[DATA_STATE] = state_to_record({"x": c.x, "y": c.y})
    st[NODE_STATE] = ConfigRecord({"id": c.id, "index": c.index, "max_exit": c.max_exit})
    return c


@lru_cache(maxsize=2)
def working_model(model_json: str):
    return build_model(json.loads(model_json))


@app.query()
def identify(msg: Message, context: Context) -> Message:
    c = node_client(str(msg.content[CONFIG_RECORD][CONFIG_KEY]), context)
    return Message(
        RecordDict({NODE_RECORD: ConfigRecord({"index": c.index, "id": c.id, "size": c.size})}), reply_to=msg
    )


def load_node_optimizer(trainer, cid: str, state: RecordDict) -> None:
    """Put this node's optimizer state (momentum) from context.state into the trainer (none yet: a fresh optimizer)."""
    flat = record_to_state(cast(ArrayRecord, state[OPTIMIZER_STATE])) if OPTIMIZER_STATE in state else {}
    trainer.load_state_dict({"optimizer": {cid: flat}})


def save_node_optimizer(trainer, cid: str, state: RecordDict) -> None:
    flat = trainer.state_dict()["optimizer"].get(cid, {})
    state[OPTIMIZER_STATE] = state_to_record(flat) if flat else ArrayRecord()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = cast(Mapping[str, Any], msg.content[CONFIG_RECORD])  # the strategy's ConfigRecord
    run = json.loads(str(cfg[CONFIG_KEY]))
    if run.get("threads"):
        torch.set_num_threads(int(run["threads"]))
    client = node_client(str(cfg[CONFIG_KEY]), context)
    i, e, t = client.index, int(cfg["exit"]), int(cfg["server-round"])
    if int(cfg["node-index"]) != i:
        raise CisError(f"flower: a message for CIS node {cfg['node-index']} reached node {i} ({client.id})")
    if not 1 <= e <= client.max_exit:
        raise CisError(f"flower: node {client.id} holds exits 1..{client.max_exit}; asked to train exit {e}")
    device = resolve_device(run.get("device", "auto"))
    client = Client(client.id, client.index, client.max_exit, client.x.to(device), client.y.to(device))
    model = working_model(str(cfg["model"])).to(device)
    trainer = ExitSGDTrainer(**json.loads(str(cfg["trainer"])))  # the server Setup's own trainer parameters
    trainer.setup(model, [client])
    trainer = with_amp(trainer, run.get("amp", "off"), device)
    load_node_optimizer(trainer, client.id, context.state)
    model.load_state_dict(record_to_state(cast(ArrayRecord, msg.content[ARRAYS_KEY])))
    stats = trainer.train(model, client, e, t, derived_generator(int(run["seed"]), t, i + 1))
    save_node_optimizer(trainer, client.id, context.state)
    numeric = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    content = RecordDict({
        ARRAYS_KEY: state_to_record(model.state_dict()),
        METRICS_RECORD: MetricRecord({"num-examples": client.size, **numeric}),
        STATS_RECORD: ConfigRecord({"node-index": i, "exit": e, "json": json.dumps(stats, default=float)}),
    })
    return Message(content, reply_to=msg)
