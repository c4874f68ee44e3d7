"""``cis rollout``: a new bundle on every node of a running tree, without downtime and without mixing bundles.

The order makes sure that no carry ever meets a node without its bundle (docs/runtime.md, *Updating a model*):

1. **check** (nothing changed yet): the new bundle verifies here (every file's sha256; its signature with
   ``--trust``) and fits every node of the spec; every node answers ``status``;
2. **load**, parents first: each node loads the new bundle beside the one it serves (verifying it again
   with its own ``--trust`` key) and keeps serving meanwhile. A failed load anywhere rolls back: the
   nodes that loaded it drop it, every node serves as before;
3. **switch**, parents first: each node sends new client requests to the new bundle, between two
   batches. Every node holds both, so a carry of either bundle finds its bundle at the parent;
4. **drop**, children first: each node drops the old bundle once no request of it is queued or
   forwarded; a parent only after all its children have dropped it (so none sends it any more).

A node that dies meanwhile (``cis serve --all`` restarts it with the bundle on its command line) is
waited for and brought to the phase again; one that does not come back within the timeout rolls the
rollout back, and so does an interrupted one (Ctrl-C; SIGTERM in ``cis rollout``): :class:`Interrupted` then says
what became of the nodes. A load still running when the rollout rolls back (it passed the timeout) is waited
for once more, up to the timeout, and its bundle dropped. With the launcher's log folder,
``LOG_DIR/rollout.json`` names the new bundle once every node serves it, so the launcher restarts nodes with it
from then on (:mod:`cis.runtime.launcher`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from cis.core.bundle import Bundle
from cis.core.errors import CisError
from cis.core.replicas import split_replica_id
from cis.core.spec import CisSpec
from cis.runtime import protocol as P
from cis.runtime.client import Client, ServerError
from cis.runtime.factory import fit
from cis.runtime.launcher import ROLLOUT_FILE
from cis.runtime.security import CurveConfig

log = logging.getLogger(__name__)
POLL = 0.05  # seconds between looks at a node that drains
SLICE = 1.0  # seconds to wait for an answer before looking whether the node was restarted meanwhile
RESTART_SLACK = 1.0  # seconds two statuses' start times may differ and still come from one process


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or the SIGTERM that ``cis rollout`` turns into one) stopped the rollout; ``str()`` is one line that
    says what became of the nodes (rolled back, or what may be left)."""


@dataclass
class Target:
    """One node process to update: its id (a replica's, ``cloud#1``, for a node with replicas), its address, its
    depth (the root is 0)."""

    node: str
    address: str
    depth: int


