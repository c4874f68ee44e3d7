"""The socket-free half of a node: admission, the bounded queue, micro-batches, stages, the exit decision.

:class:`Executor` owns what a node does with a request once its frames are a
checked :class:`cis.runtime.protocol.Message`; everything that leaves goes
through an :class:`Outbox` (the node's sockets, or a list in tests), so tests
drive it directly:

- :meth:`Executor.admit` checks the request against the entry stage and the
  limits; a request that fails gets an error and never enters the queue;
- :meth:`Executor.run_batch` takes up to ``max_batch`` samples from the queue,
  answers those past their deadline without running them, runs the rest stage by
  stage, and when a stage raises runs each request again alone (isolation), so
  one poisoned request cannot spoil the others;
- the exit decision serves, forwards (through the outbox) or, when the cap or
  the parent refuses, serves here with a flag;
- :meth:`Executor.scatter` / :meth:`Executor.fallback` complete the samples a
  forward took, with the parent's answer or with this node's own.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cis import patience as pt
from cis.policy import ExitPolicy, TokenBucket
from cis.runtime import protocol as P
from cis.runtime.adapt import ThresholdController
from cis.runtime.config import NodeConfig
from cis.runtime.feeds import FeedContract, TensorSpec, nonfinite_rows
from cis.stages import LOGITS


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


class Request:
    """One request (a client's INFER or a child's FORWARD) while the node works on it."""

    __slots__ = (
        "prefix",
        "req_id",
        "stage",
        "feeds",
        "n",
        "t0",
        "deadline",
        "route",
        "forward",
        "bad",
        "cls",
        "conf",
        "exit",
        "flags",
        "served_by",
        "remaining",
        "answered",
    )

    def __init__(
        self,
        prefix: Sequence[bytes],
        req_id: int,
        stage: int,
        feeds: dict[str, np.ndarray],
        n: int,
        t0: float,
        deadline: float | None = None,
        route: Sequence[str] = (),
        forward: bool = False,
        bad: np.ndarray | None = None,
    ):
        self.prefix, self.req_id, self.stage, self.feeds, self.n = prefix, req_id, stage, feeds, n
        self.t0 = t0  # monotonic seconds when the request reached the node (status latencies start here)
        self.deadline, self.route, self.forward, self.bad = deadline, list(route), forward, bad
        self.cls = np.zeros(n, np.int64)
        self.conf = np.zeros(n, np.float32)
        self.exit = np.zeros(n, np.int32)
        self.flags = np.zeros(n, np.uint8)
        self.served_by: list[str] = [""] * n
        self.remaining = n
        self.answered = False


class Pending:
    """Samples forwarded to the parent, with this node's own answer kept as the fallback."""

    __slots__ = ("parts", "cls", "conf", "n", "deadline", "expires")

    def __init__(self, parts: list[tuple[Request, np.ndarray]], cls: np.ndarray, conf: np.ndarray):
        self.parts, self.cls, self.conf = parts, cls, conf
        self.n = len(cls)
        deadlines = [req.deadline for req, _ in parts if req.deadline]
        self.deadline = min(deadlines) if deadlines else None
        self.expires = math.inf  # set by whoever sends it


class Outbox(Protocol):
    @property
    def parent_up(self) -> bool: ...

    def reply(self, req: Request) -> None: ...

    def error(self, req: Request, code: str, message: str) -> None: ...

    def forward(self, pending: Pending, carry: dict[str, np.ndarray]) -> bool:
        """Send the carry to the parent; False when it cannot go (then the executor serves it here)."""


