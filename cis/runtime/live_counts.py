"""The live sources of :mod:`cis.runtime.measure`: each node's ``status`` reply (ZeroMQ) or its ``/metrics`` (HTTP).

A snapshot asks every node once; a measurement is one snapshot (the counters since the nodes
started) or the difference of two taken ``window`` seconds apart. Nothing here changes a node:
it reads what ``cis status`` and Prometheus read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from cis.core.errors import CisError
from cis.core.measurement import Measurement, Tree, from_counts
from cis.core.spec import CisSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """One node's counters at one moment."""

    node: str
    exit: int
    address: str | None  # where it binds (status); None from /metrics
    parent: str | None  # how the node names its parent: an address, or a node id; None at the root
    served_per_exit: dict[int, int]
    forwarded: int  # net of forwards the parent did not answer in time (those are served here)
    restarts: int
    uptime: float | None  # seconds since the node started; None from /metrics
    addresses: tuple[str, ...] = ()  # where its replicas bind (status), the first being ``address``

    def __post_init__(self) -> None:
        if not self.addresses and self.address:
            object.__setattr__(self, "addresses", (self.address,))


Read = Callable[[], dict[str, Reading]]


def status_reader(targets: Mapping[str, str], timeout: float) -> Read:
    """Ask each address for its status (``cis status``'s question)."""

    def read() -> dict[str, Reading]:
        from cis.runtime.client import Client

        out: dict[str, Reading] = {}
        for key, addr in targets.items():
            with Client(addr) as c:
                try:
                    st = c.status(timeout)
                except TimeoutError:
                    raise CisError(
                        f"{key} at {addr}: no status reply within {timeout:g} s; expected a live node"
                    ) from None
            node = str(st["node"])
            _add(out, Reading(node, int(st["exit"]), st.get("address"), st.get("parent"),
                              {int(st["exit"]): int(st["served"])}, int(st["forwarded"]), int(st.get("restarts", 0)),
                              float(st["uptime"])))
        return out

    return read


def metrics_reader(urls: Sequence[str], timeout: float) -> Read:
    """Scrape each node's /metrics: cis_samples_total{exit}, cis_forwarded_total - cis_forward_failed_total,
    the node's id and exit from cis_node_info, its parent's id from cis_build_info (else cis_node_info's address)."""

    def read() -> dict[str, Reading]:
        out: dict[str, Reading] = {}
        for url in urls:
            _add(out, _parse_metrics(_scrape(url, timeout), url))
        return out

    return read


def _add(readings: dict[str, Reading], r: Reading) -> None:
    """One more reading of ``r.node``: the replicas of a node (docs/runtime.md, *Replicas*) add up, its restarts
    too; the node's uptime is its longest-running replica's."""
    before = readings.get(r.node)
    if before is None:
        readings[r.node] = r
        return
    served = dict(before.served_per_exit)
    for e, k in r.served_per_exit.items():
        served[e] = served.get(e, 0) + k
    uptime = None if r.uptime is None or before.uptime is None else max(r.uptime, before.uptime)
    readings[r.node] = replace(before, served_per_exit=served, forwarded=before.forwarded + r.forwarded,
                               restarts=before.restarts + r.restarts, uptime=uptime,
                               addresses=before.addresses + r.addresses)


def _scrape(url: str, timeout: float) -> str:
    from urllib.error import URLError
    from urllib.request import urlopen

    try:
        with urlopen(url, timeout=timeout) as reply:  # noqa: S310 (an operator's own URL)
            return reply.read().decode()
    except (URLError, OSError, ValueError) as exc:
        raise CisError(f"{url}: cannot read /metrics ({exc}); expected a node run with --metrics-port") from None


def _parse_metrics(text: str, url: str) -> Reading:
    from prometheus_client.parser import text_string_to_metric_families

    per_exit: dict[int, int] = {}
    forwarded = failed = restarts = 0
    info: dict[str, str] | None = None
    parent_id: str | None = None
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "cis_samples_total":
                    per_exit[int(s.labels["exit"])] = int(s.value)
                elif s.name == "cis_forwarded_total":
                    forwarded = int(s.value)
                elif s.name == "cis_forward_failed_total":
                    failed = int(s.value)
                elif s.name in ("cis_restarts", "cis_restarts_total"):
                    restarts = int(s.value)
                elif s.name == "cis_node_info":
                    info = dict(s.labels)
                elif s.name == "cis_build_info" and "parent" in s.labels:
                    parent_id = s.labels["parent"]
    except (ValueError, KeyError) as exc:
        raise CisError(f"{url}: not Prometheus text of a cis node ({exc})") from None
    if info is None:
        raise CisError(f"{url}: no cis_node_info metric; expected the /metrics of a cis node that serves")
    exit_ = int(info["exit"])
    per_exit.setdefault(exit_, 0)
    parent = parent_id if parent_id is not None else info.get("parent")
    return Reading(info["node"], exit_, None, parent or None, per_exit, forwarded - failed, restarts, None)


