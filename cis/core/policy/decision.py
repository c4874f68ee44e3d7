"""The exit decision on one micro-batch at one node, stage by stage: what
:meth:`cis.core.policy.exit_policy.ExitPolicy.batch`
gives the runtime executor.

Requests :meth:`~BatchDecision.join` at their entry stage with what they carry, every stage's logits pass
through :meth:`~BatchDecision.stage`, and :meth:`~BatchDecision.verdict` decides at the node's exit:
:class:`ThresholdDecision` looks at the last logits only; :class:`PatienceDecision` advances FLAME's patience
state (:mod:`cis.core.policy.patience`) at every stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cis.core.policy import patience as patience_rule
from cis.core.policy.confidence import confidence


@dataclass(slots=True)
class Verdict:
    """The exit decision on a batch at one node, per sample."""

    serve: np.ndarray | None  # served here (None: all of it, at the root)
    cls: np.ndarray  # the class answered
    conf: np.ndarray  # the confidence reported (under patience: the count)
    exit_at: np.ndarray | None  # the exit that serves each sample here (None: the node's own)
    state: dict[str, np.ndarray]  # the rule's state that goes up with the carry (ExitPolicy.state_names)


class Deciding(Protocol):
    """What a decision asks of its policy (:class:`cis.core.policy.exit_policy.ExitPolicy`, which makes it): named
    here so this module does not import the policy that imports it."""

    measure: str

    def decide(self, node_id: str, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def decide_patience(
        self, logits: np.ndarray, state: patience_rule.PatienceState
    ) -> tuple[np.ndarray, patience_rule.PatienceState]: ...


class BatchDecision(Protocol):
    """One micro-batch's exit decision at one node (:meth:`ExitPolicy.batch`). Requests :meth:`join` at their
    entry stage with what they carry, every stage's logits pass through :meth:`stage`, and :meth:`verdict`
    decides at the node's exit."""

    def join(self, carries: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]) -> None: ...

    def stage(self, k: int, logits: np.ndarray) -> None: ...

    def verdict(self, logits: np.ndarray, keep: np.ndarray | None = None) -> Verdict:
        """Decide on the batch's logits at the node's exit (``keep``: the samples still in the batch)."""
        ...


class ThresholdDecision:
    """Thresholds look at the node's exit only: nothing to carry, nothing to see before."""

    def __init__(self, policy: Deciding, node_id: str, root: bool):
        self.policy, self.node_id, self.root = policy, node_id, root

    def join(self, carries: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]) -> None:
        pass

    def stage(self, k: int, logits: np.ndarray) -> None:
        pass

    def verdict(self, logits: np.ndarray, keep: np.ndarray | None = None) -> Verdict:
        if self.root:  # the root serves everything: only the confidence to report
            return Verdict(None, logits.argmax(axis=-1), confidence(logits, self.policy.measure), None, {})
        serve, conf = self.policy.decide(self.node_id, logits)
        return Verdict(serve, logits.argmax(axis=-1), conf, None, {})


class PatienceDecision:
    """The patience rule advances the state requests carry at every stage and keeps, per sample, the first
    exit here whose count reached p, with that exit's class and count (the root too: the rest at its exit)."""

    def __init__(self, policy: Deciding, node_exit: int):
        self.policy, self.node_exit = policy, node_exit
        self.state: patience_rule.PatienceState | None = None
        self.hit_exit, self.hit_cls = np.zeros(0, np.int32), np.zeros(0, np.int64)
        self.hit_count = np.zeros(0, np.float32)

    def join(self, carries: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]) -> None:
        fresh = [patience_rule.from_carry(c, n) for c, n in zip(carries, sizes)]
        self.state = patience_rule.concat(([self.state] if self.state is not None else []) + fresh)
        m = sum(sizes)
        self.hit_exit = np.concatenate([self.hit_exit, np.zeros(m, np.int32)])
        self.hit_cls = np.concatenate([self.hit_cls, np.zeros(m, np.int64)])
        self.hit_count = np.concatenate([self.hit_count, np.zeros(m, np.float32)])

    def stage(self, k: int, logits: np.ndarray) -> None:
        assert self.state is not None  # requests joined before their first stage
        done, self.state = self.policy.decide_patience(logits, self.state)
        first = done & (self.hit_exit == 0)
        self.hit_exit[first], self.hit_cls[first] = k, self.state.label[first]
        self.hit_count[first] = self.state.count[first]

    def verdict(self, logits: np.ndarray, keep: np.ndarray | None = None) -> Verdict:
        """Served at the first exit here that reached p; the confidence reported is the count."""
        assert self.state is not None  # requests joined before their first stage
        state = self.state if keep is None else patience_rule.select(self.state, keep)
        hit_exit, hit_cls, hit_count = (
            (a if keep is None else a[keep]) for a in (self.hit_exit, self.hit_cls, self.hit_count)
        )
        serve = hit_exit > 0
        return Verdict(
            serve,
            np.where(serve, hit_cls, logits.argmax(axis=-1)),
            np.where(serve, hit_count, state.count.astype(np.float32)),
            np.where(serve, hit_exit, self.node_exit).astype(np.int32),
            patience_rule.to_carry(state),
        )