@dataclass
class Rollout:
    """One rollout of ``bundle`` (verified) to ``targets``; :meth:`run` does it and returns the report. With
    ``spec`` (the one the nodes serve), it first checks that the bundle fits each node (:func:`check_fits`)."""

    bundle: Bundle
    targets: list[Target]
    timeout: float = 120.0  # seconds to wait for a node's answer (a load included) or for it to come back
    curve: CurveConfig | None = None
    log_dir: str | None = None  # the launcher's log folder: rollout.json goes there
    say: Callable[[str], None] = log.info  # progress lines
    spec: CisSpec | None = None  # the spec the nodes serve: the bundle must fit each of its nodes
    previous: dict[str, str] = field(default_factory=dict)  # node -> the bundle it served before
    restarted: set[str] = field(default_factory=set)  # nodes found restarted and brought back to the phase
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase

    @property
    def new(self) -> str:
        return self.bundle.id

    def run(self) -> dict:
        """The rollout; its report. A failure raises :class:`CisError`, Ctrl-C :class:`Interrupted` (each after
        the roll-back, in the load and switch phases), with one line that says what became of the nodes."""
        start = time.monotonic()
        try:
            self._survey()
            if self.spec is not None:  # with each node's --threshold, as the node's own load checks it
                check_fits(self.bundle, self.spec, {t.node: self._overrides[t.node] for t in self.targets})
        except KeyboardInterrupt:
            raise Interrupted("interrupted; nothing was changed") from None
        if all(old == self.new for old in self.previous.values()):
            self.say(f"every node serves bundle {self.new} already")
            return self.report(start, "unchanged")
        top_down = sorted(self.targets, key=lambda t: t.depth)
        try:
            self._phase("load", top_down, self._load, [])
            self._phase("switch", top_down, self._switch, [])
        except CisError as exc:
            self._roll_back(str(exc), CisError)
        except KeyboardInterrupt:
            self._roll_back("interrupted", Interrupted)
        self._record()
        dropped: list[Target] = []
        try:
            self._phase("drop", top_down[::-1], self._drop, dropped)
        except KeyboardInterrupt:
            left = ", ".join(t.node for t in top_down[::-1] if t not in dropped)
            more = f"; {left} may still hold the one it served before: drop it with the 'drop' message" if left else ""
            what = f"interrupted while dropping the old bundles: every node serves bundle {self.new}{more}"
            raise Interrupted(what) from None
        return self.report(start, "done")

    # ------------------------------------------------------------ the phases

    def _phase(self, name: str, order: Sequence[Target], step: Callable[[Target], None], done: list[Target]) -> None:
        t0 = time.monotonic()
        for t in order:
            step(t)
            done.append(t)
        self.phases[name] = round(time.monotonic() - t0, 3)
        self.say(f"{name}: {len(order)} nodes in {self.phases[name]:.2f} s")

    def _load(self, t: Target) -> None:
        if self.new not in self._held(t):
            self._ask(t, P.LOAD, path=str(self.bundle.root))

    def _switch(self, t: Target) -> None:
        st = self._status(t)
        if self.new not in _ids(st):  # restarted with the old bundle on its command line: load it again
            self._ask(t, P.LOAD, path=str(self.bundle.root))
        if st.get("bundle") != self.new:
            self._ask(t, P.SWITCH, bundle=self.new)

    def _drop(self, t: Target) -> None:
        """Drop every bundle but the new one at ``t`` and wait until they are gone (their requests answered)."""
        while True:
            st = self._status(t)
            if st.get("bundle") == self.new:
                break
            self._switch(t)  # restarted meanwhile with the old bundle on its command line: bring it back first
        old = [b for b in _ids(st) if b != self.new]
        self._gone(t, old, f"the new bundle {self.new} serves everywhere; drop it later with the 'drop' message")

    def _gone(self, t: Target, ids: Sequence[str], then: str) -> None:
        """Drop ``ids`` at ``t`` (those not retiring yet) and wait until the node no longer holds them; a load
        of the new bundle still running there (it passed the timeout) is waited for first."""
        end, path, waited = time.monotonic() + self.timeout, str(self.bundle.root), False
        while True:
            st = self._status(t)
            left = [h for h in st["bundles"] if h["id"] in ids]
            loads = self.new in ids and st.get("loading") == path
            if not left and not loads:
                return
            if loads and not waited:
                waited = True
                self.say(f"node {t.node} still loads {path}; waiting up to {self.timeout:g} s to drop it")
            for h in left:
                if h["state"] == "held":
                    self._ask(t, P.DROP, bundle=h["id"])
            if time.monotonic() > end and loads:
                raise CisError(f"node {t.node} still loads {path} after {self.timeout:g} s more: it will hold bundle "
                               f"{self.new} beside its own; drop it then with the 'drop' message")  # fmt: skip
            if time.monotonic() > end:
                names = ", ".join(h["id"] for h in left)
                raise CisError(f"node {t.node}: bundle {names} still in use after {self.timeout:g} s; {then}")
            time.sleep(POLL)

    def _roll_back(self, why: str, error: type[CisError] | type[Interrupted]) -> NoReturn:
        """Every node back to the bundle it served (children first), the new one dropped where it is not served;
        then ``error`` with one line: ``why``, and every node as before, or what is left. A second Ctrl-C stops
        the roll-back: :class:`Interrupted` names the nodes it did not reach."""
        left: list[str] = []
        done: list[Target] = []
        try:
            self.say(f"rolling back: {why}")
            for t in sorted(self.targets, key=lambda t: -t.depth):
                try:
                    self._undo(t)
                except CisError as exc:
                    self.say(f"rollback: {exc}")
                    left.append(str(exc))
                done.append(t)
        except KeyboardInterrupt:
            rest = ", ".join(u.node for u in sorted(self.targets, key=lambda t: -t.depth) if u not in done)
            raise Interrupted(
                f"{why}; interrupted again while rolling back: {rest} may still hold bundle {self.new} (those that "
                "switched serve it): switch them back and drop it with the 'switch' and 'drop' messages"
            ) from None
        if left:
            raise error(f"{why}; rolled back, except: {'; '.join(left)}")
        raise error(f"{why}; rolled back: every node serves the bundle it served before")

    def _undo(self, t: Target) -> None:
        """``t`` back to the bundle it served before the rollout, the new one dropped there."""
        st = self._status(t)
        old = self.previous[t.node]
        if st.get("bundle") == self.new and old in _ids(st):
            self._ask(t, P.SWITCH, bundle=old)
        if old != self.new:
            self._gone(t, [self.new], "it serves the bundle it served before")

    # ------------------------------------------------------------ talking to one node

    def _survey(self) -> None:
        for t in self.targets:
            try:
                st = self._client(t).status(timeout=min(5.0, self.timeout))
            except TimeoutError:
                where = f"node {t.node} at {t.address}"
                raise CisError(f"{where} does not answer (is it up?); nothing was changed") from None
            if "bundles" not in st:
                raise CisError(
                    f"node {t.node} at {t.address} runs a cis without bundle updates (protocol version 1); "
                    "restart it with this version; nothing was changed"
                )
            self.previous[t.node] = st["bundle"]
            self._born[t.node] = _born(st)
            override = st.get("threshold_override")  # the node's --threshold (None from a node before it)
            self._overrides[t.node] = None if override is None else float(override)

    def _status(self, t: Target) -> dict:
        """The node's status; waits (up to the timeout) for a node that restarts, and notes a restart."""
        st = self._ask(t, P.STATUS)
        self._restarted(t, st)
        return st

    def _restarted(self, t: Target, st: dict) -> bool:
        """Whether ``st`` comes from another process than the last status of ``t`` did (it was restarted)."""
        born = _born(st)
        if abs(born - self._born.get(t.node, born)) < RESTART_SLACK:
            return False
        self._born[t.node] = born
        self.restarted.add(t.node)
        self.say(f"node {t.node} restarted (serving {st.get('bundle')}); bringing it to the new bundle")
        return True

    def _held(self, t: Target) -> list[str]:
        return _ids(self._status(t))

    def _ask(self, t: Target, kind: str, **fields) -> dict:
        """Send one message and return the node's status after it. A node that does not answer yet (a load
        takes a while; a node may be dead and restarting) is waited for up to the timeout; a restarted one is
        asked again (the dead process never answers). A refusal raises at once."""
        end, rid = time.monotonic() + self.timeout, None
        while True:
            c = self._client(t)
            try:
                if rid is None:
                    rid = c.send_control(kind, **fields)
                return c.await_status(rid, max(0.05, min(SLICE, end - time.monotonic())), kind)
            except ServerError as exc:  # the node's message names it
                raise CisError(exc.message if t.node in exc.message else f"node {t.node}: {exc.message}") from None
            except TimeoutError:
                if time.monotonic() >= end:
                    raise CisError(
                        f"node {t.node} at {t.address} did not answer {kind} within {self.timeout:g} s"
                    ) from None
                if kind == P.STATUS or self._probe_restarted(t):
                    self._drop_client(t)  # a fresh socket, and the message again
                    rid = None

    def _probe_restarted(self, t: Target) -> bool:
        """While a message waits for its answer: has the node been restarted (so it never will be answered)?"""
        try:
            with Client(t.address, curve=self.curve) as probe:
                return self._restarted(t, probe.status(timeout=SLICE))
        except TimeoutError:
            return False  # down: wait for it to come back

    def _client(self, t: Target) -> Client:
        c = self._clients.get(t.node)
        if c is None:
            c = self._clients[t.node] = Client(t.address, curve=self.curve)
        return c

    def _drop_client(self, t: Target) -> None:
        c = self._clients.pop(t.node, None)
        if c is not None:
            c.close()

    def __post_init__(self) -> None:
        self._clients: dict[str, Client] = {}
        self._born: dict[str, float] = {}  # node -> when its process started (wall clock, from its status)
        self._overrides: dict[str, float | None] = {}  # node -> its --threshold (None: the bundle policy's)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    # ------------------------------------------------------------ results

    def _record(self) -> None:
        """LOG_DIR/rollout.json: the launcher restarts nodes with the new bundle from now on."""
        if self.log_dir:
            path = Path(self.log_dir) / ROLLOUT_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"bundle": str(self.bundle.root), "id": self.new, "time": time.time()}))
            tmp.replace(path)

    def report(self, start: float, outcome: str) -> dict:
        return {
            "bundle": self.new,
            "path": str(self.bundle.root),
            "outcome": outcome,
            "previous": self.previous,
            "nodes": [t.node for t in self.targets],
            "restarted": sorted(self.restarted),
            "phases_s": self.phases,
            "seconds": round(time.monotonic() - start, 3),
        }