# ---------------------------------------------------------------- measuring


def measure_status(
    source: str, targets: Mapping[str, str], tree: Tree, window: float | None, timeout: float
) -> Measurement:
    """The live tree ``tree`` whose nodes answer at ``targets``, through their status."""
    return _measure(source, "status", status_reader(targets, timeout), tree, window)


def measure_addresses(
    addresses: list[str], spec: CisSpec | None, window: float | None, timeout: float
) -> Measurement:
    """``cis rates --connect``: ZeroMQ addresses (status) or http(s) /metrics URLs; the tree from ``spec``,
    else from what the nodes say about their parents."""
    urls = [a for a in addresses if a.startswith(("http://", "https://"))]
    if urls and len(urls) != len(addresses):
        raise CisError("--connect: give ZeroMQ addresses (status) or /metrics URLs, not both")
    tree = {n.id: (n.exit, n.parent) for n in spec.nodes} if spec is not None else None
    source = addresses[0] + (f" and {len(addresses) - 1} more" if len(addresses) > 1 else "")
    if urls:
        if window is None:
            raise CisError("--connect URL: /metrics counters carry no start time; pass --window SECONDS")
        return _measure(source, "metrics", metrics_reader(urls, timeout), tree, window)
    return _measure(source, "status", status_reader({a: a for a in addresses}, timeout), tree, window)


def _measure(source: str, kind: str, read: Read, tree: Tree | None, window: float | None) -> Measurement:
    t0 = time.monotonic()
    first = read()
    if window is None:
        last, seconds = first, max(r.uptime or 0.0 for r in first.values())
        how = "counters since the nodes started, over the longest uptime"
    else:
        log.info("measuring %s: first snapshot of %d nodes taken; the second in %g s", source, len(first), window)
        time.sleep(max(0.0, t0 + window - time.monotonic()))
        t1 = time.monotonic()
        last, seconds = read(), t1 - t0
        how = f"two snapshots {seconds:.3f} s apart"
        for node, r in last.items():
            before = first.get(node)
            if before is None:
                raise CisError(f"{source}: node {node!r} answered only the second snapshot; measure again")
            if r.restarts != before.restarts or (r.uptime is not None and r.uptime < (before.uptime or 0.0)):
                raise CisError(f"{source}: node {node!r} restarted during the window; its counters started over, "
                               "measure again")
    tree = tree if tree is not None else _tree(last, source)
    absent = [i for i in tree if i not in last]
    if absent:
        raise CisError(f"{source}: node {absent[0]!r} of the tree did not answer; expected every node to be asked")
    served, forwarded = {}, {}
    for i in tree:
        r, before = last[i], (first[i] if window is not None else None)
        served[i] = {e: k - (before.served_per_exit.get(e, 0) if before else 0) for e, k in r.served_per_exit.items()}
        forwarded[i] = r.forwarded - (before.forwarded if before else 0)
    num_exits = max(max(e for e, _ in tree.values()), max(max(p) for p in served.values()))
    return from_counts(source, kind, how, seconds, tree, num_exits, served, forwarded)


def _tree(readings: dict[str, Reading], source: str) -> Tree:
    """The tree from the nodes' own words: each names its parent by address (status) or by id."""
    by_address = {a: r.node for r in readings.values() for a in r.addresses}
    tree: Tree = {}
    for node, r in readings.items():  # a parent with replicas is named by their addresses, separated by commas
        parent = r.parent if r.parent is None or r.parent in readings else by_address.get(r.parent.split(",")[0])
        if r.parent is not None and parent is None:
            raise CisError(f"{source}: node {node!r} forwards to {r.parent}, which is not among the nodes asked; "
                           "ask every node of the tree, or pass the spec")
        tree[node] = (r.exit, parent)
    return tree
