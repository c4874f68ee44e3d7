"""The CIS spec: one TOML file that describes the collaborative inference system.

A spec is a tree of nodes. Each node has its largest exit ``exit`` (E_i), a local
``arrival_rate`` (lambda_a, requests/s), a ``max_transfer_rate`` to its parent
(mu_max, requests/s), and optionally a ``link`` to its parent (bandwidth in
bytes/s, latency in s), a relative compute ``speed`` and a ZeroMQ ``address``.
The ``[cis]`` table holds the number of exits, the class count and the
confidence measure. Every stage of the project (training weights, serving
thresholds, simulated load) reads the same spec.

Example::

    [cis]
    exits = 3
    classes = 10
    confidence = "max_softmax"

    [[nodes]]
    id = "root"
    exit = 3

    [[nodes]]
    id = "leaf0"
    parent = "root"
    exit = 1
    arrival_rate = 10.0
    max_transfer_rate = 4.0
    link = { bandwidth = 1.25e6, latency = 0.01 }

Nodes that share a machine name it (``host = "box1"``) and the ``[hosts]``
table says how many cores each machine has (``box1 = { cores = 1 }``): the
simulator shares those cores among the nodes' work, and ``cis testbed`` pins
the nodes of each host to that many cores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from cis.core.errors import SpecError
from cis.core.replicas import derived_address, id_problem, parse_addresses, replica_addresses, replica_ids
from cis.core.spec_file import read_spec_tables

CONFIDENCE_MEASURES = ("max_softmax", "entropy", "margin")
MAX_EXITS = 64  # [cis] exits: far above any early-exit model's (a transformer's layers), below what loops over exits
# where a node runs its stages (cis serve --provider; cis.core.stages.backends): onnxruntime's CPU or CUDA provider,
# TensorRT (the bundle's engines, or onnxruntime's TensorRT provider), or auto (CUDA when it runs, else the CPU)
PROVIDERS = ("cpu", "cuda", "tensorrt", "auto")

_CIS_KEYS = {"exits", "classes", "confidence", "name"}
_TOP_KEYS = {"cis", "nodes", "hosts"}
_HOST_KEYS = {"cores"}
# a node's fields as spec_to_dict writes them, in order (those that are None left out), before its link table
_NODE_FIELDS = (
    "id", "parent", "exit", "arrival_rate", "max_transfer_rate", "speed", "workers", "queue_limit", "address",
    "addresses", "provider", "host", "replicas",
)
_NODE_KEYS = {*_NODE_FIELDS, "link"}
# a node's numeric fields, checked in this order: (minimum, integer); absent ones take Node's default
_NODE_NUMBERS = {
    "exit": (1, True), "arrival_rate": (0.0, False), "max_transfer_rate": (0.0, False), "speed": (1e-9, False),
    "workers": (1, True), "queue_limit": (1, True), "replicas": (1, True),
}
_LINK_KEYS = {"bandwidth", "latency"}


@dataclass(frozen=True)
class Link:
    """The link from a node to its parent."""

    bandwidth: float = 1.25e7  # bytes/s (100 Mbit/s)
    latency: float = 0.001  # seconds, one way


@dataclass(frozen=True)
class Node:
    """One node of the CIS."""

    id: str
    exit: int
    parent: str | None = None
    arrival_rate: float = 0.0
    max_transfer_rate: float = 0.0
    link: Link = field(default_factory=Link)
    speed: float = 1.0
    address: str | None = None
    workers: int = 1
    queue_limit: int | None = None
    provider: str | None = None  # one of PROVIDERS; None: cpu (cis serve --provider overrides)
    host: str | None = None  # the machine the node shares with others (a key of the [hosts] table); None: its own
    replicas: int = 1  # processes that run this node side by side (docs/runtime.md, "Replicas")
    addresses: tuple[str, ...] | None = None  # one address per replica, where ports do not follow ``address``

    @property
    def replica_ids(self) -> list[str]:
        """``[id]`` with one replica, else ``id#0`` .. ``id#N-1`` (:mod:`cis.core.replicas`)."""
        return replica_ids(self.id, self.replicas)

    @property
    def replica_addresses(self) -> list[str] | None:
        """Every replica's address (:func:`cis.core.replicas.replica_addresses`); None without an address."""
        return replica_addresses(self.replicas, self.address, self.addresses)