def _ids(status: dict) -> list[str]:
    return [h["id"] for h in status.get("bundles", [])]


def _born(status: dict) -> float:
    """When the process that answered ``status`` started (wall clock): now less its uptime."""
    return time.time() - float(status.get("uptime", 0.0))


def check_fits(bundle: Bundle, spec: CisSpec, thresholds: Mapping[str, float | None]) -> None:
    """One line (CisError) if ``bundle`` does not fit a node process of ``spec`` it would be rolled out to.
    ``thresholds``: each process (a replica's id for a node with replicas) and its ``--threshold`` (None: the
    bundle's policy must have one), the rule of the node's own ``load`` (:func:`cis.runtime.factory.fit`)."""
    for name, threshold in thresholds.items():
        try:
            fit(bundle, spec, split_replica_id(name)[0], threshold)
        except CisError as exc:
            raise CisError(f"{bundle.root} does not fit spec {spec.name!r}: {exc}; nothing was changed") from None


def spec_addresses(spec: CisSpec) -> dict[str, str]:
    """{process id: address} of every node process the spec gives an address: each replica of a node with
    replicas (``cloud#0``, ``cloud#1``: :mod:`cis.core.replicas`), the node id alone otherwise."""
    return {rid: a for n in spec.nodes for rid, a in zip(n.replica_ids, n.replica_addresses or ())}


def targets_of(spec: CisSpec, addresses: dict[str, str]) -> list[Target]:
    """Every node process of ``spec`` (each replica of a node with replicas) at its address (``addresses``, by
    process id: :func:`spec_addresses`, or a launcher's cluster.json)."""
    out = []
    for n in spec.nodes:
        for rid in n.replica_ids:
            address = addresses.get(rid)
            if address is None:
                raise CisError(f"node {rid!r} has no address; give the spec's addresses or --cluster LOG_DIR")
            out.append(Target(rid, address, spec.depth(n.id)))
    return out
