"""One node of the CIS: a ROUTER for clients and children, a DEALER to the parent, one poll loop.

The story of one request at a node:

1. it arrives on the ROUTER (from a client at stage 1, or from a child with the
   carry of the samples the child did not serve, at the stage after the child's exit);
2. it waits in a bounded queue (full: an immediate ``overloaded`` error) and is
   run together with what else waits (micro-batching: up to ``max_batch``
   samples, after at most ``max_wait`` seconds; stage by stage, so requests that
   enter at different stages share the later stages);
3. at the node's own exit the one exit policy (:class:`cis.policy.ExitPolicy`)
   decides per sample (with FLAME's patience measure: after *every* stage the
   node runs, since the count is over consecutive exits; a sample is served at
   the first exit whose count reaches p, and the state (label, count) of the
   others goes to the parent as two more carry tensors, ``patience_label`` and
   ``patience_count``, int64 (N,); a request from a client starts fresh): confident samples are answered here; the others are
   forwarded to the parent as one FORWARD message, as long as the transfer cap
   (:class:`cis.policy.TokenBucket`) has tokens and the parent is up; what the
   cap refuses is served here (flag ``capped``), what cannot reach the parent is
   served here (flag ``degraded``);
4. when every sample of the request has a result (from here or from the parent's
   reply, or from this node's own exit when the parent did not answer in time),
   exactly one RESULT goes back to whoever asked.
"""

from __future__ import annotations

import collections
import itertools
import math
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import zmq

from cis import patience as pt
from cis.policy import ExitPolicy, TokenBucket
from cis.runtime import protocol as P
from cis.runtime.adapt import ThresholdController
from cis.runtime.security import CurveConfig, secure_client, secure_server, start_authenticator


class TensorSpec(Protocol):
    name: str
    shape: tuple
    dtype: str


class Stage(Protocol):
    """What a node needs of a stage: its tensor contract and a way to run it."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass
class BundleStage:
    """A bundle stage (manifest contract) run by :class:`cis.stages.StageRunner`."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    runner: Any

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feeds)


@dataclass
class NodeConfig:
    node_id: str
    exit: int
    bind: str = "tcp://127.0.0.1:5555"
    parent: str | None = None  # parent's address; None at the root
    threshold: float = -math.inf
    measure: str = "max_softmax"
    patience: int | None = None  # with measure "patience": p (the bundle's inference patience)
    max_transfer_rate: float = math.inf  # forwarded samples per second (token bucket)
    transfer_burst: float | None = None
    max_batch: int = 32  # samples per micro-batch
    max_wait: float = 0.0  # seconds the oldest queued request may wait for company
    queue_limit: int = 1024  # samples waiting; beyond: "overloaded"
    forward_timeout: float = 1.0  # seconds a forward waits for the parent (per tier above)
    tiers_above: int = 1
    heartbeat: float = 0.2
    heartbeat_timeout: float = 1.0
    max_message_bytes: int = 64 << 20
    adapt: bool = False
    adapt_target: float = 0.0  # target forwarded share
    adapt_gain: float = 0.05
    curve: CurveConfig = field(default_factory=CurveConfig)
    drain_timeout: float = 10.0  # seconds to finish in-flight work after SIGTERM


class _Item:
    """One request (a client's INFER or a child's FORWARD) while the node works on it."""

    __slots__ = ("prefix", "req_id", "stage", "feeds", "n", "t0", "deadline", "route", "forward", "cls", "conf", "exit", "flags", "served_by", "remaining")

    def __init__(self, prefix, req_id, stage, feeds, n, deadline, route, forward):
        self.prefix, self.req_id, self.stage, self.feeds, self.n = prefix, req_id, stage, feeds, n
        self.t0 = time.monotonic()
        self.deadline, self.route, self.forward = deadline, route, forward
        self.cls = np.zeros(n, np.int64)
        self.conf = np.zeros(n, np.float32)
        self.exit = np.zeros(n, np.int32)
        self.flags = np.zeros(n, np.uint8)
        self.served_by: list[str] = [""] * n
        self.remaining = n


class _Pending:
    """Samples forwarded to the parent, with this node's own answer kept as the fallback."""

    __slots__ = ("parts", "cls", "conf", "expires", "n")

    def __init__(self, parts, cls, conf, expires):
        self.parts, self.cls, self.conf, self.expires = parts, cls, conf, expires
        self.n = len(cls)


