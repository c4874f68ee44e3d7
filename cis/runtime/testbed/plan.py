"""Where every node of a testbed lives: its namespace, interfaces and addresses (pure; no ``ip`` runs here).

Each node gets a network namespace ``cistb-RUN-I`` (RUN: the testbed's run id,
I: the node's index in the spec) with two kinds of veth links:

- an **access** link to the caller's namespace (``tbRUNnI`` there, ``acc`` in
  the node's), unshaped: the node's address is its end of it, so a client, the
  launcher's probes and ``cis status`` reach every node as they reach a local one;
- a **tree** link to its parent (``uplink`` in the child, ``dnI`` in the parent),
  shaped in both directions to the spec's ``link.bandwidth``. The child reaches
  its parent's address through it (a host route), so a forward crosses the
  shaped link and nothing else.

Addresses are /30 networks carved from one subnet (default 10.213.0.0/16):
access links from its first half, tree links from its second. Nodes that the
spec puts on one host (``host``, ``[hosts]`` with ``cores``) are pinned to that
host's share of the machine's cores (:func:`core_sets`; ``taskset``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cis.core.errors import CisError
from cis.core.spec import CisSpec

PREFIX = "cistb"  # namespaces: cistb-RUN-I; caller-side interfaces: tbRUNnI
DEFAULT_SUBNET = "10.213.0.0/16"
DEFAULT_PORT = 5555
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1


@dataclass(frozen=True)
class NodeNet:
    node: str
    index: int
    namespace: str
    address: str  # the node's ZeroMQ address: tcp://IP:PORT on its access link
    access_if: str  # the access link's end in the caller's namespace
    caller_ip: str  # that end's address
    node_ip: str  # the node's end (interface "acc" in its namespace)


@dataclass(frozen=True)
class LinkNet:
    """The shaped link from ``child`` up to ``parent``."""

    child: str
    parent: str
    child_if: str  # in the child's namespace
    parent_if: str  # in the parent's namespace
    child_ip: str
    parent_ip: str
    bandwidth: float  # bytes/s, both directions (the spec's link.bandwidth)
    latency: float  # seconds one way (the spec's; emulated only where netem exists)


@dataclass(frozen=True)
class NetPlan:
    run: str
    subnet: str
    nodes: dict[str, NodeNet]
    links: dict[str, LinkNet]  # by child node id

    def to_json(self) -> dict:
        return {
            "run": self.run,
            "subnet": self.subnet,
            "nodes": {k: v.__dict__ for k, v in self.nodes.items()},
            "links": {k: v.__dict__ for k, v in self.links.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> NetPlan:
        return cls(
            data["run"],
            data["subnet"],
            {k: NodeNet(**v) for k, v in data["nodes"].items()},
            {k: LinkNet(**v) for k, v in data["links"].items()},
        )


def namespace(run: str, index: int) -> str:
    return f"{PREFIX}-{run}-{index}"


def plan_network(spec: CisSpec, run: str, subnet: str = DEFAULT_SUBNET, port: int = DEFAULT_PORT) -> NetPlan:
    """The namespaces, interfaces and addresses of a testbed for ``spec`` (run id: digits)."""
    try:
        net = ipaddress.IPv4Network(subnet)
    except ValueError as exc:
        raise CisError(
            f"--subnet {subnet!r}: {exc}; expected an IPv4 network such as {DEFAULT_SUBNET}"
        ) from None
    n = len(spec.nodes)
    if net.num_addresses < 8 * n:
        raise CisError(
            f"--subnet {subnet} has {net.num_addresses} addresses; expected at least {8 * n} "
            f"(two /30 networks for each of the {n} nodes)"
        )
    if not (1 <= port <= 65535):
        raise CisError(f"port {port}; expected 1..65535")
    if len(f"tb{run}n{n - 1}") > IFNAME_MAX:
        raise CisError(f"run id {run!r} is too long for interface names; expected at most 8 digits")
    half = net.num_addresses // 2
    index = {node.id: i for i, node in enumerate(spec.nodes)}

    def pair(offset: int) -> tuple[str, str]:
        base = net.network_address + offset
        return str(base + 1), str(base + 2)

    nodes = {}
    for i, node in enumerate(spec.nodes):
        caller_ip, node_ip = pair(4 * i)
        nodes[node.id] = NodeNet(
            node.id, i, namespace(run, i), f"tcp://{node_ip}:{port}", f"tb{run}n{i}", caller_ip, node_ip
        )
    links = {}
    for node in spec.nodes:
        if node.parent is None:
            continue
        i = index[node.id]
        parent_ip, child_ip = pair(half + 4 * i)
        links[node.id] = LinkNet(
            node.id, node.parent, "uplink", f"dn{i}", child_ip, parent_ip, node.link.bandwidth, node.link.latency
        )
    return NetPlan(run, str(net), nodes, links)


def core_sets(spec: CisSpec, available: list[int]) -> dict[str, list[int]]:
    """The cores each node of a shared host is pinned to: the spec's ``[hosts]`` take, in order, as many of
    the ``available`` cores as each has (``cores``), and every node on a host runs on its host's cores.
    Nodes without a host are not pinned (absent from the result)."""
    wanted = sum(h.cores for h in spec.hosts)
    cpus = sorted(available)
    if wanted > len(cpus):
        asked = ", ".join(f"{h.id} {h.cores}" for h in spec.hosts)
        raise CisError(
            f"spec {spec.name!r}: [hosts] ask for {wanted} cores ({asked}); this machine lets the testbed use "
            f"{len(cpus)} ({', '.join(map(str, cpus))}): expected at most {len(cpus)} in all"
        )
    out, at = {}, 0
    for host in spec.hosts:
        cores = cpus[at : at + host.cores]
        at += host.cores
        for node in spec.on_host(host.id):
            out[node.id] = cores
    return out


def overlaps(plan: NetPlan, routes: list[str]) -> str | None:
    """The first of the caller's routes (destinations such as 10.0.0.0/8) that overlaps the plan's subnet."""
    ours = ipaddress.IPv4Network(plan.subnet)
    for dst in routes:
        try:
            theirs = ipaddress.IPv4Network(dst, strict=False)
        except ValueError:
            continue
        if theirs.prefixlen > 0 and ours.overlaps(theirs):
            return dst
    return None
