"""The exit sampling matrix p of Algorithm 1 and the per-round draw of (node, exit) pairs.

``p[i, e-1]`` is the probability that node i trains exit e in a round. Node i can
only train exits 1..E_i (it holds only those stages).

- ``p = 0`` (default): every node trains its own largest exit E_i.
- ``rule="paper"`` (the paper's ablation): p_ie = p for each e < E_i and
  p_{i,E_i} = 1 - (E_i - 1) p.
- ``rule="code"`` (the authors' code): p / (E_i - 1) for each e < E_i and
  1 - p for E_i.
- a full matrix (N x E) given explicitly.

|S_{e,p}| is the total data of the nodes with p_ie > 0 (the set C_e).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cis.core.errors import CisError
from cis.training.cis_options import P_RULES


def sampling_matrix(
    node_exits: Sequence[int],
    num_exits: int,
    p: float = 0.0,
    rule: str = "paper",
    matrix: Sequence[Sequence[float]] | None = None,
) -> np.ndarray:
    """The (N, E) matrix p; rows sum to 1 and are zero beyond each node's largest exit."""
    n = len(node_exits)
    if matrix is not None:
        m = np.asarray(matrix, dtype=np.float64)
        if m.shape != (n, num_exits):
            raise CisError(
                f"sampling matrix: shape {m.shape}, expected ({n}, {num_exits}) (one row per node, one column per exit)"
            )
        for i, e_max in enumerate(node_exits):
            if (m[i] < 0).any() or abs(m[i].sum() - 1.0) > 1e-6:
                raise CisError(
                    f"sampling matrix: row {i} is {m[i].tolist()}, expected non-negative values summing to 1"
                )
            if (m[i, e_max:] > 0).any():
                raise CisError(
                    f"sampling matrix: row {i} gives probability to exits beyond the node's largest exit {e_max}"
                )
        return m
    if rule not in P_RULES:
        raise CisError(f"sampling rule {rule!r}: expected one of {', '.join(P_RULES)}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise CisError(f"sampling p {p!r}: expected a number in [0, 1)")
    m = np.zeros((n, num_exits))
    for i, e_max in enumerate(node_exits):
        if e_max == 1 or p == 0:
            m[i, e_max - 1] = 1.0
            continue
        if rule == "paper":
            own = 1.0 - (e_max - 1) * p
            if own <= 0:
                raise CisError(
                    f"sampling p {p}: leaves node {i} (largest exit {e_max}) probability {own:.3g} for its own exit; "
                    f"expected p < 1/{e_max - 1} with the paper's rule (or use rule 'code')"
                )
            m[i, : e_max - 1] = p
            m[i, e_max - 1] = own
        else:
            m[i, : e_max - 1] = p / (e_max - 1)
            m[i, e_max - 1] = 1.0 - p
    return m


def exit_data_sizes(matrix: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """|S_{e,p}| for e = 1..E: the data of all nodes that may train exit e."""
    s = np.asarray(sizes, dtype=np.float64)
    return ((np.asarray(matrix) > 0) * s[:, None]).sum(axis=0)


def choose_participants(num_nodes: int, fraction: float, gen: torch.Generator) -> list[int]:
    """A uniform sample of round(fraction * N) nodes (at least 1); all of them when fraction >= 1."""
    if fraction >= 1.0:
        return list(range(num_nodes))
    k = max(1, int(round(fraction * num_nodes)))
    return sorted(torch.randperm(num_nodes, generator=gen)[:k].tolist())


def sample_exits(matrix: np.ndarray, participants: Sequence[int], gen: torch.Generator) -> list[tuple[int, int]]:
    """One exit per participating node, drawn from its row of p: [(node index, exit 1..E)]."""
    pairs = []
    for i in participants:
        row = torch.as_tensor(matrix[i], dtype=torch.float64)
        if (row > 0).sum() == 1:
            e = int(torch.argmax(row))
        else:
            e = int(torch.multinomial(row, 1, generator=gen))
        pairs.append((i, e + 1))
    return pairs
