"""Split a training set over the nodes of a CIS by network layer.

The network layer of a node is its largest exit: layer 1 holds the devices,
layer E the root. A scheme gives each layer a share of the data (the paper's
equal / biased / highly-biased splits, or any list of shares), and each layer's
share is split evenly among its nodes. Optionally, the classes are spread
non-IID with Dirichlet(alpha) proportions while every node keeps its size.

Dirichlet method: for each class c draw q_c ~ Dirichlet(alpha) over the nodes,
giving a target count matrix T[c, i] = n_c * q_c[i]. Node sizes are fixed by the
layer shares, so T is fitted to both margins (class counts n_c and node sizes
s_i) by iterative proportional fitting, which keeps T's cross-ratios (the skew)
while matching the sums. T is rounded per class (largest remainder, so every
class is used exactly), and the few samples by which a node's total is off are
moved, one at a time, from a node with a surplus to one with a deficit, choosing
the class whose rounded count is furthest from the target in that direction.
Node sizes are therefore exact and the class mix is as close to the Dirichlet
draw as the size constraints allow.

Scheme ``node`` (:func:`partition_by_column`) takes each sample's node from the data itself (an npz's
``node`` array, a Hugging Face dataset's ``node`` column): a node's index in the spec's node order
(0-based) or its id; every node must get at least one sample.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from cis.core.errors import CisError

SCHEMES: dict[str, tuple[float, ...]] = {
    "biased": (0.143, 0.286, 0.571),
    "highly-biased": (0.034, 0.199, 0.767),
}

_IPF_ITERATIONS = 500
_DIRICHLET_FLOOR = 1e-12  # keeps IPF well defined when a Dirichlet draw underflows to 0


class NodeLike(Protocol):
    """What partitioning needs of a node: its id and its largest exit (= network layer), read-only (the spec's
    nodes are frozen)."""

    @property
    def id(self) -> str: ...

    @property
    def exit(self) -> int: ...


def layer_shares(scheme: str | Sequence[float], num_layers: int) -> list[float]:
    """The fraction of the data given to each network layer, summing to 1.

    ``scheme`` is ``equal``, ``biased`` (14.3/28.6/57.1 %), ``highly-biased``
    (3.4/19.9/76.7 %) or a list of positive shares, one per layer (normalised,
    so percentages work too). The named biased schemes exist for 3 layers only.
    """
    if isinstance(scheme, str):
        if scheme == "equal":
            return [1.0 / num_layers] * num_layers
        if scheme not in SCHEMES:
            raise CisError(
                f"partition scheme {scheme!r}: unknown, expected 'equal', 'biased', 'highly-biased' or a list of shares"
            )
        if num_layers != len(SCHEMES[scheme]):
            raise CisError(
                f"partition scheme {scheme!r}: the network has {num_layers} layers, expected 3 "
                "(give a list of layer shares instead)"
            )
        shares = list(SCHEMES[scheme])
    else:
        shares = list(scheme)
        if len(shares) != num_layers:
            raise CisError(f"partition shares {shares}: {len(shares)} values, expected one per layer ({num_layers})")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in shares):
            raise CisError(f"partition shares {shares}: expected positive numbers")
    total = float(sum(shares))
    return [s / total for s in shares]


def partition(
    labels: np.ndarray,
    nodes: Sequence[NodeLike],
    scheme: str | Sequence[float] = "equal",
    dirichlet_alpha: float | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Assign every sample index to exactly one node; returns ``{node_id: sorted indices}``.

    Deterministic for a given seed. Layers are the distinct exits of ``nodes`` in
    increasing order; with ``dirichlet_alpha`` the class mix of each node is
    skewed (smaller alpha, more skew) while node sizes stay as without it.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise CisError(f"partition labels: shape {labels.shape} dtype {labels.dtype}, expected a 1-D integer array")
    sizes = node_sizes(len(labels), nodes, scheme)
    rng = np.random.default_rng(seed)
    ids = list(sizes)
    if dirichlet_alpha is None:
        order = rng.permutation(len(labels))
        bounds = np.cumsum([0] + [sizes[i] for i in ids])
        return {i: np.sort(order[bounds[k] : bounds[k + 1]]) for k, i in enumerate(ids)}
    if isinstance(dirichlet_alpha, bool) or not isinstance(dirichlet_alpha, (int, float)) or not dirichlet_alpha > 0:
        raise CisError(f"partition dirichlet_alpha {dirichlet_alpha!r}: expected a positive number")
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(classes))
    target = _dirichlet_targets(counts, np.array([sizes[i] for i in ids]), float(dirichlet_alpha), rng)
    per_node: list[list[np.ndarray]] = [[] for _ in ids]
    for c in range(len(classes)):
        members = rng.permutation(np.flatnonzero(inverse == c))
        bounds = np.cumsum(np.concatenate([[0], target[c]]))
        for k in range(len(ids)):
            per_node[k].append(members[bounds[k] : bounds[k + 1]])
    return {i: np.sort(np.concatenate(per_node[k])) for k, i in enumerate(ids)}


def node_sizes(num_samples: int, nodes: Sequence[NodeLike], scheme: str | Sequence[float] = "equal") -> dict[str, int]:
    """How many samples each node gets: the layer's share, split evenly within the layer.

    Rounding is by largest remainder, so the sizes add up to ``num_samples``.
    """
    nodes = list(nodes)
    if not nodes:
        raise CisError("partition nodes: none given, expected at least one node")
    if num_samples < len(nodes):
        raise CisError(
            f"partition: {num_samples} training sample{'' if num_samples == 1 else 's'} (what the validation split "
            f"leaves) for {len(nodes)} nodes; expected at least one sample per node (a smaller val_size, or more data)"
        )
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise CisError(f"partition nodes: duplicate node ids in {ids}, expected unique ids")
    for n in nodes:
        if isinstance(n.exit, bool) or not isinstance(n.exit, numbers.Integral) or n.exit < 1:
            raise CisError(f"partition node {n.id!r}: exit {n.exit!r}, expected an integer >= 1")
    layers = sorted({n.exit for n in nodes})
    shares = layer_shares(scheme, len(layers))
    per_layer = _largest_remainder(num_samples, np.array(shares))
    sizes: dict[str, int] = {}
    for layer, layer_total in zip(layers, per_layer):
        members = [n.id for n in nodes if n.exit == layer]
        for node_id, size in zip(members, _largest_remainder(int(layer_total), np.ones(len(members)))):
            if size == 0:
                raise CisError(
                    f"partition node {node_id!r}: gets 0 of {num_samples} samples under scheme {scheme!r}, "
                    "expected at least 1 (more data or larger shares for its layer)"
                )
            sizes[node_id] = int(size)
    return {i: sizes[i] for i in ids}


def partition_by_column(column: np.ndarray | None, nodes: Sequence[NodeLike], where: str) -> dict[str, np.ndarray]:
    """``{node_id: sorted indices}`` from a node per sample (its index in ``nodes`` or its id)."""
    ids = [n.id for n in nodes]
    index = node_column_index(column, ids, where)
    parts = {i: np.flatnonzero(index == k) for k, i in enumerate(ids)}
    empty = [i for i, idx in parts.items() if not len(idx)]
    if empty:
        raise CisError(f"data {where}: node column gives node {empty[0]!r} no training sample; expected at least one")
    return parts


def node_column_index(column: np.ndarray | None, ids: Sequence[str], where: str) -> np.ndarray:
    """Each sample's node as its index in ``ids``, from a column of node indices or node ids; one line for a
    value outside the spec. The whole column is checked, every split's rows, though only training rows are used."""
    if column is None:
        raise CisError(f"partition 'node': the data {where} has no node column; expected 'node' beside x and y")
    column = np.asarray(column)
    if column.dtype.kind in "USO":
        names = np.array([v.decode() if isinstance(v, bytes) else str(v) for v in column.tolist()])
        unknown = sorted(set(names.tolist()) - set(ids))
        if unknown:
            raise CisError(
                f"data {where}: node column names node {unknown[0]!r}; the spec's nodes are {', '.join(ids)}"
            )
        return np.array([list(ids).index(v) for v in names.tolist()], np.int64)
    if np.issubdtype(column.dtype, np.integer):
        index = column.astype(np.int64)
        outside = index[(index < 0) | (index >= len(ids))]
        if len(outside):
            raise CisError(
                f"data {where}: node column names node index {int(outside[0])}; the spec has {len(ids)} nodes, "
                f"expected 0..{len(ids) - 1} (or node ids)"
            )
        return index
    raise CisError(f"data {where}: node column has dtype {column.dtype}; expected node indices or node ids")


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to ``weights`` that add up to ``total``; ties go to the earlier entry."""
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    remainder = exact - out
    out[np.argsort(-remainder, kind="stable")[: total - out.sum()]] += 1
    return out


def _dirichlet_targets(counts: np.ndarray, sizes: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Integer matrix M[class, node] with row sums ``counts`` and column sums ``sizes``."""
    props = np.maximum(rng.dirichlet(np.full(len(sizes), alpha), size=len(counts)), _DIRICHLET_FLOOR)
    target = counts[:, None] * props
    for _ in range(_IPF_ITERATIONS):
        target *= sizes / target.sum(axis=0)
        target *= (counts / target.sum(axis=1))[:, None]
    rounded = np.stack([_largest_remainder(int(n), row) for n, row in zip(counts, target)])
    # Each move shrinks the total size error by 2, so this loop ends.
    while True:
        error = rounded.sum(axis=0) - sizes
        if not error.any():
            return rounded
        src, dst = int(np.argmax(error)), int(np.argmin(error))
        gain = (rounded[:, src] - target[:, src]) + (target[:, dst] - rounded[:, dst])
        gain[rounded[:, src] == 0] = -np.inf
        c = int(np.argmax(gain))
        rounded[c, src] -= 1
        rounded[c, dst] += 1