class Node:
    def __init__(self, config: NodeConfig, stages: Mapping[int, Stage]):
        self.cfg = config
        self.stages = dict(stages)
        if config.exit not in self.stages:
            raise ValueError(f"node {config.node_id!r}: no stage {config.exit} (its exit)")
        self.policy = ExitPolicy(config.measure, {config.node_id: config.threshold}, config.patience)
        self.patient = self.policy.uses_patience
        self.bucket = TokenBucket(config.max_transfer_rate, config.transfer_burst, now=time.monotonic())
        self.controller = (
            ThresholdController(config.adapt_target, config.threshold, gain=config.adapt_gain)
            if config.adapt and config.parent and not self.patient  # no threshold to move under patience
            else None
        )
        self.carry_names = [t.name for t in self.stages[config.exit].outputs if t.name != "logits"]
        self.state_names = (pt.LABEL, pt.COUNT) if self.patient else ()
        self.queue: collections.deque[_Item] = collections.deque()
        self.queued = 0
        self.pending: dict[int, _Pending] = {}
        self.fwd_ids = itertools.count(1)
        self.ping_ids = itertools.count(1)
        self.last_pong = -math.inf
        self.next_ping = 0.0
        self.stopping = False
        self.counters = collections.Counter()
        self.latencies: collections.deque[float] = collections.deque(maxlen=4096)
        self.started = time.time()

    # ------------------------------------------------------------ status

    @property
    def parent_up(self) -> bool:
        return self.cfg.parent is not None and time.monotonic() - self.last_pong < self.cfg.heartbeat_timeout

    def status(self) -> dict:
        lat = np.array(self.latencies) if self.latencies else np.zeros(0)
        c = self.counters
        return {
            "node": self.cfg.node_id,
            "exit": self.cfg.exit,
            "address": self.cfg.bind,
            "parent": self.cfg.parent,
            "parent_up": self.parent_up,
            "threshold": _num(self.policy.thresholds[self.cfg.node_id]),
            "requests": c["requests"],
            "samples": c["samples"],
            "served": c["served"],
            "forwarded": c["forwarded"],
            "degraded": c["degraded"],
            "capped": c["capped"],
            "errors": c["errors"],
            "overloaded": c["overloaded"],
            "batches": c["batches"],
            "queue_depth": self.queued,
            "in_flight_forwarded": sum(p.n for p in self.pending.values()),
            "latency_mean": float(lat.mean()) if len(lat) else None,
            "latency_p50": float(np.percentile(lat, 50)) if len(lat) else None,
            "latency_p99": float(np.percentile(lat, 99)) if len(lat) else None,
            "adapt": self.controller.to_json() if self.controller else None,
            "uptime": time.time() - self.started,
            "stopping": self.stopping,
        }

    # ------------------------------------------------------------ loop

    def request_stop(self, *_: Any) -> None:
        self.stopping = True

    def run(self, ctx: zmq.Context | None = None, install_signals: bool = True, ready: Callable[[], None] | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop()`` returns True), then drain and return."""
        own_ctx = ctx is None
        ctx = ctx or zmq.Context()
        auth = start_authenticator(ctx, self.cfg.curve.allow_dir, self.cfg.curve.secret_file) if self.cfg.curve.allow_dir else None
        if install_signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        front = ctx.socket(zmq.ROUTER)
        front.linger = 0
        front.maxmsgsize = self.cfg.max_message_bytes * 4  # hard cap; the soft cap answers "too_large"
        front.sndhwm = front.rcvhwm = 10000
        secure_server(front, self.cfg.curve)
        front.bind(self.cfg.bind)
        up = None
        if self.cfg.parent:
            up = ctx.socket(zmq.DEALER)
            up.linger = 0
            up.immediate = True  # no queueing towards a parent that is not connected
            up.reconnect_ivl = 100
            up.reconnect_ivl_max = 1000
            secure_client(up, CurveConfig(self.cfg.curve.secret_file, None, self.cfg.curve.server_public_file or None)) if self.cfg.curve.enabled else None
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
                    if (not self.queue and not self.pending) or time.monotonic() > drain_until:
                        break
                events = dict(poller.poll(self._poll_timeout_ms()))
                if front in events:
                    self._drain(front, self._on_front)
                if up is not None and up in events:
                    self._drain(up, self._on_parent)
                if self.queue and (self.queued >= self.cfg.max_batch or time.monotonic() - self.queue[0].t0 >= self.cfg.max_wait or self.stopping):
                    self._run_batch()
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
        if self.queue:
            return max(0, int((self.queue[0].t0 + self.cfg.max_wait - now) * 1000))
        t = 100.0
        if self.cfg.parent:
            t = min(t, (self.next_ping - now) * 1000)
        if self.pending:
            t = min(t, (min(p.expires for p in self.pending.values()) - now) * 1000)
        return max(0, int(math.ceil(t)))

    def _drain(self, sock: zmq.Socket, handler: Callable[[list], None], limit: int = 1000) -> None:
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handler(frames)
            if self.queued >= self.cfg.max_batch and self.cfg.max_wait == 0:
                return

    def _send(self, sock: zmq.Socket, frames: list, prefix: Sequence[bytes] = ()) -> bool:
        try:
            P.send(sock, frames, prefix, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError:  # e.g. peer gone (ROUTER_MANDATORY is off, so rare)
            return False

    def _error(self, prefix: Sequence[bytes], req_id: int, code: str, message: str) -> None:
        self.counters["errors"] += 1
        self._send(self.front, P.error_frames(req_id, code, message, node=self.cfg.node_id), prefix)

    # ------------------------------------------------------------ receiving

    def _on_front(self, frames: list) -> None:
        if len(frames) < 2:
            self.counters["errors"] += 1
            return  # nothing but an identity: no header to answer
        prefix = [frames[0].bytes]
        body = frames[1:]
        if len(body) >= 2 and len(body[0]) == 0:  # REQ-style empty delimiter
            prefix.append(b"")
            body = body[1:]
        try:
            msg = P.decode(body, self.cfg.max_message_bytes)
        except P.ProtocolError as exc:
            rid = _peek_id(body[0])
            return self._error(prefix, rid, exc.code, exc.message)
        kind = msg.kind
        if kind == P.PING:
            self._send(self.front, P.encode(P.PONG, msg.id, node=self.cfg.node_id), prefix)
        elif kind == P.STATUS:
            self._send(self.front, P.encode(P.STATUS_REPLY, msg.id, status=self.status()), prefix)
        elif kind in (P.INFER, P.FORWARD):
            self._accept(prefix, msg)
        else:
            self._error(prefix, msg.id, "unknown_kind", f"kind {kind!r} is a reply; a node accepts infer, forward, status, ping")

    def _accept(self, prefix: list[bytes], msg: P.Message) -> None:
        h = msg.header
        if self.stopping:
            return self._error(prefix, msg.id, "shutting_down", f"node {self.cfg.node_id} is stopping")
        stage = h.get("stage", 1)
        if stage not in self.stages or stage > self.cfg.exit:
            return self._error(prefix, msg.id, "bad_stage", f"entry stage {stage!r}; node {self.cfg.node_id} runs stages {sorted(self.stages)}")
        problem, n = _check_feeds(self.stages[stage].inputs, msg.tensors, self.state_names)
        if problem:
            return self._error(prefix, msg.id, "bad_tensor", f"stage {stage}: {problem}")
        if self.queued + n > self.cfg.queue_limit:
            self.counters["overloaded"] += 1
            return self._error(prefix, msg.id, "overloaded", f"node {self.cfg.node_id}: {self.queued} samples queued, limit {self.cfg.queue_limit}")
        deadline = h.get("deadline") or None
        if deadline is not None and not isinstance(deadline, (int, float)):
            return self._error(prefix, msg.id, "bad_message", f"deadline is {deadline!r}; expected seconds since the epoch (a number) or 0")
        route = h.get("route") if isinstance(h.get("route"), list) else []
        item = _Item(prefix, msg.id, stage, msg.tensors, n, deadline, [str(r) for r in route][:16], msg.kind == P.FORWARD)
        self.queue.append(item)
        self.queued += n
        self.counters["requests"] += 1
        self.counters["samples"] += n

    def _on_parent(self, frames: list) -> None:
        try:
            msg = P.decode(frames, self.cfg.max_message_bytes)
        except P.ProtocolError:
            self.counters["errors"] += 1
            return
        if msg.kind == P.PONG:
            self.last_pong = time.monotonic()
            return
        pending = self.pending.pop(msg.id, None)
        if pending is None:
            return  # a late answer to a forward already answered from here
        self.last_pong = time.monotonic()  # any reply shows the parent is alive
        t = msg.tensors
        if msg.kind == P.RESULT and all(k in t and len(t[k]) == pending.n for k in ("class", "confidence", "exit", "flags")):
            served_by = msg.header.get("served_by") or [""] * pending.n
            self._scatter(pending, t["class"], t["confidence"], t["exit"], t["flags"], served_by)
        else:
            self._fallback(pending)

    # ------------------------------------------------------------ work

    def _run_batch(self) -> None:
        batch: list[_Item] = []
        total = 0
        while self.queue and (not batch or total + self.queue[0].n <= self.cfg.max_batch):
            it = self.queue.popleft()
            batch.append(it)
            total += it.n
        self.queued -= total
        self.counters["batches"] += 1
        try:
            logits, carry, order, hit = self._run_stages(batch)
        except Exception as exc:  # a stage failed: every request of the batch gets one error
            for it in batch:
                self._error(it.prefix, it.req_id, "internal", f"node {self.cfg.node_id}: {type(exc).__name__}: {exc}")
            return
        try:
            self._decide(order, logits, carry, hit)
        except Exception as exc:  # a bug in deciding must not kill the node: every unanswered request gets one error
            self._abandon(order, f"node {self.cfg.node_id}: deciding failed: {type(exc).__name__}: {exc}")

    def _abandon(self, items: list[_Item], message: str) -> None:
        """Answer each item still waiting with an ``internal`` error, exactly once (forwards in flight are dropped)."""
        waiting = {id(it) for it in items if it.remaining > 0}
        for fid in [f for f, p in self.pending.items() if any(id(it) in waiting for it, _ in p.parts)]:
            del self.pending[fid]
        for it in items:
            if it.remaining > 0:
                it.remaining = 0
                self._error(it.prefix, it.req_id, "internal", message)

    def _run_stages(self, batch: list[_Item]):
        """Run the batch stage by stage; requests entering later join at their stage.

        Returns (logits at the node's exit, carry, the items in sample order,
        the patience decision or None): with the patience measure the state is
        advanced after every stage, and ``hit`` records per sample the first
        exit here whose count reached p, with that exit's class and the count.
        """
        order: list[_Item] = []
        feeds: dict[str, np.ndarray] | None = None
        out: dict[str, np.ndarray] = {}
        state: pt.PatienceState | None = None
        hit: dict[str, np.ndarray] | None = None
        for k in range(min(it.stage for it in batch), self.cfg.exit + 1):
            joining = [it for it in batch if it.stage == k]
            stage = self.stages[k]
            names = [t.name for t in stage.inputs]
            parts = ([feeds] if feeds is not None else []) + [it.feeds for it in joining]
            if not parts:
                continue
            order.extend(joining)
            run_feeds = {nm: (parts[0][nm] if len(parts) == 1 else np.concatenate([p[nm] for p in parts])) for nm in names}
            out = stage.run(run_feeds)
            if self.patient:
                fresh = [pt.from_carry(it.feeds, it.n) for it in joining]
                state = pt.concat(([state] if state is not None else []) + fresh)
                m = sum(it.n for it in joining)
                new_hit = {"exit": np.zeros(m, np.int32), "cls": np.zeros(m, np.int64), "conf": np.zeros(m, np.float32)}
                hit = new_hit if hit is None else {key: np.concatenate([hit[key], new_hit[key]]) for key in hit}
                done, state = self.policy.decide_patience(out["logits"], state)
                first = done & (hit["exit"] == 0)
                hit["exit"][first] = k
                hit["cls"][first] = state.label[first]
                hit["conf"][first] = state.count[first]
            if k < self.cfg.exit:
                nxt = [t.name for t in self.stages[k + 1].inputs]
                feeds = {nm: out[nm] for nm in nxt}
        carry = {nm: out[nm] for nm in self.carry_names}
        if self.patient:
            assert state is not None and hit is not None
            carry.update(pt.to_carry(state))
            hit["state_count"] = state.count
        return out["logits"], carry, order, hit

    def _decide(self, order: list[_Item], logits: np.ndarray, carry: dict[str, np.ndarray], hit: dict[str, np.ndarray] | None = None) -> None:
        nid, now = self.cfg.node_id, time.monotonic()
        cls = logits.argmax(axis=-1)
        n = len(cls)
        exit_at = np.full(n, self.cfg.exit, np.int32)
        if hit is None:
            serve, conf = self.policy.decide(nid, logits)
        else:  # patience: served at the first exit here that reached p; the confidence reported is the count
            serve = hit["exit"] > 0
            conf = hit["state_count"].astype(np.float32)
            cls = np.where(serve, hit["cls"], cls)
            conf = np.where(serve, hit["conf"], conf)
            exit_at = np.where(serve, hit["exit"], exit_at).astype(np.int32)
        flags = np.zeros(n, np.uint8)
        if self.cfg.parent is None:
            serve = np.ones(n, bool)
        else:
            want = ~serve
            if self.controller is not None:
                self.controller.update(int(want.sum()), n)
                self.policy.thresholds[nid] = self.controller.threshold
            if want.any():
                if not self.parent_up or self.up is None:
                    flags[want] = P.FLAG_DEGRADED
                    serve = np.ones(n, bool)
                else:
                    for i in np.flatnonzero(want):
                        if not self.bucket.take(now):
                            flags[i] = P.FLAG_CAPPED
                            serve[i] = True
        self.counters["served"] += int(np.count_nonzero(serve))
        self.counters["degraded"] += int(np.count_nonzero(flags & P.FLAG_DEGRADED))
        self.counters["capped"] += int(np.count_nonzero(flags & P.FLAG_CAPPED))
        starts = np.cumsum([0] + [it.n for it in order])  # item k holds samples starts[k]:starts[k+1]
        fwd = np.flatnonzero(~serve)
        if len(fwd):
            # samples are in item order, so each item's forwarded samples are one run of ``fwd``
            owners = np.searchsorted(starts, fwd, side="right") - 1
            cut = np.flatnonzero(np.diff(owners)) + 1
            parts = [(order[o[0]], g - starts[o[0]]) for g, o in zip(np.split(fwd, cut), np.split(owners, cut))]
            whole = len(fwd) == n  # nothing served here: the carry goes as it is, without a copy
            self._forward(parts, cls[fwd], conf[fwd], carry if whole else {k: v[fwd] for k, v in carry.items()})
        for k, it in enumerate(order):
            here = np.flatnonzero(serve[starts[k] : starts[k + 1]])
            if not len(here):
                continue
            src = here + starts[k]
            it.cls[here], it.conf[here], it.exit[here], it.flags[here] = cls[src], conf[src], exit_at[src], flags[src]
            for j in here:
                it.served_by[j] = nid
            it.remaining -= len(here)
            if it.remaining == 0:
                self._reply(it)

    def _forward(self, parts: list[tuple[_Item, np.ndarray]], cls: np.ndarray, conf: np.ndarray, carry: dict[str, np.ndarray]) -> None:
        """Send the carry of ``parts`` (item, its sample indices), in that order, to the parent as one FORWARD."""
        now, wall = time.monotonic(), time.time()
        wait = self.cfg.forward_timeout * max(1, self.cfg.tiers_above)
        deadlines = [it.deadline for it, _ in parts if it.deadline]
        if deadlines:
            wait = min(wait, min(deadlines) - wall)
        fid = next(self.fwd_ids)
        route = list(dict.fromkeys([r for it, _ in parts for r in it.route] + [self.cfg.node_id]))
        frames = P.encode(P.FORWARD, fid, carry, stage=self.cfg.exit + 1, deadline=wall + max(wait, 0.0) - 0.02, route=route, sender=self.cfg.node_id)
        pending = _Pending(parts, cls, conf, now + max(wait, 0.0))
        if wait <= 0 or not self._send(self.up, frames):
            self.counters["degraded"] += pending.n
            self.counters["served"] += pending.n
            self._fallback(pending, count=False)
            return
        self.counters["forwarded"] += pending.n
        self.pending[fid] = pending

    def _scatter(self, pending: _Pending, cls, conf, ex, flags, served_by) -> None:
        off = 0
        for it, idx in pending.parts:
            m = len(idx)
            it.cls[idx], it.conf[idx], it.exit[idx], it.flags[idx] = cls[off : off + m], conf[off : off + m], ex[off : off + m], flags[off : off + m]
            for j, s in zip(idx, served_by[off : off + m]):
                it.served_by[j] = str(s)
            it.remaining -= m
            off += m
            if it.remaining == 0:
                self._reply(it)

    def _fallback(self, pending: _Pending, count: bool = True) -> None:
        """The parent did not answer (in time): serve these samples from this node's exit, degraded."""
        if count:
            self.counters["degraded"] += pending.n
            self.counters["served"] += pending.n
            self.counters["forwarded"] -= pending.n
            self.counters["forward_failed"] += pending.n
        n = pending.n
        self._scatter(pending, pending.cls, pending.conf, np.full(n, self.cfg.exit, np.int32), np.full(n, P.FLAG_DEGRADED, np.uint8), [self.cfg.node_id] * n)

    def _reply(self, it: _Item) -> None:
        tensors = {"class": it.cls, "confidence": it.conf, "exit": it.exit, "flags": it.flags}
        self._send(self.front, P.encode(P.RESULT, it.req_id, tensors, served_by=it.served_by, node=self.cfg.node_id), it.prefix)
        self.latencies.append(time.monotonic() - it.t0)
        self.counters["replies"] += 1

    def _timers(self) -> None:
        now = time.monotonic()
        if self.cfg.parent and now >= self.next_ping:
            self.next_ping = now + self.cfg.heartbeat
            self._send(self.up, P.encode(P.PING, next(self.ping_ids), node=self.cfg.node_id))
        if self.pending:
            for fid in [f for f, p in self.pending.items() if p.expires <= now]:
                self._fallback(self.pending.pop(fid))


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _peek_id(frame: Any) -> int:
    try:
        import msgpack

        h = msgpack.unpackb(P._buffer(frame), raw=False)
        rid = h.get("id", 0) if isinstance(h, dict) else 0
        return rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**64 else 0
    except Exception:
        return 0


