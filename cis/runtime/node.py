"""One node of the CIS: a ROUTER for clients and children, a DEALER to the parent, one poll loop.

The story of one request at a node:

1. its frames arrive on the ROUTER (from a client at stage 1, or from a child with the carry of the samples
   the child did not serve, at the stage after the child's exit). ZeroMQ holds at most ``rcv_hwm`` messages
   per peer before the node reads them (beyond, TCP pushes back on the sender) and drops the connection of a
   peer that sends a frame over ``max_message_bytes``. The node reads every waiting message before it runs a
   batch, frame by frame with a running total (:func:`cis.runtime.protocol.recv`), so what is really waiting
   is in its own queue, where ``status`` can see it;
2. :func:`cis.runtime.protocol.decode` checks every header field and tensor
   frame; a bad message is answered at once with an error that echoes its id
   whenever the id could be read;
3. the executor (:class:`cis.runtime.executor.Executor`) checks it against the
   entry stage, the queue limit (``too_many_samples`` if it could never fit),
   its deadline, the room left in the bounded queue (full: an immediate
   ``overloaded``) and finite values (``bad_input``); a request that fails any
   check never enters a batch;
4. it waits in the queue and is run together with what else waits
   (micro-batching: up to ``max_batch`` samples, after at most ``max_wait``
   seconds; stage by stage, so requests that enter at different stages share the
   later stages). If its deadline passed meanwhile it is answered
   ``deadline_exceeded`` without running. If a stage raises on the batch, each
   request is run again alone, so only a request that fails alone gets ``internal``;
5. at the node's own exit the one exit policy (:class:`cis.core.policy.exit_policy.ExitPolicy`)
   decides per sample (with FLAME's patience measure: after *every* stage the
   node runs; a sample is served at the first exit whose count reaches p, and
   the state (label, count) of the others goes to the parent as two more carry
   tensors, ``patience_label`` and ``patience_count``, int64 (N,)): confident
   samples are answered here; the others are forwarded to the parent as one
   FORWARD message, as long as the transfer cap (:class:`cis.core.policy.transfer_cap.TokenBucket`)
   has tokens and the parent is up; what the cap refuses is served here (flag
   ``capped``), what cannot reach the parent is served here (flag ``degraded``);
6. when every sample of the request has a result (from here or from the parent's
   reply, or from this node's own exit when the parent did not answer in time),
   exactly one RESULT goes back to whoever asked; the time since step 1 is the
   latency ``status`` reports.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from cis.core.records import LatencyWindow
from cis.runtime import events, tracing
from cis.runtime import protocol as P
from cis.runtime.executor import Executor
from cis.runtime.front_socket import bind_front
from cis.runtime.node_config import NodeConfig
from cis.runtime.oip.door import Door, Ticket, open_doors
from cis.runtime.requests import BundleStage, Pending, Request, Stage, forward_route
from cis.runtime.security import start_authenticator
from cis.runtime.seen import Seen
from cis.runtime.updates import Updates
from cis.runtime.upstream import Upstream

__all__ = ["BundleStage", "Node", "NodeConfig", "Stage"]

_NOBLOCK = int(zmq.NOBLOCK)
_OK = (("infer", "ok"), ("forward", "ok"))  # (kind, outcome) of a result, by Request.forward
_poll = zmq.zmq_poll  # (socket, POLLIN) pairs -> the ready ones; zmq.Poller adds a Python layer
_NONE: dict = {}  # no more header fields
_WANT_LOGITS = {"want_logits": True}
_COUNTERS = ("requests", "samples", "served", "forwarded", "degraded", "capped", "nonfinite", "errors", "overloaded",
             "expired", "isolated", "undeliverable", "batches", "duplicates")  # fmt: skip  (status, in this order)


class Node:
    def __init__(self, config: NodeConfig, stages: Mapping[int, Stage]):
        self.cfg = config
        self.counters: collections.Counter = collections.Counter()
        self.errors_by_code: collections.Counter = collections.Counter()
        self.outcomes: collections.Counter = collections.Counter()  # (kind, "ok" or the error code) -> replies
        self.executor = Executor(config, stages, self, self.counters)
        self.pending: dict[int, Pending] = {}
        self.up_ids = itertools.count(1)  # ids of forwards and pings: one counter, so a reply names one of them
        self.upstream = Upstream(config, time.monotonic())  # the DEALER to each replica of the parent
        self.seen = Seen()  # (peer, id) held or answered lately: a client's retry is answered once
        self.next_ping = 0.0
        self.next_timer = 0.0  # when _timers has work: the next heartbeat or the first forward to give up on
        self.stopping = False
        self.latency = LatencyWindow()
        self.started = time.time()
        self.seen_empty = time.monotonic()  # when the node last found its ROUTER empty
        self.front: zmq.Socket | None = None
        self.poll_items: list[tuple[Any, int]] = []  # (a socket or a door's descriptor, events)
        self.busy = True  # something may have arrived since the ROUTER was last found empty
        self.status_asked: list[tuple[list[bytes], int, int]] = []  # answered at the end of the drain
        self.observe_latency: Callable[[float], None] | None = None  # each result's latency (metrics_http)
        self.metrics_url: str | None = None  # set by the metrics server that reports this node (logged at start)
        self.alive_at = time.monotonic()  # when the loop last turned (/livez)
        self.overload = events.OverloadWatch(config.name)
        self.doors: list[Door] = []  # front doors (HTTP, gRPC: cis.runtime.oip.door), opened with the sockets
        self.door_fds: dict[int, Door] = {}
        self.door_due = math.inf  # when the doors' timers are due
        self.updates = Updates(self)  # the bundles it holds: load, switch, drop, reload (cis.runtime.updates)

    @property
    def stages(self) -> dict[int, Stage]:
        return self.executor.stages

    @property
    def policy(self):
        return self.executor.policy

    @property
    def versions(self) -> list[str]:
        """The ids of the bundles the node holds, the newest last (docs/runtime.md, *Updating a model*)."""
        return self.executor.versions.ids

    # ------------------------------------------------------------ status

    @property
    def parent_up(self) -> bool:
        """Whether a replica of the parent (or the parent) is up: forwards have somewhere to go."""
        return self.upstream.any_up(time.monotonic())

    def status(self) -> dict:
        return {
            "node": self.cfg.node_id,
            "replica": self.cfg.name,
            "exit": self.cfg.exit,
            "address": self.cfg.bind,
            "parent": self.cfg.parent,
            "parent_up": self.parent_up,
            "parents": self.upstream.status(time.monotonic()),
            **{key: self.counters[key] for key in _COUNTERS},
            "errors_by_code": dict(self.errors_by_code),
            **self.executor.status(),  # threshold, queue, transfer cap, adapt
            "in_flight_forwarded": sum(p.n for p in self.pending.values()),
            "latency": self.latency.summary(),
            "restarts": self.cfg.restarts,
            "uptime": time.time() - self.started,
            "pid": os.getpid(),
            "stopping": self.stopping,
            **self.updates.status(),
        }

    # ------------------------------------------------------------ loop

    def request_stop(self, *_: Any) -> None:
        self.stopping = True

    def run(
        self,
        ctx: zmq.Context | None = None,
        install_signals: bool = True,
        ready: Callable[[], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop()`` returns True), then drain and return."""
        own_ctx = ctx is None
        ctx = ctx or zmq.Context()
        allow = self.cfg.curve.allow_dir
        auth = start_authenticator(ctx, allow, self.cfg.curve.secret_file) if allow else None
        if install_signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
            self.updates.install_signal()
        self.open(ctx)
        if ready:
            ready()
        events.started(self.cfg, self.metrics_url)
        drain_until = None
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite values are checked
                while True:
                    if stop is not None and stop():
                        self.stopping = True
                    if self.stopping:
                        if drain_until is None:
                            drain_until = time.monotonic() + self.cfg.drain_timeout
                            self.door_due = 0.0 if self.doors else math.inf  # doors tick at once: NOT_SERVING
                            events.shutdown(self.cfg, self.executor.queued, sum(p.n for p in self.pending.values()))
                        if not self.pending and (not self.executor.queue or time.monotonic() > drain_until):
                            self._read(_poll(self.poll_items, 0))  # what waits unread: 'shutting_down', not silence
                            self.executor.refuse_queued(f"node {self.cfg.node_id} stopped: its drain_timeout passed")
                            break
                    self.step()
        finally:
            self.close()
            if auth is not None:
                auth.stop()
            if own_ctx:
                ctx.term()
            events.stopped(self.cfg, self.counters, time.time() - self.started)

    def open(self, ctx: zmq.Context) -> None:
        """Open the tracer (when the node traces), bind the ROUTER, connect the DEALER to the parent."""
        cfg, ex = self.cfg, self.executor
        if ex.tracer is None:
            ex.tracer = tracing.open_tracer(cfg.node_id, cfg.exit, cfg.spans_file, cfg.otlp_endpoint, cfg.name)
        self.front = front = bind_front(ctx, cfg)  # a bind that fails is one line (cis.runtime.front_socket)
        self.poll_items = [(front, zmq.POLLIN)] + [(up, zmq.POLLIN) for up in self.upstream.open(ctx)]
        open_doors(self)  # polled beside the sockets: a door's descriptor wakes the same loop

    def close(self) -> None:
        for door in self.doors:
            door.close()
        if self.front is not None:
            self.front.close(0)
        self.upstream.close()
        if self.executor.tracer is not None:
            self.executor.tracer.close()

    def step(self) -> None:
        """One turn of the loop: wait for a message or a timer, read every waiting message, run a batch, timers.

        After a batch the node first looks without waiting: what arrived while it ran is timed from
        before the batch (``seen_empty``); a message that wakes a wait is timed from the wake-up."""
        events = _poll(self.poll_items, 0) if self.busy else None
        if not events:
            events = self._wait(self._poll_timeout_ms())
            self.seen_empty = time.monotonic()
        self.busy, self.upstream.listened = False, time.monotonic()  # pongs waiting now are read below
        if events:
            self._read(events)
        ex = self.executor
        if ex.queue and ex.due(time.monotonic(), self.stopping):
            ex.run_batch()
            self.busy = True
        now = self.alive_at = time.monotonic()
        if now >= self.next_timer:
            self._timers(now)
        if now >= self.door_due:
            self.door_due = min(door.tick(now) for door in self.doors)

    def _wait(self, timeout_ms: int) -> list:
        """Block in poll until a message comes or the timeout passes; with ``spin``, busy-poll instead
        (no sleep and wake-up per message, for a node that owns a core)."""
        if not self.cfg.spin:
            return _poll(self.poll_items, timeout_ms)
        items, end = self.poll_items, time.monotonic() + timeout_ms / 1000
        while True:
            events = _poll(items, 0)
            if events or time.monotonic() >= end:
                return events

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        if self.executor.queue:
            return max(0, int((self.executor.queue[0].t0 + self.cfg.max_wait - now) * 1000))
        return max(0, int(math.ceil(min(100.0, (self.next_timer - now) * 1000))))

    def _read(self, events: list, limit: int = 4096) -> None:
        """Read every waiting message, one per readable socket per round, until none waits (at most
        ``limit`` rounds, so batches still run under a flood); then answer the status requests among them."""
        front, items, max_bytes = self.front, self.poll_items, self.cfg.max_message_bytes
        try:
            for _ in range(limit):
                for sock, _ in events:
                    if type(sock) is int:  # a front door's descriptor
                        self.door_fds[sock].on_ready()
                        continue
                    try:
                        frames, total, count = P.recv(sock, max_bytes, routed=sock is front)
                    except zmq.Again:
                        continue
                    if sock is front:
                        self._on_front(frames, total, count)
                    else:
                        self._on_parent(sock, frames, total, count)
                events = _poll(items, 0)
                if not events:
                    self.seen_empty = time.monotonic()
                    return
            self.busy = True  # stopped reading with messages waiting: look again before waiting
        finally:  # status is answered after what waited with it was read: its queue depth includes that
            for prefix, rid, v in self.status_asked:
                self._send(self.front, P.encode(P.STATUS_REPLY, rid, v=v, status=self.status()), prefix)
            self.status_asked.clear()

    def _send(self, sock: zmq.Socket | None, frames: list, prefix: Sequence[bytes] = ()) -> bool:
        if sock is None:
            return False
        try:
            P.send(sock, frames, prefix, _NOBLOCK)
            return True
        except zmq.ZMQError:  # the asker is gone or does not read its replies (EHOSTUNREACH, EAGAIN)
            if sock is self.front:
                self.counters["undeliverable"] += 1
            return False

    def refuse(self, prefix: Any, req_id: int, code: str, message: str, kind: str | None, v: int = P.VERSION) -> None:
        self.counters["errors"] += 1
        self.errors_by_code[code] += 1
        self.outcomes[(kind if kind in (P.INFER, P.FORWARD) else "other", code)] += 1
        if type(prefix) is Ticket:  # a front door's request: its door answers
            return prefix.door.error(prefix, code, message)
        self._send(self.front, P.error_frames(req_id, code, message, v, node=self.cfg.node_id), prefix)

    # ------------------------------------------------------------ receiving

    def _on_front(self, frames: list, total: int, count: int) -> None:
        prefix = [frames[0].bytes]
        body = frames[1:]
        if len(body) >= 2 and len(body[0]) == 0:  # REQ-style empty delimiter
            prefix.append(b"")
            body = body[1:]
        if not body:  # nothing but an identity: no header to answer
            self.counters["errors"] += 1
            return
        try:
            msg = P.decode(
                body, self.cfg.max_message_bytes, total - len(prefix[0]), count - len(prefix), P.REQUEST_KINDS
            )
        except P.ProtocolError as exc:
            return self.refuse(prefix, exc.req_id, exc.code, exc.message, exc.kind, exc.version)
        kind = msg.kind
        if kind == P.PING:
            self._send(self.front, P.encode(P.PONG, msg.id, v=msg.head.v, node=self.cfg.node_id), prefix)
        elif kind == P.STATUS:
            self.status_asked.append((prefix, msg.id, msg.head.v))
        elif kind in P.UPDATE_KINDS:
            self.updates.handle(prefix, msg)
        else:
            self.admit(prefix, msg)

    def admit(self, prefix: Any, msg: P.Message) -> None:
        """An INFER or FORWARD into the executor, or its refusal answered: the one way in, from the ROUTER
        (``prefix``: the peer's identity frames) and from the front doors (``prefix``: a doors.Ticket)."""
        kind, v = msg.kind, msg.head.v
        if not self.seen.first(prefix, msg.id):
            self.counters["duplicates"] += 1  # a retry of a request held or answered here: that answer is the one
            return
        if self.stopping:
            self.seen.forget(prefix, msg.id)  # not run: a retry with this id is a new request
            return self.refuse(prefix, msg.id, "shutting_down", f"node {self.cfg.node_id} is stopping", kind, v)
        refused = self.executor.admit(prefix, msg, self.seen_empty)
        if refused is not None:
            self.seen.forget(prefix, msg.id)
            self.refuse(prefix, msg.id, *refused, kind, v)
            if refused[0] == "overloaded":
                self.overload.refused(time.monotonic(), self.executor.queued, self.cfg.queue_limit)
                self.next_timer = min(self.next_timer, self.overload.due)

    def _on_parent(self, sock: zmq.Socket, frames: list, total: int, count: int) -> None:
        try:
            msg = P.decode(frames, self.cfg.max_message_bytes, total, count, (P.RESULT, P.ERROR, P.PONG))
        except P.ProtocolError as exc:
            self.counters["parent_bad_replies"] += 1
            pending = self.pending.pop(exc.req_id, None)  # a garbled answer: serve those samples here
            if pending is not None:
                self.upstream.done(exc.req_id)
                self.executor.fallback(pending)
            return
        if msg.kind == P.PONG:
            self.upstream.answered(sock, time.monotonic())  # back (or up for the first time): said at once
            return
        pending = self.pending.pop(msg.id, None)
        if pending is None:
            return  # a late answer to a forward already answered from here (or by another replica)
        self.upstream.done(msg.id)
        self.upstream.answered(sock, time.monotonic())  # any reply shows the replica is alive
        self.executor.from_parent(pending, msg)

    # ------------------------------------------------------------ the executor's outbox

    def reply(self, req: Request) -> None:
        prefix: Any = req.prefix  # ROUTER identity frames, or a front door's Ticket
        door = type(prefix) is Ticket  # a front door's request: counted as any, answered by its door
        frames = None if door else P.result_frames(
            req.req_id, req.n, req.cls, req.conf, req.exit, req.flags, req.served_by, self.cfg.node_id, req.logits,
            req.version.id, req.v,
        )  # fmt: skip
        if frames is not None and len(frames[0]) > P.MAX_HEADER_BYTES:  # served_by: a node id per sample
            return self.error(req, "too_large", f"the result of {req.n} samples needs a {len(frames[0])}-byte header "
                              f"(a node id per sample), over {P.MAX_HEADER_BYTES}; send fewer samples a request")
        now = time.monotonic()
        seconds = now - req.t0  # counted before it leaves: whoever gets it sees it in the metrics
        self.latency.add(seconds)
        if self.observe_latency is not None:
            self.observe_latency(seconds)
        self.outcomes[_OK[req.forward]] += 1
        if door:
            prefix.door.result(prefix, req)
        else:
            self.seen.answered(prefix, req.req_id)
            self._send(self.front, frames or [], prefix)
        if req.trace is not None:
            tracing.finish(self.executor.tracer, req, "ok", now)

    def error(self, req: Request, code: str, message: str) -> None:
        self.seen.answered(req.prefix, req.req_id)
        self.refuse(req.prefix, req.req_id, code, message, P.FORWARD if req.forward else P.INFER, req.v)
        if req.trace is not None:
            tracing.finish(self.executor.tracer, req, code)

    def forward(self, pending: Pending, carry: dict[str, np.ndarray]) -> bool:
        """Send the carry of ``pending`` to the parent as one FORWARD; it waits at most
        forward_timeout x tiers above, and never past the earliest deadline among its requests."""
        now, wall = time.monotonic(), time.time()
        wait = self.cfg.forward_timeout * max(1, self.cfg.tiers_above)
        if pending.deadline is not None:
            wait = min(wait, pending.deadline - wall)
        if wait <= 0:
            return False
        fid, nid, parts = next(self.up_ids), self.cfg.node_id, pending.parts
        route, traced = forward_route(parts, nid)
        frames = P.encode(
            P.FORWARD,
            fid,
            carry,
            stage=self.cfg.exit + 1,
            deadline=wall + wait - 0.02,
            route=route[-P.MAX_ROUTE :],
            sender=nid,
            **(tracing.forward_fields(parts, self.executor.tracer, now) if traced else _NONE),
            **(_WANT_LOGITS if pending.logits is not None else _NONE),  # a request among them wants logits
            **pending.version.wire,  # the bundle that made the carry: only it continues it
        )
        sent = self.upstream.send(fid, frames, pending.n, now)
        if self.upstream.orphans:  # a replica found dead on the way: its forwards are served here, next turn
            self.next_timer = now
        if not sent:
            return False
        pending.expires = now + wait
        self.pending[fid] = pending
        self.next_timer = min(self.next_timer, pending.expires)
        return True

    def _timers(self, now: float) -> None:
        """The heartbeat (and the parent's state), forwards past their wait, the end of an overload;
        ``next_timer`` is when this has work again."""
        up = self.upstream
        if self.cfg.parent and now >= self.next_ping:
            self.next_ping = now + self.cfg.heartbeat
            up.heartbeat(now, lambda: P.encode(P.PING, next(self.up_ids), node=self.cfg.name))
        if self.pending:
            # past its wait as the node last listened: an answer that came during a long batch is read first
            for fid in [f for f, p in self.pending.items() if p.expires <= up.listened] + up.take_orphans():
                if fid in self.pending:
                    up.done(fid)
                    self.executor.fallback(self.pending.pop(fid))
        self.overload.check(now)
        expires = [p.expires for p in self.pending.values()]
        due = self.updates.tick(now) if now >= self.updates.due else self.updates.due
        self.next_timer = min(self.next_ping if self.cfg.parent else math.inf, self.overload.due, due, *expires)

