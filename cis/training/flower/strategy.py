"""Algorithm 1 as a Flower strategy (message API: configure_train / aggregate_train on ArrayRecords).

The strategy owns the server side of the built-in engine, a
:class:`cis.training.federated.FederatedEngine` built by ``cis.training.run.build_setup``,
and calls the engine, never its parts:

- ``configure_train`` (line 3): ``engine.start_from(arrays)`` then ``engine.choose(t)``
  draws the round's (node, exit) pairs exactly as the built-in engine does; each
  sampled node gets one TRAIN message with the global ArrayRecord and a
  ConfigRecord {server-round, node-index, exit, cis-config}.
- ``aggregate_train`` (line 12): ``engine.aggregate_round(t, pairs, replies)``, the
  built-in engine's one aggregation call (cis/training/aggregation/aggregators.py), over the
  replies taken in the order of the drawn pairs, so the float sums are the same as
  in-process; the engine's global state, ``round`` and ``sgd_steps`` advance.
- evaluation is centralised on the server (the validation split, as the built-in
  engine does): ``configure_evaluate`` sends nothing.

Flower node ids are assigned by the SuperLink; before round 1 the strategy sends
one QUERY message to every connected node and each ClientApp answers which CIS
node it is (its node-config ``partition-id`` / ``cis-node``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from logging import INFO
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from cis.core.errors import CisError
from cis.training.federated import FederatedEngine
from cis.training.flower.records import (
    ARRAYS_KEY,
    CONFIG_KEY,
    CONFIG_RECORD,
    NODE_RECORD,
    STATS_RECORD,
    record_to_state,
    state_to_record,
)

TRAINER_FIELDS = (
    "lr",
    "momentum",
    "weight_decay",
    "batch_size",
    "steps",
    "total_rounds",
    "schedule",
    "augment",
    "exit_flops",
    "optimizer",
    "clip_grad_norm",
)


class CisStrategy(Strategy):
    """configure_train: the engine's exit sampling; aggregate_train: the engine's line-12 aggregator."""

    def __init__(self, engine: FederatedEngine, config_text: str, connect_timeout: float = 120.0) -> None:
        self.engine = engine
        self.config_text = config_text
        self.connect_timeout = connect_timeout
        self.nodes: dict[int, int] | None = None  # CIS node index -> Flower node id
        self.pairs: list[tuple[int, int]] = []
        self.round = 0
        self.last_round: dict | None = None
        self._t0 = 0.0
        self.timings: dict[str, float] = {"discover": 0.0, "configure": 0.0, "aggregate": 0.0}
        tr = engine.trainer  # what the nodes build their ExitSGDTrainer and model from
        self.trainer_text = json.dumps({k: getattr(tr, k) for k in TRAINER_FIELDS})
        self.model_text = json.dumps(engine.model.config())

    def summary(self) -> None:
        log(
            INFO,
            "\t├──> CIS Algorithm 1: %d nodes, exit sampling matrix rows %s",
            len(self.engine.clients),
            [list(map(float, r)) for r in np.asarray(getattr(self.engine.chooser, "matrix", []))],
        )
        log(INFO, "\t└──> aggregation: %s (cis/training/aggregation/)", type(self.engine.aggregator).__name__)

    # --- which Flower node is which CIS node -------------------------------------------------
    def discover(self, grid: Grid) -> dict[int, int]:
        t0 = time.perf_counter()
        n = len(self.engine.clients)
        deadline = time.monotonic() + self.connect_timeout
        while len(list(grid.get_node_ids())) < n:
            if time.monotonic() > deadline:
                raise CisError(
                    f"flower: {len(list(grid.get_node_ids()))} SuperNodes connected after {self.connect_timeout:.0f} "
                    f"s; the spec has {n} nodes (one SuperNode each)"
                )
            time.sleep(0.2)
        found: dict[int, int] = {}
        # one query per SuperNode, never sent again: a second one could run beside the node's first train message
        # and write back the node's context from before it (its momentum lost)
        for reply in grid.send_and_receive(self._queries(list(grid.get_node_ids())), timeout=self.connect_timeout):
            self._identify(reply, found)
        missing = sorted(set(range(n)) - set(found))
        if missing:
            ids = ", ".join(self.engine.clients[i].id for i in missing)
            raise CisError(
                f"flower: no SuperNode answered for CIS node(s) {ids} within {self.connect_timeout:.0f} s; start one "
                "per node with --node-config 'partition-id=K'"
            )
        self.nodes = found
        self.timings["discover"] += time.perf_counter() - t0
        log(
            INFO,
            "CIS nodes -> Flower node ids: %s",
            {self.engine.clients[i].id: nid for i, nid in sorted(found.items())},
        )
        return found

    def _queries(self, node_ids: list[int]) -> list[Message]:
        content = RecordDict({CONFIG_RECORD: ConfigRecord({CONFIG_KEY: self.config_text})})
        return [Message(content=content, dst_node_id=nid, message_type=MessageType.QUERY) for nid in node_ids]

    def _identify(self, reply: Message, found: dict[int, int]) -> None:
        """Record which CIS node the replying SuperNode is (its partition-id), refusing errors and duplicates."""
        if reply.has_error():
            raise CisError(f"flower: node {reply.metadata.src_node_id} failed to identify itself: {reply.error.reason}")
        k = int(cast(Mapping[str, Any], reply.content[NODE_RECORD])["index"])  # identify's ConfigRecord
        if k in found:
            raise CisError(
                f"flower: two SuperNodes ({found[k]}, {reply.metadata.src_node_id}) claim CIS node {k}; give each "
                "a different partition-id"
            )
        found[k] = reply.metadata.src_node_id

    # --- line 3 ----------------------------------------------------------------------------------
    def begin_round(self, server_round: int, arrays: ArrayRecord) -> list[tuple[int, int]]:
        """Load the global arrays into the engine and draw this round's (node index, exit) pairs."""
        self._t0 = time.perf_counter()
        self.engine.start_from(record_to_state(arrays))
        self.round = server_round
        self.pairs = self.engine.choose(server_round)
        return self.pairs

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        nodes = self.nodes if self.nodes is not None else self.discover(grid)
        pairs = self.begin_round(server_round, arrays)
        messages = []
        for i, e in pairs:
            cfg = ConfigRecord(
                {
                    **dict(config),
                    "server-round": server_round,
                    "node-index": i,
                    "exit": e,
                    CONFIG_KEY: self.config_text,
                    "model": self.model_text,
                    "trainer": self.trainer_text,
                }
            )
            content = RecordDict({ARRAYS_KEY: arrays, CONFIG_RECORD: cfg})
            messages.append(
                Message(
                    content=content,
                    dst_node_id=nodes[i],
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        self.timings["configure"] += time.perf_counter() - self._t0
        return messages

    # --- line 12 ---------------------------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        t0 = time.perf_counter()
        replies = list(replies)
        errors = [m for m in replies if m.has_error()]
        if errors:
            raise CisError(
                f"flower round {server_round}: {len(errors)} node(s) failed: "
                + "; ".join(f"node {m.metadata.src_node_id}: {m.error.reason}" for m in errors)
            )
        by_index: dict[int, Message] = {}
        for m in replies:
            k = int(cast(Mapping[str, Any], m.content[STATS_RECORD])["node-index"])  # the ClientApp's ConfigRecord
            if self.nodes is not None and self.nodes.get(k) != m.metadata.src_node_id:
                raise CisError(
                    f"flower round {server_round}: a reply for CIS node {k} came from Flower "
                    f"node {m.metadata.src_node_id}, expected {self.nodes.get(k)}"
                )
            by_index[k] = m
        missing = [self.engine.clients[i].id for i, _ in self.pairs if i not in by_index]
        if missing:  # Algorithm 1's estimator needs every sampled pair (no partial rounds)
            raise CisError(
                f"flower round {server_round}: no reply from node(s) {', '.join(missing)} (timeout?); a round needs "
                "every sampled pair"
            )
        engine = self.engine
        records = engine.aggregate_round(server_round, self.pairs, self._updates(server_round, by_index))
        now = time.perf_counter()
        self.timings["aggregate"] += now - t0
        self.last_round = {"round": server_round, "pairs": records, "train_seconds": now - self._t0}
        losses = [r["loss"] for r in records]
        metrics = MetricRecord({"loss": float(np.mean(losses)) if losses else 0.0, "pairs": len(records)})
        return state_to_record(engine.global_state), metrics

    def _updates(self, server_round: int, by_index: dict[int, Message]) -> Iterator[tuple[dict, dict]]:
        """Each drawn pair's (local state, stats) from its reply, in the drawn order (the built-in engine's sums)."""
        device = next(iter(self.engine.global_state.values())).device  # the server's training device
        for i, e in self.pairs:
            stats = cast(Mapping[str, Any], by_index[i].content[STATS_RECORD])  # the ClientApp's ConfigRecord
            got = int(stats["exit"])
            if got != e:
                raise CisError(
                    f"flower round {server_round}: node {self.engine.clients[i].id} trained exit {got}, expected {e}"
                )
            arrays = cast(ArrayRecord, by_index[i].content[ARRAYS_KEY])
            yield _on(record_to_state(arrays), device), json.loads(stats["json"])

    # --- evaluation: centralised on the server ---------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


def _on(state: dict, device) -> dict:
    """A received state dict on the device of the server's global state (no copy on the CPU)."""
    return {k: v.to(device) for k, v in state.items()}
