"""What a node checks of a request's tensors beyond the wire format: the entry stage's contract
and finite values. Both cost the same Python work for one sample or many (numpy does the rest)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np


class TensorSpec(Protocol):
    """A tensor's name, shape (None: any size) and numpy dtype name; read only (cis.core.bundle.TensorInfo is one)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> tuple: ...

    @property
    def dtype(self) -> str: ...


class FeedContract:
    """The tensors a stage takes, compiled once: names, dtypes, per-sample shapes (the first
    dimension is the batch). ``state``: the names of the exit policy's state (patience's), which may
    come along (all or none, int64 (N,)) and start fresh when absent."""

    def __init__(self, inputs: Sequence[TensorSpec], state: Sequence[str] = ()):
        self.want = {t.name: (np.dtype(t.dtype), tuple(t.shape)) for t in inputs}
        # per tensor: name, dtype, rank, per-sample shape (None: a dimension of any size)
        self.items = [(k, dt, len(sh), tuple(sh[1:])) for k, (dt, sh) in self.want.items()]
        self.names = set(self.want)
        self.state = tuple(state)
        self.with_state = self.names | set(state)
        self.int64 = np.dtype("int64")

    def check(self, tensors: Mapping[str, np.ndarray]) -> tuple[str | None, int]:
        """(problem or None, samples)."""
        got = tensors.keys()
        if got != self.names:
            if not self.state or got != self.with_state:
                extra = f" plus optionally both of {list(self.state)}" if self.state else ""
                return f"tensors {sorted(got)}; expected {sorted(self.names)}{extra}", 0
            for name in self.state:
                a = tensors[name]
                if a.dtype != self.int64 or a.ndim != 1:
                    return f"tensor {name!r} has dtype {a.dtype.name} and shape {list(a.shape)}; expected int64 [N]", 0
        n = None
        for name, dtype, rank, tail in self.items:
            a = tensors[name]
            if a.dtype != dtype:
                return f"tensor {name!r} has dtype {a.dtype.name}; expected {dtype.name}", 0
            shape = a.shape
            if len(shape) != rank or (shape[1:] != tail and any(s not in (None, d) for s, d in zip(tail, shape[1:]))):
                want = [("N" if s is None else s) for s in self.want[name][1]]
                return f"tensor {name!r} has shape {list(shape)}; expected {want}", 0
            if n is None:
                n = shape[0]
            elif shape[0] != n:
                return f"tensors disagree on the batch size ({n} vs {shape[0]})", 0
        if got != self.names and any(tensors[s].shape[0] != n for s in self.state):
            return f"tensors {list(self.state)} disagree with the inputs on the batch size", 0
        if not n:
            return "empty batch; expected at least one sample", 0
        return None, int(n)


def check_feeds(
    inputs: Sequence[TensorSpec], tensors: Mapping[str, np.ndarray], state: Sequence[str] = ()
) -> tuple[str | None, int]:
    """:meth:`FeedContract.check` without keeping the contract."""
    return FeedContract(inputs, state).check(tensors)


def nonfinite_rows(tensors: Mapping[str, np.ndarray], n: int) -> np.ndarray | None:
    """Per sample, whether any float tensor holds NaN or infinity there; None when all are finite.

    One pass per tensor when all is well: a sum is finite only if every term is (NaN and infinity
    propagate); only a sum that is not (or overflowed) looks at the values one by one."""
    bad: np.ndarray | None = None
    for a in tensors.values():
        if a.dtype.kind != "f" or math.isfinite(np.add.reduce(a, axis=None)):
            continue
        ok = np.isfinite(a)
        if ok.all():
            continue
        rows = ~ok.reshape(n, -1).all(axis=1)
        bad = rows if bad is None else bad | rows
    return bad


def overflowed(sizes: Sequence[int], over: np.ndarray, node_id: str) -> tuple[np.ndarray, dict[int, str]]:
    """nonfinite="refuse" once the stages ran: the mask of the samples that go on, and for each request
    (``sizes``: their samples, in batch order) with a sample whose logits or carry at the node's exit are not
    finite (``over``: a finite input that overflowed inside the network) the ``bad_input`` message it gets."""
    keep, start, refused = np.ones(len(over), bool), 0, {}
    for i, n in enumerate(sizes):
        end = start + n
        rows = np.flatnonzero(over[start:end])
        if len(rows):
            keep[start:end] = False
            refused[i] = (
                f"{len(rows)} of {n} samples overflow inside the network (first: sample {rows[0]}): their "
                f"outputs at node {node_id}'s exit are NaN or infinite; expected inputs it keeps finite"
            )
        start = end
    return keep, refused