class Executor:
    def __init__(
        self, config: NodeConfig, stages: Mapping[int, Stage], out: Outbox, counters: collections.Counter | None = None
    ):
        self.cfg = config
        self.stages = dict(stages)
        if config.exit not in self.stages:
            raise ValueError(f"node {config.node_id!r}: no stage {config.exit} (its exit)")
        self.out = out
        self.counters = counters if counters is not None else collections.Counter()
        self.policy = ExitPolicy(config.measure, {config.node_id: config.threshold}, config.patience)
        self.patient = self.policy.uses_patience
        self.bucket = TokenBucket(config.max_transfer_rate, config.transfer_burst, now=time.monotonic())
        self.controller = (
            ThresholdController(config.adapt_target, config.threshold, gain=config.adapt_gain)
            if config.adapt and config.parent and not self.patient  # no threshold to move under patience
            else None
        )
        self.carry_names = [t.name for t in self.stages[config.exit].outputs if t.name != LOGITS]
        self.state_names = (pt.LABEL, pt.COUNT) if self.patient else ()
        self.contracts = {k: FeedContract(stage.inputs, self.state_names) for k, stage in self.stages.items()}
        self.queue: collections.deque[Request] = collections.deque()
        self.queued = 0  # samples in the queue
        self.stage_ok = True  # False after a stage raised, until a stage run succeeds (health: stage_failed)
        self.served_early = np.zeros(config.exit, np.int64)  # patience: samples answered at exit e < the node's

    # ------------------------------------------------------------ admission

    def admit(self, prefix: Sequence[bytes], msg: P.Message, t0: float) -> tuple[str, str] | None:
        """Queue an INFER/FORWARD, or return (error code, message) without queueing it.

        Checked in this order: entry stage, tensors against that stage, samples
        against the queue limit, deadline, room in the queue, finite values."""
        h, nid, limit = msg.header, self.cfg.node_id, self.cfg.queue_limit
        stage = h.get("stage", 1)
        if stage not in self.stages or stage > self.cfg.exit:
            return "bad_stage", f"entry stage {stage!r}; node {nid} runs stages {sorted(self.stages)}"
        problem, n = self.contracts[stage].check(msg.tensors)
        if problem:
            return "bad_tensor", f"stage {stage}: {problem}"
        if n > limit:
            return (
                "too_many_samples",
                f"request of {n} samples; node {nid} admits at most {limit} (its queue limit): split it",
            )
        deadline = h.get("deadline") or None
        if deadline is not None and deadline <= time.time():
            return (
                "deadline_exceeded",
                f"deadline {deadline:.3f} passed {time.time() - deadline:.3f} s before node {nid} got the request",
            )
        if self.queued + n > limit:
            self.counters["overloaded"] += 1
            return "overloaded", f"node {nid}: {self.queued} samples queued, limit {limit}; retry later"
        bad = nonfinite_rows(msg.tensors, n)
        if bad is not None and self.cfg.nonfinite == "refuse":
            rows = np.flatnonzero(bad)
            return (
                "bad_input",
                f"{len(rows)} of {n} samples hold NaN or infinity (first: sample {rows[0]}); expected finite values",
            )
        self.queue.append(
            Request(
                prefix, msg.id, stage, msg.tensors, n, t0, deadline, h.get("route") or (), msg.kind == P.FORWARD, bad
            )
        )
        self.queued += n
        self.counters["requests"] += 1
        self.counters["samples"] += n
        return None

    def due(self, now: float, draining: bool = False) -> bool:
        """Whether a batch should run now: a full batch waits, the oldest waited max_wait, or the node drains."""
        return bool(self.queue) and (
            self.queued >= self.cfg.max_batch or now - self.queue[0].t0 >= self.cfg.max_wait or draining
        )

    # ------------------------------------------------------------ running

    def run_batch(self) -> None:
        """Run the next micro-batch: up to max_batch samples in arrival order (a bigger request runs alone)."""
        batch: list[Request] = []
        total, wall = 0, time.time()
        while self.queue and (not batch or total + self.queue[0].n <= self.cfg.max_batch):
            req = self.queue.popleft()
            self.queued -= req.n
            if req.deadline is not None and req.deadline <= wall:
                self.counters["expired"] += 1
                self._fail(
                    req,
                    "deadline_exceeded",
                    f"deadline passed {wall - req.deadline:.3f} s before node {self.cfg.node_id} could run it",
                )
                continue
            batch.append(req)
            total += req.n
        if batch:
            self.counters["batches"] += 1
            self._process(batch)

    def _process(self, batch: list[Request]) -> None:
        nid = self.cfg.node_id
        try:
            logits, carry, order, hit = self._run_stages(batch)
        except Exception as exc:  # a stage failed: retry each request alone before blaming any
            if len(batch) > 1:
                self.counters["isolated"] += len(batch)
                for req in batch:
                    self._process([req])
            else:
                self.stage_ok = False
                self._fail(batch[0], "internal", f"node {nid}: stage failed: {type(exc).__name__}: {exc}")
            return
        self.stage_ok = True
        try:
            self._decide(order, logits, carry, hit)
        except Exception as exc:  # a bug in deciding must not kill the node: every unanswered request gets one error
            for req in order:
                if not req.answered:
                    self._fail(req, "internal", f"node {nid}: deciding failed: {type(exc).__name__}: {exc}")

    def _fail(self, req: Request, code: str, message: str) -> None:
        req.answered = True
        self.out.error(req, code, message)

    def _run_stages(self, batch: list[Request]):
        """Run the batch stage by stage; requests entering later join at their stage.

        Returns (logits at the node's exit, carry, the requests in sample order,
        the patience decision or None): with the patience measure the state is
        advanced after every stage, and ``hit`` records per sample the first
        exit here whose count reached p, with that exit's class and the count.
        """
        order: list[Request] = []
        feeds: dict[str, np.ndarray] | None = None
        out: dict[str, np.ndarray] = {}
        state: pt.PatienceState | None = None
        hit: dict[str, np.ndarray] | None = None
        for k in range(min(req.stage for req in batch), self.cfg.exit + 1):
            joining = [req for req in batch if req.stage == k]
            stage = self.stages[k]
            names = [t.name for t in stage.inputs]
            parts = ([feeds] if feeds is not None else []) + [req.feeds for req in joining]
            if not parts:
                continue
            order.extend(joining)
            run_feeds = {
                nm: (parts[0][nm] if len(parts) == 1 else np.concatenate([p[nm] for p in parts])) for nm in names
            }
            out = stage.run(run_feeds)
            if self.patient:
                fresh = [pt.from_carry(req.feeds, req.n) for req in joining]
                state = pt.concat(([state] if state is not None else []) + fresh)
                m = sum(req.n for req in joining)
                new_hit = {"exit": np.zeros(m, np.int32), "cls": np.zeros(m, np.int64), "conf": np.zeros(m, np.float32)}
                hit = new_hit if hit is None else {key: np.concatenate([hit[key], new_hit[key]]) for key in hit}
                done, state = self.policy.decide_patience(out[LOGITS], state)
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
        return out[LOGITS], carry, order, hit

    # ------------------------------------------------------------ deciding

    def _decide(
        self,
        order: list[Request],
        logits: np.ndarray,
        carry: dict[str, np.ndarray],
        hit: dict[str, np.ndarray] | None = None,
    ) -> None:
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
        if any(req.bad is not None for req in order):  # nonfinite="flag": answered here, never forwarded
            bad = np.concatenate([req.bad if req.bad is not None else np.zeros(req.n, bool) for req in order])
            serve, cls, conf = serve | bad, np.where(bad, -1, cls), np.where(bad, np.float32(np.nan), conf)
            flags[bad] = P.FLAG_NONFINITE
            self.counters["nonfinite"] += int(bad.sum())
        if self.cfg.parent is None:
            serve = np.ones(n, bool)
        else:
            want = ~serve
            if self.controller is not None:
                self.controller.update(int(want.sum()), n)
                self.policy.thresholds[nid] = self.controller.threshold
            if want.any():
                if not self.out.parent_up:
                    flags[want] = P.FLAG_DEGRADED
                    serve = np.ones(n, bool)
                else:
                    for i in np.flatnonzero(want):
                        if not self.bucket.take(now):
                            flags[i] = P.FLAG_CAPPED
                            serve[i] = True
        if hit is not None:  # answered before this node's exit (cis_samples_total{exit})
            self.served_early += np.bincount(exit_at[serve], minlength=self.cfg.exit + 1)[: self.cfg.exit]
        self.counters["served"] += int(np.count_nonzero(serve))
        self.counters["degraded"] += int(np.count_nonzero(flags & P.FLAG_DEGRADED))
        self.counters["capped"] += int(np.count_nonzero(flags & P.FLAG_CAPPED))
        starts = np.cumsum([0] + [req.n for req in order])  # request k holds samples starts[k]:starts[k+1]
        fwd = np.flatnonzero(~serve)
        if len(fwd):
            # samples are in request order, so each request's forwarded samples are one run of ``fwd``
            owners = np.searchsorted(starts, fwd, side="right") - 1
            cut = np.flatnonzero(np.diff(owners)) + 1
            parts = [(order[o[0]], g - starts[o[0]]) for g, o in zip(np.split(fwd, cut), np.split(owners, cut))]
            whole = len(fwd) == n  # nothing served here: the carry goes as it is, without a copy
            pending = Pending(parts, cls[fwd], conf[fwd])
            if self.out.forward(pending, carry if whole else {k: v[fwd] for k, v in carry.items()}):
                self.counters["forwarded"] += pending.n
            else:
                self.counters["degraded"] += pending.n
                self.counters["served"] += pending.n
                self.fallback(pending, count=False)
        for k, req in enumerate(order):
            here = np.flatnonzero(serve[starts[k] : starts[k + 1]])
            if not len(here) or req.answered:
                continue
            src = here + starts[k]
            req.cls[here], req.conf[here], req.exit[here], req.flags[here] = (
                cls[src],
                conf[src],
                exit_at[src],
                flags[src],
            )
            for j in here:
                req.served_by[j] = nid
            req.remaining -= len(here)
            if req.remaining == 0:
                self._finish(req)

    def _finish(self, req: Request) -> None:
        req.answered = True
        self.out.reply(req)

    def scatter(self, pending: Pending, cls, conf, ex, flags, served_by: Sequence[Any]) -> None:
        """Fill the forwarded samples with the parent's answer (or this node's own); reply to complete requests."""
        off = 0
        for req, idx in pending.parts:
            m = len(idx)
            if not req.answered:
                req.cls[idx], req.conf[idx], req.exit[idx], req.flags[idx] = (
                    cls[off : off + m],
                    conf[off : off + m],
                    ex[off : off + m],
                    flags[off : off + m],
                )
                for j, s in zip(idx, served_by[off : off + m]):
                    req.served_by[j] = str(s)
                req.remaining -= m
                if req.remaining == 0:
                    self._finish(req)
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
            pending.conf,
            np.full(n, self.cfg.exit, np.int32),
            np.full(n, P.FLAG_DEGRADED, np.uint8),
            [self.cfg.node_id] * n,
        )
