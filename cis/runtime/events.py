"""What a node tells its operator: its named log events (docs/runtime.md, *Logs*).

Each is one record of the ``cis.runtime.node`` logger through :func:`cis.core.logs.event`, with the
node's id as the field ``node``: ``node_start``, ``parent_down``, ``parent_up``,
``overload_start``, ``overload_end``, ``shutdown``, ``node_stop``, and through the executor
``stage_failed`` and ``decide_failed`` come from here (the launcher adds ``node_exit`` and
``node_restart``). Nothing here runs per message: the watches below are fed on state changes
and on the loop's timers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from cis.core.bundle import ID_DIGITS
from cis.core.logs import Every, event
from cis.core.version import __version__
from cis.runtime.node_config import NodeConfig

log = logging.getLogger("cis.runtime.node")

OVERLOAD_QUIET = 5.0  # seconds without an 'overloaded' refusal that end an overload episode
FAILURE_LOG_EVERY = 10.0  # seconds: at most one traceback of a failing stage (or decision) per this long


def started(cfg: NodeConfig, metrics_url: str | None) -> None:
    backend = cfg.backend
    up = f", parent {cfg.parent_id or '?'} at {cfg.parent}" if cfg.parent else " (root)"
    event(
        log,
        logging.INFO,
        "node_start",
        f"node {cfg.name} (exit {cfg.exit}) at {cfg.bind}{up}"
        + (f"; bundle {cfg.bundle_sha256[:ID_DIGITS] or '?'} ({cfg.bundle})" if cfg.bundle else "")
        + (f"; stages on {backend.describe()}" if backend is not None else "")
        + (f"; metrics {metrics_url}" if metrics_url else ""),
        node=cfg.name,
        exit=cfg.exit,
        address=cfg.bind,
        parent=cfg.parent_id,
        parent_address=cfg.parent,
        bundle=cfg.bundle or None,
        bundle_sha256=cfg.bundle_sha256 or None,
        provider=backend.provider if backend is not None else None,
        backend=backend.describe() if backend is not None else None,
        metrics=metrics_url,
        version=__version__,
    )


def shutdown(cfg: NodeConfig, queued: int, in_flight: int) -> None:
    event(
        log,
        logging.INFO,
        "shutdown",
        f"node {cfg.name}: stopping; new requests get 'shutting_down', finishing {queued} queued and "
        f"{in_flight} forwarded samples (at most {cfg.drain_timeout:g} s)",
        node=cfg.name,
        queued=queued,
        in_flight=in_flight,
    )


def stopped(cfg: NodeConfig, counters: Mapping[str, int], uptime: float) -> None:
    c = {k: int(counters.get(k, 0)) for k in ("requests", "served", "forwarded", "errors")}
    event(
        log,
        logging.INFO,
        "node_stop",
        f"node {cfg.name} stopped after {uptime:.1f} s: {c['requests']} requests, {c['served']} samples served "
        f"here, {c['forwarded']} forwarded, {c['errors']} error replies",
        node=cfg.name,
        uptime_s=round(uptime, 3),
        **c,
    )


class ParentWatch:
    """Logs the parent (or one replica of it: ``name`` at ``address``) going down (its connection lost, or no
    pong for ``heartbeat_timeout``; also when it never answered since the start) and coming back. :meth:`check`
    runs on the heartbeat timer, and on a pong while the parent is not known to be up."""

    def __init__(self, cfg: NodeConfig, now: float, name: str | None = None, address: str | None = None) -> None:
        self.cfg, self.since = cfg, now
        self.name, self.address = name or cfg.parent_id, address or cfg.parent
        self.up: bool | None = None  # unknown until the parent answers or its heartbeat timeout passes

    def check(self, up: bool, now: float, connected: bool = True) -> None:
        if up == self.up:
            return
        cfg, fields = self.cfg, {"node": self.cfg.name, "parent": self.name, "address": self.address}
        who = f"parent {self.name or '?'} at {self.address}"
        if up:
            again = f" again after {now - self.since:.1f} s down" if self.up is False else ""
            event(log, logging.INFO, "parent_up", f"node {cfg.name}: {who} answers{again}; forwarding", **fields)
        elif self.up or now - self.since >= cfg.heartbeat_timeout:
            event(
                log,
                logging.WARNING,
                "parent_down",
                f"node {cfg.name}: {who} is down ("
                + (f"no answer to heartbeats for {cfg.heartbeat_timeout:g} s" if connected else "no connection")
                + ("); what the policy would forward is served here, flagged degraded" if len(cfg.parents) < 2
                   else "); its forwards go to the other replicas while one is up"),
                **fields,
            )
        else:
            return  # starting: the parent has a heartbeat timeout to answer
        self.up, self.since = up, now


class OverloadWatch:
    """An overload episode starts at the first ``overloaded`` refusal and ends after OVERLOAD_QUIET seconds
    without one: one line each, so a flood of refusals is two lines (at most one start per OVERLOAD_QUIET s)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.start: float | None = None
        self.last, self.refusals = 0.0, 0

    @property
    def due(self) -> float:
        """When :meth:`check` has work: the end of the quiet period, or never."""
        return math.inf if self.start is None else self.last + OVERLOAD_QUIET

    def refused(self, now: float, queued: int, limit: int) -> None:
        self.last, self.refusals = now, self.refusals + 1
        if self.start is None:
            self.start = now
            event(
                log,
                logging.WARNING,
                "overload_start",
                f"node {self.node_id}: overloaded ({queued} samples queued, limit {limit}); refusing requests "
                "that do not fit with 'overloaded'",
                node=self.node_id,
                queued=queued,
                limit=limit,
            )

    def check(self, now: float) -> None:
        if self.start is None or now < self.due:
            return
        seconds = round(self.last - self.start, 3)
        event(
            log,
            logging.INFO,
            "overload_end",
            f"node {self.node_id}: overload over; {self.refusals} requests refused 'overloaded' in {seconds} s",
            node=self.node_id,
            refused=self.refusals,
            seconds=seconds,
        )
        self.start, self.refusals = None, 0


