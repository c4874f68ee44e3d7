"""A measurement of a running CIS: served, forwarded and arrived counts per node over a window.

:mod:`cis.runtime.measure` reads one from any source (live nodes, a log folder, a requests file, a saved
measurement); :meth:`Measurement.rates` turns it into the calculus' :class:`cis.core.rates.Rates`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cis.core.errors import CisError
from cis.core.rates import Rates
from cis.core.spec import CisSpec

Tree = dict[str, tuple[int, "str | None"]]  # node id -> (its exit, its parent's id)


@dataclass(frozen=True)
class NodeCounts:
    """What one node served and forwarded over a measurement's window, and what entered the tree there."""

    exit: int
    parent: str | None
    served: int
    forwarded: int
    arrived: int
    served_per_exit: dict[int, int]


@dataclass(frozen=True)
class Measurement:
    """Counts per node over a window of ``seconds``; ``kind`` is status, metrics, requests or saved."""

    source: str
    kind: str
    window: str  # how the window was taken, in words
    seconds: float
    num_exits: int
    nodes: dict[str, NodeCounts]

    @property
    def served(self) -> int:
        return sum(n.served for n in self.nodes.values())

    def rates(self) -> Rates:
        """The measured rates (requests/s): the counts over the window."""
        s = self.seconds
        per_exit = {e: 0.0 for e in range(1, self.num_exits + 1)}
        for n in self.nodes.values():
            for e, k in n.served_per_exit.items():
                per_exit[e] = per_exit.get(e, 0.0) + k / s
        nodes = self.nodes
        return Rates(
            incoming={i: (n.served + n.forwarded) / s for i, n in nodes.items()},
            transfer_rate={i: n.forwarded / s for i, n in nodes.items()},
            serving_rate={i: n.served / s for i, n in nodes.items()},
            exit_serving_rate=per_exit,
            arrival_rate={i: n.arrived / s for i, n in nodes.items()},
        )

    def check_tree(self, spec: CisSpec, where: str) -> None:
        """The measured nodes must be the spec's, with the same exits."""
        missing = [i for i in spec.ids if i not in self.nodes]
        extra = [i for i in self.nodes if i not in spec.ids]
        if missing or extra:
            what = f"has no node {missing[0]!r}" if missing else f"has node {extra[0]!r}, which the spec lacks"
            raise CisError(
                f"{self.source}: the measurement {what}; expected the nodes of {where} ({', '.join(spec.ids)})"
            )
        for n in spec.nodes:
            if self.nodes[n.id].exit != n.exit:
                raise CisError(
                    f"{self.source}: node {n.id!r} serves exit {self.nodes[n.id].exit}; {where} says exit {n.exit}"
                )

    def to_json(self) -> dict:
        """The counts (``cis rates --measured --json`` adds rates beside them; :func:`from_json` reads both)."""
        return {
            "measurement": {
                "kind": self.kind, "source": self.source, "window": self.window, "seconds": self.seconds,
                "exits": self.num_exits, "served": self.served,
            },
            "nodes": {
                i: {
                    "exit": n.exit, "parent": n.parent, "arrived": n.arrived, "forwarded": n.forwarded,
                    "served": n.served, "served_per_exit": {str(e): k for e, k in n.served_per_exit.items()},
                }
                for i, n in self.nodes.items()
            },
        }


def from_json(data: dict, source: str) -> Measurement:
    """A measurement saved by ``cis rates --measured ... --json``."""
    try:
        head = data["measurement"]
        nodes = {
            str(i): NodeCounts(
                int(n["exit"]), n["parent"], int(n["served"]), int(n["forwarded"]), int(n["arrived"]),
                {int(e): int(k) for e, k in n["served_per_exit"].items()},
            )
            for i, n in data["nodes"].items()
        }
        m = Measurement(source, "saved", f"{head['window']} (saved from {head['source']})", float(head["seconds"]),
                        int(head["exits"]), nodes)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CisError(
            f"{source}: not a saved measurement ({type(exc).__name__}: {exc}); "
            "expected the JSON of 'cis rates --measured SOURCE --json'"
        ) from None
    return _checked(m)


def from_counts(
    source: str, kind: str, window: str, seconds: float, tree: Tree, num_exits: int,
    served_per_exit: Mapping[str, Mapping[int, int]], forwarded: Mapping[str, int],
    arrived: Mapping[str, int] | None = None,
) -> Measurement:
    """A measurement from per-node counts; ``arrived`` None: served + forwarded - the children's forwarded."""
    nodes = {}
    for i, (exit_, parent) in tree.items():
        served = int(sum(served_per_exit[i].values()))
        children = sum(forwarded[c] for c, (_, p) in tree.items() if p == i)
        came = served + forwarded[i] - children if arrived is None else arrived.get(i, 0)
        per_exit = {e: int(k) for e, k in sorted(served_per_exit[i].items())}
        nodes[i] = NodeCounts(exit_, parent, served, int(forwarded[i]), int(came), per_exit)
    return _checked(Measurement(source, kind, window, float(seconds), num_exits, nodes))


def _checked(m: Measurement) -> Measurement:
    if not (math.isfinite(m.seconds) and m.seconds > 0):
        raise CisError(f"{m.source}: the window is {m.seconds!r} s; expected a positive length of time")
    if m.served <= 0:
        raise CisError(f"{m.source}: no request was served in the window ({m.window}); expected traffic to measure")
    return m