@dataclass(frozen=True)
class Host:
    """A machine that nodes share (the spec's ``[hosts]`` table): how many cores their work runs on."""

    id: str
    cores: int


@dataclass(frozen=True)
class CisSpec:
    """A validated CIS description. Build it with :func:`load_spec` or :func:`parse_spec`."""

    nodes: tuple[Node, ...]
    num_exits: int
    num_classes: int = 10
    confidence: str = "max_softmax"
    name: str = "cis"
    hosts: tuple[Host, ...] = ()  # machines shared by nodes (Node.host names one)

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise SpecError(f"spec {self.name!r}: no node with id {node_id!r} (nodes: {', '.join(self.ids)})")

    def host(self, host_id: str) -> Host:
        for h in self.hosts:
            if h.id == host_id:
                return h
        raise SpecError(f"spec {self.name!r}: no host {host_id!r} in [hosts] ({', '.join(h.id for h in self.hosts)})")

    def on_host(self, host_id: str) -> list[Node]:
        """The nodes that run on ``host_id``, in spec order."""
        return [n for n in self.nodes if n.host == host_id]

    @property
    def ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    @property
    def root(self) -> Node:
        return next(n for n in self.nodes if n.parent is None)

    def children(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes if n.parent == node_id]

    @property
    def leaves(self) -> list[Node]:
        parents = {n.parent for n in self.nodes}
        return [n for n in self.nodes if n.id not in parents]

    def bottom_up(self) -> list[Node]:
        """Nodes ordered so that every child comes before its parent."""
        depth = {n.id: self.depth(n.id) for n in self.nodes}
        return sorted(self.nodes, key=lambda n: -depth[n.id])

    def depth(self, node_id: str) -> int:
        d, n = 0, self.node(node_id)
        while n.parent is not None:
            n, d = self.node(n.parent), d + 1
        return d

    def path_to_root(self, node_id: str) -> list[Node]:
        """The node itself, then its parent, and so on up to the root."""
        out = [self.node(node_id)]
        while out[-1].parent is not None:
            out.append(self.node(out[-1].parent))
        return out

    def replace_nodes(self, nodes: Iterable[Node]) -> CisSpec:
        """A new validated spec with the same [cis] table and other nodes."""
        return validate(
            CisSpec(tuple(nodes), self.num_exits, self.num_classes, self.confidence, self.name, self.hosts)
        )


