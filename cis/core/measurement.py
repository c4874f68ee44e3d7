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

KINDS = ("status", "metrics", "requests", "saved")  # where a measurement's counts came from
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
        """The measured nodes must be the spec's, with the same exits (none beyond the spec's 1..E: a measurement's
        every exit is in its own 1..``num_exits``, :func:`_check_node`)."""
        if self.num_exits > spec.num_exits:
            raise CisError(f"{self.source}: the measurement has {self.num_exits} exits; expected exits "
                           f"1..{spec.num_exits} as {where} has")
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
        if head["kind"] not in KINDS:
            raise CisError(f"{source}: measurement.kind is {head['kind']!r}; expected one of {', '.join(KINDS)} "
                           "(the JSON of 'cis rates --measured SOURCE --json')")
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
    if m.num_exits < 1:
        raise CisError(f"{m.source}: the measurement has {m.num_exits} exits; expected at least 1")
    for i, n in m.nodes.items():
        _check_node(m, i, n)
    if not (math.isfinite(m.seconds) and m.seconds > 0):
        raise CisError(f"{m.source}: the window is {m.seconds!r} s; expected a positive length of time")
    if m.served <= 0:
        raise CisError(f"{m.source}: no request was served in the window ({m.window}); expected traffic to measure")
    return m


def _check_node(m: Measurement, i: str, n: NodeCounts) -> None:
    """One node's counts: its exit and every exit it served at in 1..E, its parent a measured node (or none),
    no negative count (``arrived`` may be: a sample in flight at a snapshot), served the sum over its exits."""
    where = f"{m.source}: node {i!r}"
    if not 1 <= n.exit <= m.num_exits:
        raise CisError(f"{where}: exit {n.exit}; expected an exit in 1..{m.num_exits}")
    if n.parent is not None and (not isinstance(n.parent, str) or n.parent not in m.nodes):
        raise CisError(f"{where}: parent {n.parent!r} is not a node of the measurement; expected one of "
                       f"{', '.join(m.nodes)} or null (the root)")
    for e, k in n.served_per_exit.items():
        if not 1 <= e <= m.num_exits:
            raise CisError(f"{where}: served_per_exit has exit {e}; expected exits in 1..{m.num_exits}")
        if k < 0:
            raise CisError(f"{where}: served_per_exit[{e}] is {k}; expected a count >= 0")
    for name, k in (("served", n.served), ("forwarded", n.forwarded)):
        if k < 0:
            raise CisError(f"{where}: {name} is {k}; expected a count >= 0")
    if n.served != sum(n.served_per_exit.values()):
        raise CisError(f"{where}: served is {n.served} but served_per_exit adds up to "
                       f"{sum(n.served_per_exit.values())}; expected the same count")