def partition_report(labels: np.ndarray, parts: dict[str, np.ndarray], num_classes: int) -> dict[str, dict]:
    """Per node: ``size``, ``share`` of all partitioned samples and label ``histogram`` (list of counts)."""
    labels = np.asarray(labels)
    total = sum(len(idx) for idx in parts.values())
    return {
        node_id: {
            "size": int(len(idx)),
            "share": len(idx) / total if total else 0.0,
            "histogram": np.bincount(labels[idx], minlength=num_classes).tolist(),
        }
        for node_id, idx in parts.items()
    }


def format_partition_report(report: dict[str, dict]) -> str:
    """A plain-text table of :func:`partition_report`.

    Shows the full histogram for up to 10 classes; with more classes, the number
    of classes present and the largest class's share of the node's data.
    """
    num_classes = len(next(iter(report.values()))["histogram"]) if report else 0
    wide = num_classes > 10
    header = ["node", "size", "share"] + (["classes", "top class"] if wide else [str(c) for c in range(num_classes)])
    rows = [header]
    for node_id, r in report.items():
        hist = np.asarray(r["histogram"])
        row = [node_id, str(r["size"]), f"{100 * r['share']:.1f}%"]
        if wide:
            top = hist.max() / hist.sum() if hist.sum() else 0.0
            row += [str(int((hist > 0).sum())), f"{100 * top:.1f}%"]
        else:
            row += [str(int(v)) for v in hist]
        rows.append(row)
    widths = [max(len(r[k]) for r in rows) for k in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in enumerate(zip(r, widths)))
        for r in rows
    )