def _defaults(cls: type) -> dict[str, Any]:
    """A dataclass's field defaults, where it has one: the one place a spec's default is written."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def _where(source: str, node_id: str | None = None) -> str:
    return f"{source}: node {node_id!r}" if node_id is not None else source


def _number(value: Any, what: str, where: str, minimum: float = 0.0, integer: bool = False,
            maximum: int | None = None) -> float:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    bounds = f">= {minimum:g}" if maximum is None else f"in {minimum:g}..{maximum}"
    if isinstance(value, bool) or not ok_type or (not integer and not math.isfinite(value)):
        kind = "an integer" if integer else "a finite number"
        raise SpecError(f"{where}: field {what!r} is {value!r}; expected {kind} {bounds}")
    if value < minimum or (maximum is not None and value > maximum):
        raise SpecError(f"{where}: field {what!r} is {value!r}; expected a value {bounds}")
    return int(value) if integer else float(value)


def _unknown_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(allowed))}")


def parse_spec(data: dict, source: str = "<spec>") -> CisSpec:
    """Build and validate a spec from the parsed TOML tables."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a TOML document with a [cis] table and [[nodes]]")
    _unknown_keys(data, _TOP_KEYS, source)
    cis_table = data.get("cis")
    if not isinstance(cis_table, dict):
        raise SpecError(f"{source}: missing [cis] table (with exits, classes, confidence)")
    _unknown_keys(cis_table, _CIS_KEYS, f"{source}: [cis]")
    if "exits" not in cis_table:
        raise SpecError(f"{source}: [cis] has no 'exits'; expected the number of exits (an integer >= 1)")
    num_exits = int(_number(cis_table["exits"], "exits", f"{source}: [cis]", 1, integer=True, maximum=MAX_EXITS))
    defaults = _defaults(CisSpec)
    classes = cis_table.get("classes", defaults["num_classes"])
    num_classes = int(_number(classes, "classes", f"{source}: [cis]", 2, integer=True))
    confidence = cis_table.get("confidence", defaults["confidence"])
    if confidence not in CONFIDENCE_MEASURES:
        raise SpecError(
            f"{source}: [cis] confidence is {confidence!r}; expected one of {', '.join(CONFIDENCE_MEASURES)}"
        )
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise SpecError(f"{source}: no [[nodes]]; expected at least one node")
    nodes = [_parse_node(raw, i, source) for i, raw in enumerate(raw_nodes)]
    hosts = _parse_hosts(data.get("hosts", {}), source)
    name = cis_table.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise SpecError(f"{source}: [cis] name is {name!r}; expected a string (a label such as \"paper-7\")")
    spec = CisSpec(tuple(nodes), num_exits, num_classes, confidence, name, hosts)
    return validate(spec, source)


