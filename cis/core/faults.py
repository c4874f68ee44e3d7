"""Link faults on a schedule: one file format for ``cis testbed --faults`` and ``cis simulate --faults``.

A fault file has one event per line, ``AT ACTION NODE [VALUE]``; blank lines and
``#`` comments are skipped::

    # seconds  action     link (the node's uplink)  value
    10         down       edge0
    20         up         edge0
    30         bandwidth  device1                   250000   # bytes/s, as the spec's link.bandwidth

``AT`` is seconds from the start (the testbed: from when every node serves; the
simulator: simulated time 0). ``NODE`` names the link from that node to its
parent. ``down`` partitions the link in both directions (packets are lost, no
process is killed), ``up`` heals it, ``bandwidth`` sets the rate of both
directions to VALUE bytes/s (``inf``: no limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cis.core.errors import CisError
from cis.core.spec import CisSpec

ACTIONS = ("down", "up", "bandwidth")


@dataclass(frozen=True)
class Fault:
    """One scheduled change of the link from ``node`` to its parent."""

    at: float  # seconds from the start
    action: str  # down | up | bandwidth
    node: str
    value: float | None = None  # bandwidth: bytes/s


def parse_fault(text: str, where: str = "fault") -> Fault:
    """``"10 down edge0"`` -> Fault(10.0, "down", "edge0"); one clear line for anything else."""
    fields = text.split("#", 1)[0].split()
    expected = "expected 'AT down|up NODE' or 'AT bandwidth NODE BYTES_PER_S', e.g. '10 down edge0'"
    if len(fields) < 3:
        raise CisError(f"{where}: {text.strip()!r}: {expected}")
    at_text, action, node, *rest = fields
    try:
        at = float(at_text)
    except ValueError:
        raise CisError(f"{where}: time {at_text!r} is not a number; {expected}") from None
    if not (math.isfinite(at) and at >= 0):
        raise CisError(f"{where}: time {at_text!r}; expected seconds >= 0")
    if action not in ACTIONS:
        raise CisError(f"{where}: action {action!r}; expected one of {', '.join(ACTIONS)}")
    if action == "bandwidth":
        if len(rest) != 1:
            raise CisError(f"{where}: 'bandwidth' needs one value; {expected}")
        return Fault(at, action, node, parse_bandwidth(rest[0], where))
    if rest:
        raise CisError(f"{where}: {action!r} takes no value (got {' '.join(rest)!r}); {expected}")
    return Fault(at, action, node)


def parse_bandwidth(text: str, where: str) -> float:
    """Bytes per second > 0 (the spec's unit for link.bandwidth), or ``inf``: no limit."""
    try:
        value = float(text)
    except ValueError:
        raise CisError(f"{where}: bandwidth {text!r} is not a number; expected bytes/s > 0 or inf") from None
    if math.isnan(value) or value <= 0:
        raise CisError(f"{where}: bandwidth {text!r}; expected bytes/s > 0 or inf")
    return value


def read_faults(path: str | Path) -> tuple[Fault, ...]:
    """Every event of a fault file, in time order (events at the same time keep their file order)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CisError(f"fault file {path}: cannot read ({exc.strerror or exc})") from None
    faults = [
        parse_fault(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.split("#", 1)[0].strip()
    ]
    return tuple(sorted(faults, key=lambda f: f.at))


def check_faults(faults: tuple[Fault, ...], spec: CisSpec, where: str = "faults") -> None:
    """Every fault names a node of the spec that has a parent (a link)."""
    for f in faults:
        if f.node not in spec.ids:
            raise CisError(f"{where}: no node {f.node!r} in spec {spec.name!r}; expected one of {', '.join(spec.ids)}")
        if spec.node(f.node).parent is None:
            raise CisError(f"{where}: node {f.node!r} is the root and has no uplink; expected a node with a parent")
