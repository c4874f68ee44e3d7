"""FLAME's patience rule as an exit decision (numpy only).

A request carries a patience state: the label its exits currently agree on and
how many consecutive exits (counting the current one) have predicted it. At
each exit the state is advanced with that exit's logits; the request exits as
soon as the count reaches the patience p, or at the last exit. With p = 1 every
request exits at the first exit.

The state travels with the carry between stages and tiers as two named tensors
(:data:`LABEL`, :data:`COUNT`), so a node that receives a forwarded request
continues the count where the child left it. A fresh request has label -1 (no
label yet) and count 0, which no prediction can agree with.

    state = initial_state(n)
    for e, logits in enumerate(exits, 1):
        state, done = step(state, logits, patience, last=e == len(exits))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from cis.core.errors import CisError

# the exit policy's measure name (cis.core.policy.exit_policy.ExitPolicy(measure=MEASURE, patience=p))
MEASURE = "patience"
LABEL = "patience_label"
COUNT = "patience_count"
NO_LABEL = -1


class PatienceState(NamedTuple):
    label: np.ndarray  # (N,) int64, NO_LABEL before the first exit
    count: np.ndarray  # type: ignore[assignment]  # (N,) int64, consecutive agreeing exits (shadows tuple.count)


def initial_state(n: int) -> PatienceState:
    return PatienceState(np.full(n, NO_LABEL, dtype=np.int64), np.zeros(n, dtype=np.int64))


def check_patience(patience: int) -> int:
    if isinstance(patience, bool) or not isinstance(patience, (int, np.integer)) or patience < 1:
        raise CisError(f"patience {patience!r}: expected an integer >= 1")
    return int(patience)


def step(
    state: PatienceState, logits: np.ndarray, patience: int, last: bool = False
) -> tuple[PatienceState, np.ndarray]:
    """Advance the state by one exit's logits (N, C); returns (new state, exit-now mask).

    The count goes up by one where the predicted label equals the current one
    and restarts at 1 with the new label elsewhere.
    """
    return step_labels(state, np.asarray(logits).argmax(axis=-1), patience, last)


def step_labels(
    state: PatienceState, pred: np.ndarray, patience: int, last: bool = False
) -> tuple[PatienceState, np.ndarray]:
    """:func:`step` from the exit's predicted labels (N,) (what a confidence profile stores)."""
    patience = check_patience(patience)
    pred = np.asarray(pred).astype(np.int64)
    same = pred == state.label
    count = np.where(same, state.count + 1, 1).astype(np.int64)
    new = PatienceState(pred, count)
    done = np.ones(len(pred), dtype=bool) if last else count >= patience
    return new, done


def exit_points(logits: Sequence[np.ndarray], patience: int) -> np.ndarray:
    """The 1-based exit each sample takes, given the logits of every exit 1..E (each (N, C))."""
    if not len(logits):
        raise CisError("patience exits: no exit logits given")
    return exit_points_from_labels(np.stack([np.asarray(z).argmax(axis=-1) for z in logits], axis=1), patience)


def exit_points_from_labels(labels: np.ndarray, patience: int) -> np.ndarray:
    """The 1-based exit each sample takes, given its predicted label at every exit (N, E)."""
    labels = np.asarray(labels)
    n, num_exits = labels.shape
    state = initial_state(n)
    exit_at = np.zeros(n, dtype=np.int64)
    for e in range(1, num_exits + 1):
        state, done = step_labels(state, labels[:, e - 1], patience, last=e == num_exits)
        exit_at = np.where((exit_at == 0) & done, e, exit_at)
    return exit_at


def to_carry(state: PatienceState) -> dict[str, np.ndarray]:
    return {LABEL: state.label, COUNT: state.count}


def concat(states: Sequence[PatienceState]) -> PatienceState:
    return PatienceState(np.concatenate([s.label for s in states]), np.concatenate([s.count for s in states]))


def select(state: PatienceState, idx: np.ndarray) -> PatienceState:
    return PatienceState(state.label[idx], state.count[idx])


def from_carry(carry: Mapping[str, np.ndarray], n: int) -> PatienceState:
    """The state in a carry, or a fresh one when the carry has none (the request's first stage)."""
    if LABEL not in carry or COUNT not in carry:
        return initial_state(n)
    return PatienceState(np.asarray(carry[LABEL], dtype=np.int64), np.asarray(carry[COUNT], dtype=np.int64))