def _parse_hosts(raw: Any, source: str) -> tuple[Host, ...]:
    """``[hosts]``: one table per machine, ``NAME = { cores = N }``."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: [hosts] is {raw!r}; expected a table of hosts such as box1 = {{ cores = 2 }}")
    hosts = []
    for host_id, table in raw.items():
        where = f"{source}: host {host_id!r}"
        if not isinstance(table, dict):
            raise SpecError(f"{where} is {table!r}; expected a table with 'cores' (e.g. {host_id} = {{ cores = 2 }})")
        _unknown_keys(table, _HOST_KEYS, where)
        if "cores" not in table:
            raise SpecError(f"{where}: missing 'cores'; expected the number of cores its nodes share (an integer >= 1)")
        hosts.append(Host(host_id, int(_number(table["cores"], "cores", where, 1, integer=True))))
    return tuple(hosts)


def _parse_node(raw: Any, index: int, source: str) -> Node:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: nodes[{index}] is not a table")
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not node_id:
        raise SpecError(f"{source}: nodes[{index}] has no 'id'; expected a non-empty string")
    where = _where(source, node_id)
    _unknown_keys(raw, _NODE_KEYS, where)
    if "exit" not in raw:
        raise SpecError(f"{where}: missing 'exit'; expected the node's largest exit (an integer >= 1)")
    parent = raw.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise SpecError(f"{where}: field 'parent' is {parent!r}; expected a node id (string)")
    link_raw = raw.get("link", {})
    if not isinstance(link_raw, dict):
        raise SpecError(f"{where}: field 'link' is {link_raw!r}; expected a table with bandwidth and latency")
    _unknown_keys(link_raw, _LINK_KEYS, f"{where}: link")
    link = Link(
        bandwidth=_number(link_raw.get("bandwidth", Link.bandwidth), "link.bandwidth", where, 1e-9),
        latency=_number(link_raw.get("latency", Link.latency), "link.latency", where),
    )
    address = raw.get("address")
    if address is not None and (not isinstance(address, str) or "://" not in address):  # tcp://, ipc://
        raise SpecError(f"{where}: field 'address' is {address!r}; expected a ZeroMQ endpoint such as 'tcp://127.0.0.1:5555'")
    host = raw.get("host")
    if host is not None and (not isinstance(host, str) or not host):
        raise SpecError(f"{where}: field 'host' is {host!r}; expected the name of a host in the [hosts] table")
    provider = raw.get("provider")
    if provider is not None and provider not in PROVIDERS:
        raise SpecError(f"{where}: field 'provider' is {provider!r}; expected one of {', '.join(PROVIDERS)}")
    try:
        addresses = parse_addresses(raw.get("addresses"), raw.get("address"))
    except ValueError as exc:
        raise SpecError(f"{where}: {exc}") from None
    numbers: dict[str, Any] = {}
    for name, (minimum, integer) in _NODE_NUMBERS.items():
        value = raw.get(name, len(addresses) if name == "replicas" and addresses else _defaults(Node).get(name))
        numbers[name] = None if value is None else _number(value, name, where, minimum, integer)
    if addresses and numbers["replicas"] != len(addresses):
        raise SpecError(f"{where}: 'replicas' is {numbers['replicas']} but 'addresses' lists {len(addresses)}; "
                        "expected one address per replica")
    return Node(
        id=node_id,
        parent=parent,
        link=link,
        address=address,
        provider=provider,
        host=host,
        addresses=addresses,
        **numbers,
    )


def validate(spec: CisSpec, source: str | None = None) -> CisSpec:
    """Check the structure of a spec; raise :class:`SpecError` with one clear line."""
    source = source or spec.name
    _check_nodes(spec, source)
    _check_hosts(spec, source)
    _check_tree(spec, source)
    _check_addresses(spec, source)
    return spec


def _check_addresses(spec: CisSpec, source: str) -> None:
    """Every replica has an address it can bind (port + i needs a TCP port), and no two share one."""
    owner: dict[str, str] = {}
    for n in spec.nodes:
        if n.replicas > 1 and n.address is not None and n.addresses is None:
            try:
                derived_address(n.address, n.replicas - 1)
            except ValueError as exc:
                raise SpecError(f"{_where(source, n.id)}: {n.replicas} replicas, but {exc}; expected "
                                "addresses = [...] with one endpoint per replica") from None
        for rid, address in zip(n.replica_ids, n.replica_addresses or ()):
            if address in owner:
                raise SpecError(f"{_where(source, n.id)}: {rid} would bind {address}, as {owner[address]} does; "
                                "expected every replica at its own address (replica i binds the node's port + i; "
                                "or give addresses = [...])")
            owner[address] = rid


def _check_nodes(spec: CisSpec, source: str) -> None:
    """Ids the wire carries, without '#' (cis.core.replicas.id_problem) and unique; exits in range; parents that
    exist and are not the node itself."""
    seen: set[str] = set()
    for n in spec.nodes:
        why = id_problem(n.id, n.replicas)
        if why is not None:  # the id of a node, or a replica's, that cannot be served or named
            shown = n.id[:40] + "..." if isinstance(n.id, str) and len(n.id) > 40 else n.id
            raise SpecError(f"{_where(source, shown)}: {why}")
        if n.id in seen:
            raise SpecError(f"{_where(source, n.id)}: duplicate id; every node needs a unique id")
        seen.add(n.id)
    for n in spec.nodes:
        where = _where(source, n.id)
        if not 1 <= n.exit <= spec.num_exits:
            raise SpecError(f"{where}: field 'exit' is {n.exit}; expected 1..{spec.num_exits} (the [cis] exits)")
        if n.parent is not None and n.parent not in seen:
            raise SpecError(f"{where}: unknown parent {n.parent!r}; expected one of {', '.join(sorted(seen - {n.id}))}")
        if n.parent == n.id:
            raise SpecError(f"{where}: node is its own parent")


def _check_hosts(spec: CisSpec, source: str) -> None:
    """Unique host names with cores >= 1, and every node's host among them."""
    host_ids = [h.id for h in spec.hosts]
    for h in spec.hosts:
        if host_ids.count(h.id) > 1:
            raise SpecError(f"{source}: host {h.id!r}: duplicate; every host needs a unique name")
        if isinstance(h.cores, bool) or not isinstance(h.cores, int) or h.cores < 1:
            raise SpecError(f"{source}: host {h.id!r}: field 'cores' is {h.cores!r}; expected an integer >= 1")
    for n in spec.nodes:
        if n.host is not None and n.host not in host_ids:
            expected = f"one of {', '.join(host_ids)} (the [hosts] table)" if host_ids else (
                "a host of the [hosts] table, which the spec does not have"
            )
            raise SpecError(f"{_where(source, n.id)}: field 'host' is {n.host!r}; expected {expected}")


