"""How a node answers the requests of a micro-batch: from its own exit, by forwarding to its parent, or both.

:class:`Answers` is the half of :class:`cis.runtime.executor.Executor` that completes requests: it
answers the samples served here, sends the others up as one FORWARD (through the
:class:`cis.runtime.requests.Outbox`), fills them with the parent's answer when it comes (only an
answer of the bundle the forward named: see docs/protocol.md, *Bundle identity*), and otherwise
serves them from this node's exit, flagged degraded. A request is answered once, when every one
of its samples has its answer.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cis.runtime import protocol as P
from cis.runtime import tracing
from cis.runtime.events import MismatchLog
from cis.runtime.node_config import NodeConfig
from cis.runtime.requests import Outbox, Pending, Request, parent_logits, rows_of, split


class Answers:
    """Answering a batch's requests (a base of :class:`cis.runtime.executor.Executor`, which sets these)."""

    cfg: NodeConfig
    out: Outbox
    counters: collections.Counter
    tracer: tracing.Tracer | None
    mismatches: MismatchLog

    def _fail(self, req: Request, code: str, message: str) -> None:
        req.answered = True
        req.version.active -= 1
        self.out.error(req, code, message)

    def _answer_all(self, order: list[Request], cls, conf, exit_at, flags, lg) -> None:
        nid, start = self.cfg.node_id, 0
        if len(order) == 1:
            return self._fill(order[0], None, cls, conf, exit_at, flags, nid, lg)
        for req in order:
            end = start + req.n
            if not req.answered:
                rows = None if lg is None else lg[start:end]
                self._fill(req, None, cls[start:end], conf[start:end], exit_at[start:end], flags[start:end], nid, rows)
            start = end

    def _forward_and_answer(self, order: list[Request], serve, cls, conf, exit_at, flags, carry, lg) -> None:
        """Forward the samples not served here (one FORWARD for the batch; ``serve`` None: all of them);
        answer the others. ``lg``: the answering exit's logits, when a request of the batch wants them."""
        version = order[0].version
        here: list[tuple[Request, int, np.ndarray | None]] = []
        if serve is None:
            parts: list[tuple[Request, np.ndarray | None]] = [(req, None) for req in order]
            pending = Pending(parts, cls, conf, lg, version)
        else:
            parts, here = split(order, serve)
            fwd = np.flatnonzero(~serve)
            wants = lg is not None and any(req.want_logits for req, _ in parts)
            pending = Pending(parts, cls[fwd], conf[fwd], lg[fwd] if wants else None, version)
            carry = {k: v[fwd] for k, v in carry.items()}
        if self.out.forward(pending, carry):
            self.counters["forwarded"] += pending.n
        else:
            if self.tracer is not None:  # it never left: no forward span
                tracing.unsent(pending.parts)
            self.counters["degraded"] += pending.n
            self.counters["served"] += pending.n
            self.fallback(pending, count=False)
        if not here:
            return
        nid = self.cfg.node_id
        for req, s, idx in here:
            if req.answered:
                continue
            if idx is None:
                e = s + req.n
                self._fill(req, None, cls[s:e], conf[s:e], exit_at[s:e], flags[s:e], nid, rows_of(lg, slice(s, e)))
            else:
                src = idx + s
                self._fill(req, idx, cls[src], conf[src], exit_at[src], flags[src], nid, rows_of(lg, src))

    def _fill(
        self, req: Request, idx: np.ndarray | None, cls, conf, ex, flags, served_by: str | Sequence[str], lg=None
    ) -> None:
        """Answer samples ``idx`` of ``req`` (:meth:`Request.fill`); reply once the request is complete."""
        if req.fill(idx, cls, conf, ex, flags, served_by, lg):
            req.answered = True
            req.version.active -= 1
            self.out.reply(req)

    def from_parent(self, pending: Pending, msg: P.Message) -> None:
        """The parent's reply to a forward: a result of its samples by the forward's bundle (with the parent's
        logits when they were asked for) fills them; anything else (an error, another bundle's result) serves
        them here (:meth:`fallback`)."""
        h = msg.head
        if not isinstance(h, P.ResultHeader) or len(h.served_by) != pending.n or h.bundle != pending.version.id:
            self._refused(pending, h)
            return self.fallback(pending)
        lg = None if pending.logits is None else parent_logits(msg.tensors, pending.logits.shape)
        whole = len(pending.parts) == 1 and pending.parts[0][1] is None
        if whole and (h.names == P.RESULT_NAMES or h.names[:4] == P.RESULT_NAMES):  # the four first, in order
            f = msg.frames  # one whole request: the parent's answer goes on as it is
            return self.scatter(pending, f[0], f[1], f[2], f[3], h.served_by, lg)
        t = msg.tensors
        self.scatter(pending, t["class"], t["confidence"], t["exit"], t["flags"], h.served_by, lg)

    def _refused(self, pending: Pending, h: P.Header) -> None:
        """Count and log (once per parent and bundle) a parent that refused the forward's bundle or answered it
        with another bundle."""
        bid = pending.version.id
        if isinstance(h, P.ResultHeader) and h.bundle != bid:
            why = f"it answered with bundle {h.bundle or '(none named)'}"
        elif isinstance(h, P.ErrorHeader) and h.code == "bundle_mismatch":
            why = h.message
        else:
            return
        self.counters["bundle_mismatch_parent"] += 1
        self.mismatches.by_parent(self.cfg.parent_id or self.cfg.parent or "?", bid, why)

    def scatter(self, pending: Pending, cls, conf, ex, flags, served_by: Sequence[Any], logits=None) -> None:
        """Fill the forwarded samples with the parent's answer (or this node's own); reply to complete requests.

        With one part the answer is passed as it is (it may be the parent's frames: see :meth:`from_parent`)."""
        if self.tracer is not None:
            tracing.returned(pending.parts, time.monotonic())
        if len(pending.parts) == 1:
            req, idx = pending.parts[0]
            if not req.answered:
                self._fill(req, idx, cls, conf, ex, flags, served_by, logits)
            return
        off = 0
        for req, idx in pending.parts:
            m = req.n if idx is None else len(idx)
            if not req.answered:
                end = off + m
                part = rows_of(logits, slice(off, end))
                self._fill(req, idx, cls[off:end], conf[off:end], ex[off:end], flags[off:end], served_by[off:end], part)
            off += m

    def fallback(self, pending: Pending, count: bool = True) -> None:
        """The parent did not answer (in time): serve these samples from this node's exit, degraded."""
        if count:
            self.counters["degraded"] += pending.n
            self.counters["served"] += pending.n
            self.counters["forwarded"] -= pending.n
            self.counters["forward_failed"] += pending.n
        n = pending.n
        self.scatter(
            pending,
            pending.cls,
            pending.conf.astype(np.float32, copy=False),
            np.full(n, self.cfg.exit, np.int32),
            np.full(n, P.FLAG_DEGRADED, np.uint8),
            [self.cfg.node_id] * n,
            pending.logits,
        )
