"""One node of the CIS: a ROUTER for clients and children, a DEALER to the parent, one poll loop.

The story of one request at a node:

1. its frames arrive on the ROUTER (from a client at stage 1, or from a child
   with the carry of the samples the child did not serve, at the stage after the
   child's exit). ZeroMQ holds at most ``rcv_hwm`` messages per peer before the
   node reads them (beyond, TCP pushes back on the sender) and drops the
   connection of a peer that sends a frame over ``max_message_bytes``. The node
   reads every waiting message before it runs a batch, frame by frame with a
   running total (:func:`cis.runtime.protocol.recv`), so what is really waiting
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
5. at the node's own exit the one exit policy (:class:`cis.policy.ExitPolicy`)
   decides per sample (with FLAME's patience measure: after *every* stage the
   node runs; a sample is served at the first exit whose count reaches p, and
   the state (label, count) of the others goes to the parent as two more carry
   tensors, ``patience_label`` and ``patience_count``, int64 (N,)): confident
   samples are answered here; the others are forwarded to the parent as one
   FORWARD message, as long as the transfer cap (:class:`cis.policy.TokenBucket`)
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
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from cis.metrics import latency_summary
from cis.runtime import protocol as P
from cis.runtime.config import NodeConfig
from cis.runtime.executor import BundleStage, Executor, Pending, Request, Stage
from cis.runtime.security import CurveConfig, secure_client, secure_server, start_authenticator

__all__ = ["BundleStage", "LatencyWindow", "Node", "NodeConfig", "Stage"]


class LatencyWindow:
    """Seconds from a request's arrival at the node to its result, over the last ``size`` results."""

    def __init__(self, size: int = 4096):
        self.values: collections.deque[float] = collections.deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    def summary(self) -> dict[str, float | None]:
        """The one latency summary of cis.metrics (seconds: count, mean_s, p50_s, p95_s, p99_s, max_s)."""
        return latency_summary(np.fromiter(self.values, float, len(self.values)))


