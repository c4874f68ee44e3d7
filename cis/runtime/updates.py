"""Updating a node's model without downtime: the update kinds, SIGHUP, and retiring old bundles.

A node answers ``load``, ``switch``, ``drop`` and ``reload`` (docs/protocol.md, *Updating a model*):

- ``load PATH`` loads the bundle in a thread beside those the node holds, verifying it first (its
  signature when the node runs with ``--trust``, then every file's sha256) and checking that it fits
  the node (its exit, its threshold, the same stage-1 input as the bundle it serves); the node keeps
  serving meanwhile and answers when the load is done. A failed load changes nothing;
- ``switch ID`` makes a held bundle the one new client requests go to: between two batches (the node
  has one loop), so every request runs and is answered by the bundle it was admitted with;
- ``drop ID`` retires a held bundle: it is dropped once no request of it is queued or forwarded;
- ``reload [PATH]`` (and SIGHUP, for the node's own folder) loads, switches, and retires the others
  once unused and not named by a request for ``NodeConfig.retire_after`` seconds (while children still
  send their carries, a parent keeps their bundle).

``cis rollout`` (:mod:`cis.runtime.rollout`) orders these over a whole tree.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cis.core.errors import CisError
from cis.core.logs import event
from cis.core.records import json_float
from cis.core.stages.contract import LOGITS
from cis.runtime import protocol as P
from cis.runtime.events import log
from cis.runtime.versions import Version

POLL_LOADING = 0.02  # seconds between looks at a load in progress (the loop keeps serving meanwhile)
POLL_RETIRING = 0.1  # seconds between looks at the bundles waiting to be dropped


class Updates:
    """The bundle updates of one node (``node.updates``); ``loader`` (set by :mod:`cis.runtime.factory`)
    turns a bundle folder into a :class:`Version` of this node, or raises saying why it cannot."""

    def __init__(self, node: Any) -> None:
        self.node = node  # the cis.runtime.node.Node (which imports this module)
        self.loader: Callable[[str], Version] | None = None
        self.threshold: float | None = None  # the node's --threshold, which the loader gives every bundle (status)
        self.thread: threading.Thread | None = None  # the load in progress
        self.loading: tuple[str, bool, Sequence[Any], int, int] | None = None  # path, reload, asker, id, version
        self.loaded: Version | BaseException | None = None  # what the thread left
        self.hup = False  # SIGHUP came: reload the node's own folder
        self.due = math.inf  # when tick has work

    # ------------------------------------------------------------ messages

    def handle(self, prefix: Sequence[Any], msg: P.Message) -> None:
        """A load, switch, drop or reload message: answered with a status_reply once done, or an error."""
        h, node = msg.head, self.node
        versions = node.executor.versions
        if msg.kind in (P.LOAD, P.RELOAD):
            return self.start(h.path or node.cfg.bundle, msg.kind == P.RELOAD, prefix, msg.id, h.v)
        if h.bundle not in versions.held:
            held = ", ".join(versions.ids)
            return self.refuse(prefix, msg, "bundle_mismatch", f"node {node.cfg.name} holds {held}, not {h.bundle}")
        if msg.kind == P.SWITCH:
            self.switch(h.bundle)
        elif h.bundle == versions.current.id:
            return self.refuse(
                prefix, msg, "bad_bundle", f"bundle {h.bundle} is the one node {node.cfg.name} serves; switch first"
            )
        else:
            versions.retire(h.bundle)
            self.soon(time.monotonic())
        self.answer(prefix, msg.id, h.v)

    def soon(self, when: float) -> None:
        """Have the node's loop call :meth:`tick` at ``when`` at the latest."""
        self.due = min(self.due, when)
        self.node.next_timer = min(self.node.next_timer, when)

    def refuse(self, prefix: Sequence[Any], msg: P.Message, code: str, text: str) -> None:
        self.node.refuse(prefix, msg.id, code, text, msg.kind, msg.head.v)

    def answer(self, prefix: Sequence[Any], rid: int, v: int) -> None:
        node = self.node
        node._send(node.front, P.encode(P.STATUS_REPLY, rid, v=v, status=node.status()), prefix)

    def start(self, path: str, reload: bool, prefix: Sequence[Any] = (), rid: int = 0, v: int = P.VERSION) -> None:
        """Load ``path`` in a thread (``reload``: then switch to it and retire the others); ``prefix``: who asked."""
        nid = self.node.cfg.name
        if self.loader is None or not path:
            text = f"node {nid} was started without a bundle folder: it cannot load one"
            return self._fail_early(prefix, rid, v, "bad_bundle", text, path or None)
        if self.loading is not None:
            text = f"node {nid} is loading {self.loading[0]}; ask again once that load is answered"
            return self._fail_early(prefix, rid, v, "busy", text, path)
        self.loading, self.loaded = (path, reload, prefix, rid, v), None
        self.thread = threading.Thread(target=self._load, args=(path,), name="cis-load", daemon=True)
        self.thread.start()
        self.soon(time.monotonic() + POLL_LOADING)

    def _fail_early(self, prefix: Sequence[Any], rid: int, v: int, code: str, text: str, path: str | None) -> None:
        if prefix:
            self.node.refuse(prefix, rid, code, text, "other", v)
        else:  # SIGHUP: nobody to answer
            event(log, logging.WARNING, "bundle_load_failed", text, node=self.node.cfg.name, path=path, why=text)

    def _load(self, path: str) -> None:
        """The loader thread: the node's loop picks its result up in :meth:`tick`."""
        try:
            assert self.loader is not None
            self.loaded = self.loader(path)
        except BaseException as exc:  # anything: reported to the asker, the node keeps serving
            self.loaded = exc

    # ------------------------------------------------------------ the loop's timer

    def tick(self, now: float) -> float:
        """What is due: a SIGHUP, a finished load, bundles to drop. Returns when to look again."""
        if self.hup:
            self.hup = False
            self.start(self.node.cfg.bundle, True)
        if self.loading is not None and self.thread is not None and not self.thread.is_alive():
            self._finish()
        versions = self.node.executor.versions
        for v in versions.sweep(now):
            nid = self.node.cfg.name
            event(log, logging.INFO, "bundle_dropped", f"node {nid}: dropped bundle {v.id} ({v.path})", node=nid,
                  bundle=v.id, path=v.path)  # fmt: skip
        self.due = math.inf if self.loading is None else now + POLL_LOADING
        if versions.retiring:
            self.due = min(self.due, now + POLL_RETIRING)
        return self.due

    def _finish(self) -> None:
        assert self.loading is not None
        path, reload, prefix, rid, v = self.loading
        got, self.loading, self.thread, self.loaded = self.loaded, None, None, None
        node = self.node
        nid = node.cfg.name
        problem = self._problem(got)
        if problem is not None:
            event(log, logging.WARNING, "bundle_load_failed", f"node {nid}: cannot load {path}: {problem}; "
                  "it serves as before", node=nid, path=path, why=problem)  # fmt: skip
            if prefix:  # logged once, above; the asker gets the same line
                node.refuse(prefix, rid, "bad_bundle", f"node {nid}: cannot load {path}: {problem}", "other", v)
            return None
        assert isinstance(got, Version)
        versions = node.executor.versions
        held = got.id in versions.held
        version = versions.add(got)
        event(log, logging.INFO, "bundle_loaded", f"node {nid}: " + _loaded(got, versions.current.id, held,
              [b for b in versions.ids if b != got.id]), node=nid, bundle=got.id, path=got.path)  # fmt: skip
        if reload and version is not versions.current:
            old = [b for b in versions.ids if b != version.id]
            self.switch(version.id)
            for b in old:
                versions.retire(b, node.cfg.retire_after, time.monotonic())
        if prefix:
            self.answer(prefix, rid, v)

    def _problem(self, got: Version | BaseException | None) -> str | None:
        """Why a loaded version cannot be held (None: it can): the loader's error, or a stage-1 input other than
        the serving bundle's (clients would be refused)."""
        if isinstance(got, CisError):
            return str(got)
        if isinstance(got, BaseException) or got is None:
            return f"{type(got).__name__}: {got}"
        new, old = got.stages[1].inputs, self.node.executor.versions.current.stages[1].inputs
        if [_tensor(t) for t in new] != [_tensor(t) for t in old]:
            return (
                f"its stage 1 takes {', '.join(_tensor(t) for t in new)}; the bundle it serves takes "
                f"{', '.join(_tensor(t) for t in old)}: clients would be refused"
            )
        width, serving = _classes(got), _classes(self.node.executor.versions.current)
        if width != serving:  # the door's metadata and every client's reading of the logits assume the classes
            return f"its logits have {width} classes; the bundle it serves has {serving}: clients would misread them"
        return None

    def switch(self, bundle_id: str) -> None:
        node = self.node
        old = node.executor.versions.current
        version = node.executor.versions.switch(bundle_id)
        if version is not old:
            node.executor.adapt_to(version)
            node.cfg.bundle, node.cfg.bundle_sha256 = version.path, version.sha256  # what it serves (build info)
            nid = node.cfg.name
            event(log, logging.INFO, "bundle_switched", f"node {nid}: new requests go to bundle {version.id} "
                  f"(was {old.id})", node=nid, bundle=version.id, previous=old.id)  # fmt: skip

    # ------------------------------------------------------------ SIGHUP, status

    def install_signal(self) -> None:
        """SIGHUP reloads the node's own bundle folder (a new bundle copied there, or a symlink moved)."""
        signal.signal(signal.SIGHUP, self._on_hup)

    def _on_hup(self, *_: Any) -> None:
        self.hup = True
        self.soon(0.0)  # the loop's timers run at its next turn

    def status(self) -> dict:
        """``status`` keys: the bundle new requests go to, every held one, the node's ``--threshold`` (which a
        bundle loaded needs no threshold of its own for), the mismatches counted."""
        ex = self.node.executor
        return {
            "bundle": ex.versions.current.id,
            "bundles": ex.versions.describe(),
            "loading": None if self.loading is None else self.loading[0],
            "threshold_override": None if self.threshold is None else json_float(self.threshold),
            "bundle_mismatch": {
                "refused": ex.counters["bundle_mismatch"],
                "parent": ex.counters["bundle_mismatch_parent"],
            },
        }


def _loaded(got: Version, current: str, held: bool, others: list[str]) -> str:
    """What a finished load did: a new bundle held beside the others, or one the node held already (a SIGHUP or
    reload of an unchanged folder: nothing changed), which it keeps (no longer retiring)."""
    if not held:
        return f"loaded bundle {got.id} ({got.path}) beside {', '.join(others)}"
    if got.id == current:
        return f"{got.path} is bundle {got.id}, the one it serves; nothing changed"
    return f"{got.path} is bundle {got.id}, which it holds already beside {current} (the one it serves); it stays held"


def _classes(version: Version) -> Any:
    """The width of a version's logits (every exit has the model's classes; None where no stage says)."""
    widths = [t.shape[-1] for s in version.stages.values() for t in s.outputs if t.name == LOGITS and t.shape]
    return widths[0] if widths else None


def _tensor(t: Any) -> str:
    return f"{t.name} {t.dtype} {list(t.shape)}"
