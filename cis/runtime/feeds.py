"""What a node checks of a request's tensors beyond the wire format: the entry stage's contract
and finite values. Both cost the same Python work for one sample or many (numpy does the rest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np


class TensorSpec(Protocol):
    name: str
    shape: tuple
    dtype: str


class FeedContract:
    """The tensors a stage takes, compiled once: names, dtypes, per-sample shapes (the first
    dimension is the batch). ``state``: the patience state's names, which may come along
    (both or neither, int64 (N,)) and start fresh when absent."""

    def __init__(self, inputs: Sequence[TensorSpec], state: Sequence[str] = ()):
        self.want = {t.name: (np.dtype(t.dtype), tuple(t.shape)) for t in inputs}
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
        for name, (dtype, shape) in self.want.items():
            a = tensors[name]
            if a.dtype != dtype:
                return f"tensor {name!r} has dtype {a.dtype.name}; expected {dtype.name}", 0
            if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape[1:], a.shape[1:])):
                return (
                    f"tensor {name!r} has shape {list(a.shape)}; expected {[('N' if s is None else s) for s in shape]}",
                    0,
                )
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                return f"tensors disagree on the batch size ({n} vs {a.shape[0]})", 0
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
    """Per sample, whether any float tensor holds NaN or infinity there; None when all are finite."""
    bad: np.ndarray | None = None
    for a in tensors.values():
        if a.dtype.kind != "f":
            continue
        ok = np.isfinite(a)
        if ok.all():
            continue
        rows = ~ok.reshape(n, -1).all(axis=1)
        bad = rows if bad is None else bad | rows
    return bad