def _check_tree(spec: CisSpec, source: str) -> None:
    """No cycle, one root, and every parent's exit larger than its children's."""
    roots = [n.id for n in spec.nodes if n.parent is None]
    parent_of = {n.id: n.parent for n in spec.nodes}
    reaches_root: set[str] = set()  # walks stop there: every node is walked over once (a chain is not quadratic)
    for n in spec.nodes:  # walk up; a walk that comes back to a node of its own is a cycle
        walked: set[str] = set()
        cur: str | None = n.id
        while cur is not None and cur not in reaches_root:
            if cur in walked:
                raise SpecError(f"{_where(source, n.id)}: parent links form a cycle; expected a tree with one root")
            walked.add(cur)
            cur = parent_of[cur]
        reaches_root.update(walked)
    if len(roots) != 1:
        raise SpecError(
            f"{source}: {len(roots)} roots ({', '.join(roots)}); expected exactly one node without a parent"
        )
    by_id = {n.id: n for n in spec.nodes}
    for n in spec.nodes:
        if n.parent is not None and by_id[n.parent].exit <= n.exit:
            p = by_id[n.parent]
            raise SpecError(
                f"{_where(source, p.id)}: exit {p.exit} is not larger than child {n.id!r}'s exit {n.exit}; "
                "expected a parent's largest exit to exceed every child's"
            )


def load_spec(path: str | Path) -> CisSpec:
    """Read and validate a spec file."""
    return parse_spec(read_spec_tables(path), str(path))


def states_classes(path: str | Path) -> bool:
    """Whether the spec file's ``[cis]`` table sets ``classes`` (a spec without it takes the count from the data
    it is trained on: ``cis train --spec``); the file is one :func:`load_spec` reads (the same one-line errors)."""
    data = read_spec_tables(path)
    return isinstance(data.get("cis"), dict) and "classes" in data["cis"]


def spec_to_dict(spec: CisSpec) -> dict:
    """The TOML tables of a spec (defaults written out, so the file documents itself)."""
    nodes = []
    for n in spec.nodes:
        # defaults written out, but replicas only where a node has more than one (most trees have none)
        d: dict[str, Any] = {k: getattr(n, k) for k in _NODE_FIELDS
                             if getattr(n, k) is not None and not (k == "replicas" and n.replicas == 1)}
        if n.addresses is not None:
            d["addresses"] = list(n.addresses)
        if n.parent is not None:
            d["link"] = {"bandwidth": n.link.bandwidth, "latency": n.link.latency}
        nodes.append(d)
    out: dict[str, Any] = {
        "cis": {"name": spec.name, "exits": spec.num_exits, "classes": spec.num_classes, "confidence": spec.confidence},
        "nodes": nodes,
    }
    if spec.hosts:
        out["hosts"] = {h.id: {"cores": h.cores} for h in spec.hosts}
    return out


def dumps_spec(spec: CisSpec) -> str:
    return tomli_w.dumps(spec_to_dict(spec))


def write_spec(spec: CisSpec, path: str | Path) -> None:
    Path(path).write_text(dumps_spec(spec))
