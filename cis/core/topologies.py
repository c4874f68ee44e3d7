"""Built-in topologies and the paper's "x-y-z" serving settings.

``paper-7`` is the CIS paper's 7-node tree (4 devices with exit 1, 2 edge
servers with exit 2, 1 cloud with exit 3); ``paper-17`` has 12 devices, 4 edge
servers and 1 cloud. A serving setting "x-y-z" (e.g. 80-15-5) is the share of
all requests served at exits 1, 2, 3. As in the paper's experiments, all
requests arrive at the leaves (split evenly); each node's transfer cap is set so
that the rate calculus reproduces the shares:

    mu_max(i) = (arrivals in i's subtree) * (sum of the shares of exits > E_i)

This holds when every leaf-to-root path passes through one node of every exit
(as in the built-in trees); elsewhere the rate calculus reports what the caps
really produce.
"""

from __future__ import annotations

import math

from cis.core.errors import CisError
from cis.core.spec import CisSpec, Link, Node

TOPOLOGIES = {
    # name: (devices per edge, edges)
    "paper-7": (2, 2),
    "paper-17": (3, 4),
}
DEFAULT_TOTAL_RATE = 100.0
BASE_PORT = 5550

# Our choice of default links: a device uplink of 20 Mbit/s and 5 ms, an edge
# uplink of 100 Mbit/s and 20 ms. Speeds default to 1 so that the runtime on one
# machine and the simulator describe the same hardware.
DEVICE_LINK = Link(bandwidth=2.5e6, latency=0.005)
EDGE_LINK = Link(bandwidth=1.25e7, latency=0.020)


def parse_serving(text: str, num_exits: int | None = None) -> list[float]:
    """Parse "80-15-5" into shares that sum to 1. The numbers are percentages that add up to 100, or whole-number
    roundings of such (33-33-33 is read as thirds): each x is read as x * 100 / sum, and a setting where that
    moves a share by half a point or more (80-15-6: 79.2-14.9-5.9) is refused, not rescaled."""
    parts = str(text).split("-")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise CisError(f"serving setting {text!r}: expected numbers joined by '-', such as 80-15-5") from None
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise CisError(f"serving setting {text!r}: expected non-negative percentages with a positive sum")
    if num_exits is not None and len(values) != num_exits:
        raise CisError(f"serving setting {text!r}: has {len(values)} shares; expected one per exit ({num_exits})")
    total = sum(values)
    if max(values) * abs(total - 100.0) / total >= 0.5:  # x - x * 100 / total: no share moves half a point
        raise CisError(f"serving setting {text!r}: the shares add up to {total:g}; expected percentages that add up "
                       "to 100 (whole-number roundings such as 33-33-33 are read as thirds)")
    return [v / total for v in values]


def builtin_spec(topology: str = "paper-7", total_rate: float = DEFAULT_TOTAL_RATE, num_classes: int = 10) -> CisSpec:
    """A built-in tree with arrivals at the leaves and no transfer caps set yet (all forwarded)."""
    if topology not in TOPOLOGIES:
        raise CisError(f"topology {topology!r}: unknown; expected one of {', '.join(TOPOLOGIES)}")
    per_edge, edges = TOPOLOGIES[topology]
    leaves = per_edge * edges
    port = iter(range(BASE_PORT, BASE_PORT + 1000))
    nodes = [Node(id="cloud", exit=3, address=f"tcp://127.0.0.1:{next(port)}")]
    for e in range(edges):
        nodes.append(Node(id=f"edge{e}", exit=2, parent="cloud", link=EDGE_LINK, address=f"tcp://127.0.0.1:{next(port)}"))
    for d in range(leaves):
        nodes.append(
            Node(
                id=f"device{d}",
                exit=1,
                parent=f"edge{d // per_edge}",
                arrival_rate=total_rate / leaves,
                link=DEVICE_LINK,
                address=f"tcp://127.0.0.1:{next(port)}",
            )
        )
    unset = CisSpec(tuple(nodes), num_exits=3, num_classes=num_classes, name=topology)
    return apply_serving(unset, [0.0, 0.0, 1.0])


def apply_serving(spec: CisSpec, shares: list[float]) -> CisSpec:
    """Set every node's transfer cap so that exit e serves ``shares[e-1]`` of all requests."""
    if len(shares) != spec.num_exits:
        raise CisError(f"serving shares {shares}: expected {spec.num_exits} values, one per exit")
    subtree_arrivals = {n.id: n.arrival_rate for n in spec.nodes}
    for node in spec.bottom_up():
        if node.parent is not None:
            subtree_arrivals[node.parent] += subtree_arrivals[node.id]
    nodes = []
    for n in spec.nodes:
        above = sum(shares[n.exit:])  # shares of exits deeper than this node's
        cap = 0.0 if n.parent is None else subtree_arrivals[n.id] * above
        nodes.append(Node(**{**n.__dict__, "max_transfer_rate": round(cap, 9)}))
    return spec.replace_nodes(nodes)


def make_spec(topology: str, serving: str, total_rate: float = DEFAULT_TOTAL_RATE, num_classes: int = 10) -> CisSpec:
    """A built-in topology under an "x-y-z" serving setting."""
    spec = builtin_spec(topology, total_rate, num_classes)
    return apply_serving(spec, parse_serving(serving, spec.num_exits))
