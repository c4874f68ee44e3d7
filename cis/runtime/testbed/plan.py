"""Where every node of a testbed lives: its namespace, interfaces and addresses (pure; no ``ip`` runs here).

Each node gets a network namespace ``cistb-RUN-I`` (RUN: the testbed's run id,
I: the node's index in the spec; every replica of a node with replicas is a node
here, its own host, named by its replica id: :mod:`cis.core.replicas`) with two
kinds of veth links:

- an **access** link to the caller's namespace (``tbRUNnI`` there, ``acc`` in
  the node's), unshaped: the node's address is its end of it, so a client, the
  launcher's probes and ``cis status`` reach every node as they reach a local one;
- a **tree** link to its parent (``uplink`` in the child, ``dnI`` in the parent),
  shaped in both directions to the spec's ``link.bandwidth``. The child reaches
  its parent's address through it (a host route), so a forward crosses the
  shaped link and nothing else. A parent with replicas gets one tree link from
  each child to each replica (``uplink``, ``uplink1``, ... in the child), named
  ``CHILD>REPLICA`` (``edge0>cloud#1``); a link to a parent of one replica is
  named by its child alone.

Addresses are /30 networks carved from one subnet (default 10.213.0.0/16):
access links from its first half, tree links from its second. Nodes that the
spec puts on one host (``host``, ``[hosts]`` with ``cores``) are pinned to that
host's share of the machine's cores (:func:`core_sets`; ``taskset``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cis.core.errors import CisError
from cis.core.replicas import split_replica_id
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
    nodes: dict[str, NodeNet]  # by replica id (the node id, for a node of one replica)
    links: dict[str, LinkNet]  # by link name: the child's id, or CHILD>REPLICA where the parent has replicas

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
    every = [(rid, node) for node in spec.nodes for rid in node.replica_ids]  # each replica its own host
    n = len(every)
    pairs = [(rid, node, p) for rid, node in every if node.parent for p in spec.node(node.parent).replica_ids]
    wanted = 8 * max(n, len(pairs))
    if net.num_addresses < wanted:
        raise CisError(
            f"--subnet {subnet} has {net.num_addresses} addresses; expected at least {wanted} "
            f"(a /30 network for each of the {n} nodes and each of the {len(pairs)} links, in two halves)"
        )
    if not (1 <= port <= 65535):
        raise CisError(f"port {port}; expected 1..65535")
    if len(f"tb{run}n{n - 1}") > IFNAME_MAX:
        raise CisError(f"run id {run!r} is too long for interface names; expected at most 8 digits")
    half = net.num_addresses // 2
    index = {rid: i for i, (rid, _) in enumerate(every)}

    def pair(offset: int) -> tuple[str, str]:
        base = net.network_address + offset
        return str(base + 1), str(base + 2)

    nodes = {}
    for i, (rid, _) in enumerate(every):
        caller_ip, node_ip = pair(4 * i)
        nodes[rid] = NodeNet(rid, i, namespace(run, i), f"tcp://{node_ip}:{port}", f"tb{run}n{i}", caller_ip, node_ip)
    links = {}
    for k, (rid, node, parent) in enumerate(pairs):
        replicas = spec.node(split_replica_id(parent)[0]).replicas
        j = split_replica_id(parent)[1] or 0  # which of the parent's replicas: the child's j-th uplink
        parent_ip, child_ip = pair(half + 4 * k)
        links[rid if replicas == 1 else f"{rid}>{parent}"] = LinkNet(
            rid, parent, f"uplink{j or ''}", f"dn{index[rid]}", child_ip, parent_ip, node.link.bandwidth,
            node.link.latency,
        )
    return NetPlan(run, str(net), nodes, links)


def link_names(plan: NetPlan, name: str) -> list[str]:
    """The links ``name`` means: a link's own name (``edge0``, ``edge0>cloud#1``), or every uplink of a replica
    (``edge0#1``) or of every replica of a node (``edge0``)."""
    if name in plan.links:
        return [name]
    return [k for k, link in plan.links.items() if name in (link.child, split_replica_id(link.child)[0])]


def core_sets(spec: CisSpec, available: list[int]) -> dict[str, list[int]]:
    """The cores each node (each replica, by its id) of a shared host is pinned to: the spec's ``[hosts]`` take,
    in order, as many of the ``available`` cores as each has (``cores``), and every node on a host runs on its
    host's cores. Nodes without a host are not pinned (absent from the result)."""
    wanted = sum(h.cores for h in spec.hosts)
    cpus = sorted(available)
    if wanted > len(cpus):
        asked = ", ".join(f"{h.id} {h.cores}" for h in spec.hosts)
        raise CisError(
            f"spec {spec.name!r}: [hosts] ask for {wanted} cores ({asked}); this machine lets the testbed use "
            f"{len(cpus)} ({', '.join(map(str, cpus))}): expected at most {len(cpus)} in all"
        )
    out: dict[str, list[int]] = {}
    at = 0
    for host in spec.hosts:
        cores = cpus[at : at + host.cores]
        at += host.cores
        for node in spec.on_host(host.id):
            out.update((rid, cores) for rid in node.replica_ids)  # a node's replicas share its host's cores
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
