"""What a node checks of a request's tensors beyond the wire format: the entry stage's contract
and finite values. Both cost the same Python work for one sample or many (numpy does the rest)."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np


class TensorSpec(Protocol):
    name: str
    shape: tuple
    dtype: str


def check_feeds(inputs: Sequence[TensorSpec], tensors: Mapping[str, np.ndarray], state: Sequence[str] = ()) -> tuple[str | None, int]:
    """Check the tensors against the entry stage's inputs: (problem or None, samples).

    ``state``: the patience state's names, which may come along (both or neither,
    int64 (N,)) and start fresh when absent."""
    want = {t.name: t for t in inputs}
    extra = set(tensors) - set(want)
    if state and extra:
        if extra != set(state):
            return f"tensors {sorted(tensors)}; expected {sorted(want)} plus optionally both of {list(state)}", 0
        for name in state:
            a = tensors[name]
            if a.dtype.name != "int64" or a.ndim != 1:
                return f"tensor {name!r} has dtype {a.dtype.name} and shape {list(a.shape)}; expected int64 [N]", 0
        n0 = tensors[state[0]].shape[0]
        if tensors[state[1]].shape[0] != n0:
            return f"tensors {list(state)} disagree on the batch size", 0
        problem, n = check_feeds(inputs, {k: v for k, v in tensors.items() if k not in extra})
        if problem is None and n != n0:
            return f"tensors disagree on the batch size ({n} vs {n0})", 0
        return problem, n
    if set(tensors) != set(want):
        return f"tensors {sorted(tensors)}; expected {sorted(want)}", 0
    n = None
    for name, spec in want.items():
        a = tensors[name]
        if a.dtype.name != np.dtype(spec.dtype).name:
            return f"tensor {name!r} has dtype {a.dtype.name}; expected {np.dtype(spec.dtype).name}", 0
        shape = tuple(spec.shape)
        if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape[1:], a.shape[1:])):
            return f"tensor {name!r} has shape {list(a.shape)}; expected {[('N' if s is None else s) for s in shape]}", 0
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            return f"tensors disagree on the batch size ({n} vs {a.shape[0]})", 0
    if not n:
        return "empty batch; expected at least one sample", 0
    return None, int(n)


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