class FailureLog:
    """A stage (``stage_failed``) or the exit decision (``decide_failed``) raised: an ERROR with the traceback,
    at most one per FAILURE_LOG_EVERY seconds; the next says how many were held back. At DEBUG, each batch
    that failed and is run again request by request (isolation)."""

    def __init__(self, node_id: str) -> None:
        self.node_id, self.every = node_id, Every(FAILURE_LOG_EVERY)

    def isolating(self, requests: int, exc: Exception) -> None:
        log.debug("node %s: a batch of %d requests failed (%s); running each alone", self.node_id, requests, exc)

    def report(self, name: str, what: str, ids: list[int], exc: Exception) -> None:
        held = self.every.due(time.monotonic())
        if held is None:
            return
        event(
            log,
            logging.ERROR,
            name,
            f"node {self.node_id}: {what} failed on request {ids[0] if len(ids) == 1 else ids}, answered 'internal': "
            f"{type(exc).__name__}: {exc}" + (f" ({held} more failures since the last logged)" if held else ""),
            exc_info=exc,
            node=self.node_id,
            requests=ids,
            held_back=held,
        )


MAX_PEERS_LOGGED = 1024  # (peer, bundle) pairs a node remembers having logged; beyond, mismatches are counted only


class MismatchLog:
    """A carry of a bundle the node does not hold (``bundle_mismatch``): a WARNING once per peer and bundle, at
    the node that refused it and at the child whose forward was refused, however many follow (they are counted:
    ``cis_bundle_mismatch_total``)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.seen: set[tuple[str, str, str]] = set()

    def _first(self, key: tuple[str, str, str]) -> bool:
        if key in self.seen or len(self.seen) >= MAX_PEERS_LOGGED:
            return False
        self.seen.add(key)
        return True

    def refused(self, kind: str, peer: str, bundle: str, held: list[str]) -> None:
        """This node refused a request (``kind``) from ``peer`` naming ``bundle``."""
        if self._first(("refused", peer, bundle)):
            event(
                log,
                logging.WARNING,
                "bundle_mismatch",
                f"node {self.node_id}: refused a {kind} from {peer} of bundle {bundle or '(none named)'}; it holds "
                f"{', '.join(held) or '(none named)'}; answered 'bundle_mismatch' (logged once per peer and bundle)",
                node=self.node_id,
                peer=peer,
                bundle=bundle or None,
                held=held,
            )

    def by_parent(self, parent: str, bundle: str, why: str) -> None:
        """The parent refused this node's forward of ``bundle`` (or answered it with another bundle)."""
        if self._first(("parent", parent, bundle)):
            event(
                log,
                logging.WARNING,
                "parent_bundle_mismatch",
                f"node {self.node_id}: parent {parent} did not continue bundle {bundle or '(none named)'} ({why}); "
                "those samples are served here, flagged degraded (logged once per parent and bundle)",
                node=self.node_id,
                parent=parent,
                bundle=bundle or None,
            )
