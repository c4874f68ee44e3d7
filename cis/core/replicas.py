"""Replicas of a node: their ids and addresses, derived from the spec in one place.

A spec node with ``replicas = N`` runs as N processes side by side (docs/runtime.md, *Replicas*).
Everything that starts, reaches or names them (``cis serve --all``, ``cis testbed``, ``cis status``,
``cis infer --spec``, ``cis deploy``, the nodes' own links to their parent) asks here:

- **ids**: with one replica the node id itself (``cloud``); with N > 1, ``ID#i`` for i = 0..N-1
  (``cloud#0``, ``cloud#1``, ``cloud#2``). ``cis serve --node cloud#1`` serves replica 1; logs,
  ``status`` replies and ``/metrics`` name the replica, results name the node (``served_by``: ``cloud``).
- **addresses**: the node's ``addresses = [...]`` list, one endpoint per replica, where given; else
  replica i binds the node's ``address`` with its TCP port + i (``tcp://10.0.0.5:5600`` gives
  ``tcp://10.0.0.5:5601`` for replica 1). Other transports (``ipc://``, ``inproc://``) need the list.

The functions take plain values (no spec types), so the spec's own checks call them too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SEPARATOR = "#"  # between a node id and a replica's index: cloud#1; reserved: no node id holds it
MAX_ID_CHARS = 128  # a node or replica id on the wire (route, sender, node: docs/protocol.md; wire.MAX_NAME)
_TCP = re.compile(r"^(tcp://.+):(\d+)$")
MAX_PORT = 65535


def replica_id(node_id: str, index: int, count: int) -> str:
    """The id of replica ``index`` of ``count``: the node id alone when the node has one replica."""
    return node_id if count == 1 else f"{node_id}{SEPARATOR}{index}"


def replica_ids(node_id: str, count: int) -> list[str]:
    """Every replica's id, in index order."""
    return [replica_id(node_id, i, count) for i in range(count)]


def id_problem(node_id: str, count: int) -> str | None:
    """Why ``node_id`` (of a node with ``count`` replicas) cannot be served, or None: the wire carries node and
    replica ids of 1..MAX_ID_CHARS characters (any characters), and SEPARATOR names replicas."""
    if not isinstance(node_id, str) or not node_id:
        return f"id is {node_id!r}; expected a non-empty string"
    if SEPARATOR in node_id:
        return (f"id holds {SEPARATOR!r}, which is reserved for replica ids (ID{SEPARATOR}i: replica i of a node with "
                f"replicas > 1, such as cloud{SEPARATOR}1); expected an id without {SEPARATOR!r}")
    longest = replica_id(node_id, count - 1, count)
    if len(longest) > MAX_ID_CHARS:
        what = "id" if count == 1 else f"replica id {longest[:40]!r}{'...' if len(longest) > 40 else ''}"
        return (f"{what} is {len(longest)} characters; expected 1..{MAX_ID_CHARS} characters (the longest node or "
                "replica id the wire carries: docs/protocol.md)")
    return None


def split_replica_id(name: str) -> tuple[str, int | None]:
    """``cloud#1`` -> (``cloud``, 1); ``cloud`` -> (``cloud``, None). Raises ValueError for ``cloud#x``."""
    node_id, sep, index = name.rpartition(SEPARATOR)
    if not sep:
        return name, None
    if not index.isdigit() or not node_id:
        raise ValueError(f"{name!r} is not a replica id; expected NODE{SEPARATOR}INDEX such as cloud{SEPARATOR}1")
    return node_id, int(index)


def derived_address(address: str, index: int) -> str:
    """Replica ``index``'s address from the node's: the TCP port + index. Raises ValueError (why) where the
    address has no numeric TCP port or the port would pass 65535."""
    if index == 0:
        return address
    m = _TCP.match(address)
    if m is None:
        raise ValueError(f"address {address!r} has no TCP port to count up from")
    port = int(m.group(2)) + index
    if port > MAX_PORT:
        raise ValueError(f"address {address!r} + {index} is port {port}, past {MAX_PORT}")
    return f"{m.group(1)}:{port}"


def replica_addresses(count: int, address: str | None, addresses: Sequence[str] | None = None) -> list[str] | None:
    """The address of every replica, in index order: ``addresses`` where given, else derived from ``address``
    (:func:`derived_address`); None when the node has neither. Raises ValueError as that does."""
    if addresses:
        return list(addresses)
    if address is None:
        return None
    return [derived_address(address, i) for i in range(count)]


def parse_addresses(addresses: object, address: object = None) -> tuple[str, ...] | None:
    """A spec node's ``addresses = [...]`` (one ZeroMQ endpoint per replica, instead of ``address``; None when
    absent). Raises ValueError (what is wrong, what was expected) for anything but a list of endpoints, or both."""
    if addresses is None:
        return None
    if not isinstance(addresses, list) or not addresses or not all(isinstance(a, str) and "://" in a for a in
                                                                    addresses):
        raise ValueError(f"field 'addresses' is {addresses!r}; expected a list of ZeroMQ endpoints, one per "
                         "replica, such as ['tcp://10.0.0.5:5555', 'tcp://10.0.0.6:5555']")
    if address is not None:
        raise ValueError("both 'address' and 'addresses'; expected one of them ('addresses' lists every replica's)")
    return tuple(addresses)