class Node:
    def __init__(self, config: NodeConfig, stages: Mapping[int, Stage]):
        self.cfg = config
        self.counters: collections.Counter = collections.Counter()
        self.errors_by_code: collections.Counter = collections.Counter()
        self.executor = Executor(config, stages, self, self.counters)
        self.pending: dict[int, Pending] = {}
        self.up_ids = itertools.count(1)  # ids of forwards and pings: one counter, so a reply names one of them
        self.last_pong = -math.inf
        self.next_ping = 0.0
        self.stopping = False
        self.latency = LatencyWindow()
        self.started = time.time()
        self.seen_empty = time.monotonic()  # when the node last found its ROUTER empty
        self.front: zmq.Socket | None = None
        self.up: zmq.Socket | None = None
        self.status_asked: list[tuple[list[bytes], int]] = []  # answered at the end of the drain
        self.observe_latency: Callable[[float], None] | None = None  # each result's latency (metrics_http)

    @property
    def stages(self) -> dict[int, Stage]:
        return self.executor.stages

    @property
    def policy(self):
        return self.executor.policy

    # ------------------------------------------------------------ status

    @property
    def parent_up(self) -> bool:
        return self.up is not None and time.monotonic() - self.last_pong < self.cfg.heartbeat_timeout

    def status(self) -> dict:
        c, ex = self.counters, self.executor
        bucket = ex.bucket
        return {
            "node": self.cfg.node_id,
            "exit": self.cfg.exit,
            "address": self.cfg.bind,
            "parent": self.cfg.parent,
            "parent_up": self.parent_up,
            "threshold": _num(ex.policy.thresholds[self.cfg.node_id]),
            **{
                key: c[key]
                for key in (
                    "requests",
                    "samples",
                    "served",
                    "forwarded",
                    "degraded",
                    "capped",
                    "nonfinite",
                    "errors",
                    "overloaded",
                    "expired",
                    "isolated",
                    "undeliverable",
                    "batches",
                )
            },
            "errors_by_code": dict(self.errors_by_code),
            "queue_depth": ex.queued,
            "queue_requests": len(ex.queue),
            "queue_limit": self.cfg.queue_limit,
            "in_flight_forwarded": sum(p.n for p in self.pending.values()),
            "latency": self.latency.summary(),
            "transfer_cap": {"rate": _num(bucket.rate), "burst": _num(bucket.burst), "tokens": _num(bucket.tokens)},
            "adapt": ex.controller.to_json() if ex.controller else None,
            "restarts": self.cfg.restarts,
            "uptime": time.time() - self.started,
            "stopping": self.stopping,
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
        auth = (
            start_authenticator(ctx, self.cfg.curve.allow_dir, self.cfg.curve.secret_file)
            if self.cfg.curve.allow_dir
            else None
        )
        if install_signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        front = ctx.socket(zmq.ROUTER)
        front.linger = 0
        front.maxmsgsize = (
            self.cfg.max_message_bytes
        )  # per frame: a bigger frame can never be valid; ZeroMQ drops the peer
        front.rcvhwm = self.cfg.rcv_hwm
        front.rcvbuf = self.cfg.rcv_buf
        front.sndhwm = 10000
        front.router_mandatory = True  # a reply that cannot be delivered raises, so it is counted, not lost unseen
        secure_server(front, self.cfg.curve)
        front.bind(self.cfg.bind)
        up = None
        if self.cfg.parent:
            up = ctx.socket(zmq.DEALER)
            up.linger = 0
            up.immediate = True  # no queueing towards a parent that is not connected
            up.reconnect_ivl = 100
            up.reconnect_ivl_max = 250  # a restarted parent is found again within a quarter second
            up.maxmsgsize = self.cfg.max_message_bytes
            if self.cfg.curve.enabled:
                secure_client(
                    up, CurveConfig(self.cfg.curve.secret_file, None, self.cfg.curve.server_public_file or None)
                )
            up.connect(self.cfg.parent)
        self.front, self.up = front, up
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        if up is not None:
            poller.register(up, zmq.POLLIN)
        if ready:
            ready()
        drain_until = None
        try:
            while True:
                if stop is not None and stop():
                    self.stopping = True
                if self.stopping:
                    drain_until = drain_until or time.monotonic() + self.cfg.drain_timeout
                    if (not self.executor.queue and not self.pending) or time.monotonic() > drain_until:
                        break
                events = dict(poller.poll(0))  # what came while the node was busy arrived after seen_empty
                if not events:
                    events = dict(poller.poll(self._poll_timeout_ms()))
                    self.seen_empty = time.monotonic()  # what wakes the poll arrived just now
                if front in events:
                    self._drain(front, self._on_front)
                if up is not None and up in events:
                    self._drain(up, self._on_parent)
                if self.executor.due(time.monotonic(), self.stopping):
                    self.executor.run_batch()
                self._timers()
        finally:
            front.close(0)
            if up is not None:
                up.close(0)
            if auth is not None:
                auth.stop()
            if own_ctx:
                ctx.term()

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        if self.executor.queue:
            return max(0, int((self.executor.queue[0].t0 + self.cfg.max_wait - now) * 1000))
        t = 100.0
        if self.cfg.parent:
            t = min(t, (self.next_ping - now) * 1000)
        if self.pending:
            t = min(t, (min(p.expires for p in self.pending.values()) - now) * 1000)
        return max(0, int(math.ceil(t)))

    def _drain(self, sock: zmq.Socket, handler: Callable[[list, int, int], None], limit: int = 4096) -> None:
        """Read every waiting message (at most ``limit``, so batches still run under a flood)."""
        try:
            for _ in range(limit):
                try:
                    frames, total, count = P.recv(sock, self.cfg.max_message_bytes)
                except zmq.Again:
                    if sock is self.front:
                        self.seen_empty = time.monotonic()
                    return
                handler(frames, total, count)
        finally:  # status is answered after what waited with it was read: its queue depth includes that
            for prefix, rid in self.status_asked:
                self._send(self.front, P.encode(P.STATUS_REPLY, rid, status=self.status()), prefix)
            self.status_asked.clear()

    def _send(self, sock: zmq.Socket | None, frames: list, prefix: Sequence[bytes] = ()) -> bool:
        if sock is None:
            return False
        try:
            P.send(sock, frames, prefix, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # the asker is gone or does not read its replies (EHOSTUNREACH, EAGAIN)
            if sock is self.front:
                self.counters["undeliverable"] += 1
            return False

    def _error(self, prefix: Sequence[bytes], req_id: int, code: str, message: str) -> None:
        self.counters["errors"] += 1
        self.errors_by_code[code] += 1
        self._send(self.front, P.error_frames(req_id, code, message, node=self.cfg.node_id), prefix)

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
            return self._error(prefix, exc.req_id, exc.code, exc.message)
        kind = msg.kind
        if kind == P.PING:
            self._send(self.front, P.encode(P.PONG, msg.id, node=self.cfg.node_id), prefix)
        elif kind == P.STATUS:
            self.status_asked.append((prefix, msg.id))
        elif self.stopping:
            self._error(prefix, msg.id, "shutting_down", f"node {self.cfg.node_id} is stopping")
        else:
            refused = self.executor.admit(prefix, msg, self.seen_empty)
            if refused is not None:
                self._error(prefix, msg.id, *refused)

    def _on_parent(self, frames: list, total: int, count: int) -> None:
        try:
            msg = P.decode(frames, self.cfg.max_message_bytes, total, count, (P.RESULT, P.ERROR, P.PONG))
        except P.ProtocolError as exc:
            self.counters["parent_bad_replies"] += 1
            pending = self.pending.pop(exc.req_id, None)  # a garbled answer: serve those samples here
            if pending is not None:
                self.executor.fallback(pending)
            return
        if msg.kind == P.PONG:
            self.last_pong = time.monotonic()
            return
        pending = self.pending.pop(msg.id, None)
        if pending is None:
            return  # a late answer to a forward already answered from here
        self.last_pong = time.monotonic()  # any reply shows the parent is alive
        t = msg.tensors
        if msg.kind == P.RESULT and len(t["class"]) == pending.n:
            self.executor.scatter(pending, t["class"], t["confidence"], t["exit"], t["flags"], msg.header["served_by"])
        else:
            self.executor.fallback(pending)

    # ------------------------------------------------------------ the executor's outbox

    def reply(self, req: Request) -> None:
        tensors = {"class": req.cls, "confidence": req.conf, "exit": req.exit, "flags": req.flags}
        self._send(
            self.front,
            P.encode(P.RESULT, req.req_id, tensors, served_by=req.served_by, node=self.cfg.node_id),
            req.prefix,
        )
        seconds = time.monotonic() - req.t0
        self.latency.add(seconds)
        if self.observe_latency is not None:
            self.observe_latency(seconds)
        self.counters["replies"] += 1

    def error(self, req: Request, code: str, message: str) -> None:
        self._error(req.prefix, req.req_id, code, message)

    def forward(self, pending: Pending, carry: dict[str, np.ndarray]) -> bool:
        """Send the carry of ``pending`` to the parent as one FORWARD; it waits at most
        forward_timeout x tiers above, and never past the earliest deadline among its requests."""
        now, wall = time.monotonic(), time.time()
        wait = self.cfg.forward_timeout * max(1, self.cfg.tiers_above)
        if pending.deadline is not None:
            wait = min(wait, pending.deadline - wall)
        if wait <= 0:
            return False
        fid = next(self.up_ids)
        route = list(dict.fromkeys([r for req, _ in pending.parts for r in req.route] + [self.cfg.node_id]))[
            -P.MAX_ROUTE :
        ]
        frames = P.encode(
            P.FORWARD,
            fid,
            carry,
            stage=self.cfg.exit + 1,
            deadline=wall + wait - 0.02,
            route=route,
            sender=self.cfg.node_id,
        )
        if not self._send(self.up, frames):
            return False
        pending.expires = now + wait
        self.pending[fid] = pending
        return True

    def _timers(self) -> None:
        now = time.monotonic()
        if self.cfg.parent and now >= self.next_ping:
            self.next_ping = now + self.cfg.heartbeat
            self._send(self.up, P.encode(P.PING, next(self.up_ids), node=self.cfg.node_id))
        if self.pending:
            for fid in [f for f, p in self.pending.items() if p.expires <= now]:
                self.executor.fallback(self.pending.pop(fid))


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")