def _check_feeds(inputs: Sequence[TensorSpec], tensors: Mapping[str, np.ndarray], state: Sequence[str] = ()) -> tuple[str | None, int]:
    """Check the tensors against the entry stage's inputs; ``state``: the patience state's
    names, which may come along (both or neither, int64 (N,)) and start fresh when absent."""
    want = {t.name: t for t in inputs}
    extra = set(tensors) - set(want)
    if state and extra:
        if extra != set(state):
            return f"tensors {sorted(tensors)}; expected {sorted(want)} plus optionally both of {list(state)}", 0
        for name in state:
            a = tensors[name]
            if a.dtype.name != "int64" or a.ndim != 1:
                return f"tensor {name!r} has dtype {a.dtype.name} and shape {list(a.shape)}; expected int64 [N]", 0
        n0 = tensors[state[0]].shape[0]
        if tensors[state[1]].shape[0] != n0:
            return f"tensors {list(state)} disagree on the batch size", 0
        problem, n = _check_feeds(inputs, {k: v for k, v in tensors.items() if k not in extra})
        if problem is None and n != n0:
            return f"tensors disagree on the batch size ({n} vs {n0})", 0
        return problem, n
    if set(tensors) != set(want):
        return f"tensors {sorted(tensors)}; expected {sorted(want)}", 0
    n = None
    for name, spec in want.items():
        a = tensors[name]
        if a.dtype.name != np.dtype(spec.dtype).name:
            return f"tensor {name!r} has dtype {a.dtype.name}; expected {np.dtype(spec.dtype).name}", 0
        shape = tuple(spec.shape)
        if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape[1:], a.shape[1:])):
            return f"tensor {name!r} has shape {list(a.shape)}; expected {[('N' if s is None else s) for s in shape]}", 0
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            return f"tensors disagree on the batch size ({n} vs {a.shape[0]})", 0
    if not n:
        return "empty batch; expected at least one sample", 0
    return None, int(n)
