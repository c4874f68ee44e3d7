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

The work per batch is a fixed number of numpy calls plus a few Python operations
per *request*, never per sample; a request answered whole (all here, or all by
the parent) is answered with the batch's arrays, or the parent's, as they are.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cis.core.policy.decision import BatchDecision
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.policy.transfer_cap import TokenBucket
from cis.core.stages.contract import LOGITS
from cis.runtime import protocol as P
from cis.runtime import tracing
from cis.runtime.adapt import ThresholdController
from cis.runtime.events import FailureLog
from cis.runtime.feeds import FeedContract, nonfinite_rows, overflowed
from cis.runtime.node_config import NodeConfig
from cis.runtime.requests import Outbox, Pending, Request, Stage, exit_logits, parent_logits

if TYPE_CHECKING:
    from cis.runtime.metrics_http import BatchTimings


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
        self.bucket = TokenBucket(config.max_transfer_rate, config.transfer_burst, now=time.monotonic())
        self.controller = (
            ThresholdController(config.adapt_target, config.threshold, gain=config.adapt_gain)
            if config.adapt and config.parent and self.policy.thresholded  # else no threshold to move
            else None
        )
        self.carry_names = [t.name for t in self.stages[config.exit].outputs if t.name != LOGITS]
        runs = [k for k in sorted(self.stages) if k <= config.exit]  # entry stages this node accepts
        self.contracts = {k: FeedContract(self.stages[k].inputs, self.policy.state_names) for k in runs}
        self.input_names = {k: [t.name for t in self.stages[k].inputs] for k in runs}
        self.queue: collections.deque[Request] = collections.deque()
        self.queued = 0  # samples in the queue
        self.stage_ok = True  # False after a stage raised, until a stage run succeeds (health: stage_failed)
        self.served_early = np.zeros(config.exit, np.int64)  # samples the policy answered at exit e < the node's
        self._const: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.timings: BatchTimings | None = None  # queue time, compute time, batch size (set by metrics_http)
        self.tracer: tracing.Tracer | None = None  # the node's spans (cis.runtime.tracing), when it traces
        self.failures = FailureLog(config.name)  # a stage's or the decision's traceback, rate-limited

    # ------------------------------------------------------------ admission

    def admit(self, prefix: Sequence[bytes], msg: P.Message, t0: float) -> tuple[str, str] | None:
        """Queue an INFER/FORWARD, or return (error code, message) without queueing it.

        Checked in this order: entry stage, tensors against that stage, samples
        against the queue limit, deadline, room in the queue, finite values."""
        h, limit = msg.head, self.cfg.queue_limit
        stage = h.stage
        contract = self.contracts.get(stage)
        if contract is None:
            return "bad_stage", f"entry stage {stage!r}; node {self.cfg.node_id} runs stages {sorted(self.stages)}"
        problem, n = contract.check(msg.tensors)
        if problem:
            return "bad_tensor", f"stage {stage}: {problem}"
        trace = None
        if self.tracer is not None or h.traceparent or h.trace_parts:
            trace = tracing.admitted(self.tracer, h, n)
            if type(trace) is str:
                return "bad_message", trace
        if n > limit:
            return (
                "too_many_samples",
                f"request of {n} samples; node {self.cfg.node_id} admits at most {limit} (its queue limit): split it",
            )
        deadline = h.deadline or None
        if deadline is not None and deadline <= time.time():
            return (
                "deadline_exceeded",
                f"deadline {deadline:.3f} passed {time.time() - deadline:.3f} s before node {self.cfg.node_id} "
                "got the request",
            )
        if self.queued + n > limit:
            self.counters["overloaded"] += 1
            return "overloaded", f"node {self.cfg.node_id}: {self.queued} samples queued, limit {limit}; retry later"
        bad = nonfinite_rows(msg.tensors, n)
        if bad is not None and self.cfg.nonfinite == "refuse":
            rows = np.flatnonzero(bad)
            return (
                "bad_input",
                f"{len(rows)} of {n} samples hold NaN or infinity (first: sample {rows[0]}); expected finite values",
            )
        self.queue.append(
            Request(
                prefix, h.id, stage, msg.tensors, n, t0, deadline, h.route or (), h.kind == P.FORWARD, bad, trace,
                h.want_logits,
            )  # fmt: skip
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
        total, wall, queue = 0, time.time(), self.queue
        while queue and (not batch or total + queue[0].n <= self.cfg.max_batch):
            req = queue.popleft()
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
        if not batch:
            return
        self.counters["batches"] += 1
        timings = self.timings
        if timings is None and self.tracer is None:
            return self._process(batch)
        start = time.monotonic()
        if self.tracer is not None:
            tracing.started(batch, start, total)
        if timings is None:
            return self._process(batch)
        timings.started(start, batch, total)
        self._process(batch)
        timings.compute.observe(time.monotonic() - start)

    def _process(self, batch: list[Request]) -> None:
        nid = self.cfg.node_id
        try:
            logits, carry, order, decision, seen = self._run_stages(batch)
        except Exception as exc:  # a stage failed: retry each request alone before blaming any
            if len(batch) > 1:
                self.failures.isolating(len(batch), exc)
                self.counters["isolated"] += len(batch)
                for req in batch:
                    self._process([req])
            else:
                self.stage_ok = False
                self.failures.report("stage_failed", "a stage", [req.req_id for req in batch], exc)
                self._fail(batch[0], "internal", f"node {nid}: stage failed: {type(exc).__name__}: {exc}")
            return
        self.stage_ok = True
        if self.tracer is not None:
            tracing.computed(order, time.monotonic())
        try:
            self._decide(order, logits, carry, decision, seen)
        except Exception as exc:  # a bug in deciding must not kill the node: every unanswered request gets one error
            self.failures.report("decide_failed", "the exit decision", [req.req_id for req in order], exc)
            for req in order:
                if not req.answered:
                    self._fail(req, "internal", f"node {nid}: deciding failed: {type(exc).__name__}: {exc}")

    def _fail(self, req: Request, code: str, message: str) -> None:
        req.answered = True
        self.out.error(req, code, message)

    def _run_stages(
        self, batch: list[Request]
    ) -> tuple[np.ndarray, dict[str, np.ndarray], list[Request], BatchDecision, dict[int, np.ndarray] | None]:
        """Run the batch stage by stage; requests entering later join at their stage.

        Returns (logits at the node's exit, carry, the requests in sample order,
        the exit decision that saw every stage's logits, and when a request wants logits every stage's)."""
        cfg = self.cfg
        decision = self.policy.batch(cfg.node_id, cfg.exit, cfg.parent is None)
        if len(batch) == 1:  # one request: its own feeds, no concatenation
            k, req = batch[0].stage, batch[0]
            seen: dict[int, np.ndarray] | None = {} if req.want_logits else None  # every stage's, when asked
            decision.join([req.feeds], [req.n])
            names = self.input_names[k]  # the feeds, less the policy's state if the request carries one
            out = self.stages[k].run(req.feeds if len(req.feeds) == len(names) else {nm: req.feeds[nm] for nm in names})
            decision.stage(k, out[LOGITS])
            while k < cfg.exit:
                if seen is not None:
                    seen[k] = out[LOGITS]
                k += 1
                out = self.stages[k].run({nm: out[nm] for nm in self.input_names[k]})
                decision.stage(k, out[LOGITS])
            return out[LOGITS], {nm: out[nm] for nm in self.carry_names}, batch, decision, seen
        order: list[Request] = []
        feeds: dict[str, np.ndarray] | None = None
        seen = {} if any(req.want_logits for req in batch) else None
        out = {}
        for k in range(min(req.stage for req in batch), cfg.exit + 1):
            joining = [req for req in batch if req.stage == k]
            parts = ([feeds] if feeds is not None else []) + [req.feeds for req in joining]
            if not parts:
                continue
            order.extend(joining)
            decision.join([req.feeds for req in joining], [req.n for req in joining])
            run_feeds = {
                nm: (parts[0][nm] if len(parts) == 1 else np.concatenate([p[nm] for p in parts]))
                for nm in self.input_names[k]
            }
            out = self.stages[k].run(run_feeds)
            decision.stage(k, out[LOGITS])
            if seen is not None:
                seen[k] = out[LOGITS]
            feeds = out
        return out[LOGITS], {nm: out[nm] for nm in self.carry_names}, order, decision, seen

    # ------------------------------------------------------------ deciding

    def _decide(
        self, order: list[Request], logits: np.ndarray, carry: dict, decision: BatchDecision, seen: dict | None
    ) -> None:
        root = self.cfg.parent is None
        over = nonfinite_rows({LOGITS: logits, **carry}, len(logits))  # finite input that overflowed in the network
        keep = None
        if over is not None and self.cfg.nonfinite == "refuse":
            keep, refused = overflowed([req.n for req in order], over, self.cfg.node_id)
            for i, text in refused.items():  # nothing of these requests is served or forwarded
                self._fail(order[i], "bad_input", text)
            if not keep.any():
                return
            order = [req for req in order if not req.answered]
            logits, carry, over = logits[keep], {k: v[keep] for k, v in carry.items()}, None
        verdict = decision.verdict(logits, keep)
        serve, cls, conf = verdict.serve, verdict.cls, verdict.conf
        lg = None if seen is None else exit_logits(logits, seen, verdict.exit_at, keep)  # only when asked for
        if verdict.state:
            carry = {**carry, **verdict.state}
        n = len(cls)
        exit_at, flags = self._constants(n)  # read-only; copied before a flag is set
        if verdict.exit_at is not None:
            exit_at = verdict.exit_at
        bad = over  # nonfinite="flag": non-finite input or outputs are answered here, never forwarded
        if any(req.bad is not None for req in order):
            given = np.concatenate([req.bad if req.bad is not None else np.zeros(req.n, bool) for req in order])
            bad = given if bad is None else bad | given
        if bad is not None:
            serve = None if serve is None else serve | bad
            cls, conf = np.where(bad, -1, cls), np.where(bad, np.float32(np.nan), conf)
            flags = np.where(bad, np.uint8(P.FLAG_NONFINITE), flags)
            if lg is not None:
                lg = np.where(bad[:, None], np.float32(np.nan), lg)
            self.counters["nonfinite"] += int(np.count_nonzero(bad))
        wanted = 0
        if not root:  # what goes up, as far as the parent and the cap allow
            assert serve is not None  # the policy decided; only the root decides nothing
            serve, flags, wanted = self._upward(serve, flags, n)
        if verdict.exit_at is not None:  # answered before this node's exit (cis_samples_total{exit})
            self.served_early += np.bincount(exit_at, minlength=self.cfg.exit + 1)[: self.cfg.exit]
        self.counters["served"] += n - wanted
        if wanted == n:  # all of it goes up (the confidence kept as float64 until a fallback needs it)
            self._forward_and_answer(order, None, cls, conf, exit_at, flags, carry, lg)
        elif not wanted:
            self._answer_all(order, cls, conf.astype(np.float32, copy=False), exit_at, flags, lg)
        else:
            self._forward_and_answer(order, serve, cls, conf.astype(np.float32, copy=False), exit_at, flags, carry, lg)

    def _upward(self, serve: np.ndarray, flags: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(serve, flags, samples to forward) once the controller, the parent's state and the transfer cap
        have had their say on the policy's ``serve``."""
        wanted = (0 if serve[0] else 1) if n == 1 else n - int(np.add.reduce(serve))
        if self.controller is not None:
            self.controller.update(wanted, n)
            self.policy.thresholds[self.cfg.node_id] = self.controller.threshold
        if wanted and not self.out.parent_up:
            flags = np.where(serve, flags, np.uint8(P.FLAG_DEGRADED))
            self.counters["degraded"] += wanted
            wanted = 0
        elif wanted:
            granted = self.bucket.grant(time.monotonic(), wanted)
            if granted < wanted:  # the first ``granted`` of them go up; the rest are served here, capped
                over = np.flatnonzero(~serve)[granted:]
                flags, serve = flags.copy(), serve.copy()
                flags[over], serve[over] = P.FLAG_CAPPED, True
                self.counters["capped"] += wanted - granted
                wanted = granted
        return serve, flags, wanted

    def _constants(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """This node's exit and zero flags for n samples (read-only; cached up to max_batch)."""
        got = self._const.get(n)
        if got is None:
            got = (np.full(n, self.cfg.exit, np.int32), np.zeros(n, np.uint8))
            for a in got:
                a.flags.writeable = False
            if n <= self.cfg.max_batch:
                self._const[n] = got
        return got

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
        if serve is None:
            parts: list[tuple[Request, np.ndarray | None]] = [(req, None) for req in order]
            pending = Pending(parts, cls, conf, lg)
        else:
            here: list[tuple[Request, int, np.ndarray | None]] = []
            parts, start = [], 0
            for req in order:
                end = start + req.n
                up = np.flatnonzero(~serve[start:end])
                if len(up) == req.n:
                    parts.append((req, None))
                elif len(up):
                    parts.append((req, up))
                    here.append((req, start, np.flatnonzero(serve[start:end])))
                else:
                    here.append((req, start, None))
                start = end
            fwd = np.flatnonzero(~serve)
            wants = lg is not None and any(req.want_logits for req, _ in parts)
            pending = Pending(parts, cls[fwd], conf[fwd], lg[fwd] if wants else None)
            carry = {k: v[fwd] for k, v in carry.items()}
        if self.out.forward(pending, carry):
            self.counters["forwarded"] += pending.n
        else:
            if self.tracer is not None:  # it never left: no forward span
                tracing.unsent(pending.parts)
            self.counters["degraded"] += pending.n
            self.counters["served"] += pending.n
            self.fallback(pending, count=False)
        if serve is None:
            return
        nid = self.cfg.node_id
        for req, s, idx in here:
            if req.answered:
                continue
            if idx is None:
                e = s + req.n
                self._fill(req, None, cls[s:e], conf[s:e], exit_at[s:e], flags[s:e], nid, _rows(lg, slice(s, e)))
            else:
                src = idx + s
                self._fill(req, idx, cls[src], conf[src], exit_at[src], flags[src], nid, _rows(lg, src))

    def _fill(
        self, req: Request, idx: np.ndarray | None, cls, conf, ex, flags, served_by: str | Sequence[str], lg=None
    ) -> None:
        """Answer samples ``idx`` of ``req`` (:meth:`Request.fill`); reply once the request is complete."""
        if req.fill(idx, cls, conf, ex, flags, served_by, lg):
            req.answered = True
            self.out.reply(req)

    def from_parent(self, pending: Pending, msg: P.Message) -> None:
        """The parent's reply to a forward: a result of its samples (with the parent's logits when they were
        asked for) fills them; anything else (an error) serves them here (:meth:`fallback`)."""
        h = msg.head
        if not isinstance(h, P.ResultHeader) or len(h.served_by) != pending.n:
            return self.fallback(pending)
        lg = None if pending.logits is None else parent_logits(msg.tensors, pending.logits.shape)
        whole = len(pending.parts) == 1 and pending.parts[0][1] is None
        if whole and (h.names == P.RESULT_NAMES or h.names[:4] == P.RESULT_NAMES):  # the four first, in order
            f = msg.frames  # one whole request: the parent's answer goes on as it is
            return self.scatter(pending, f[0], f[1], f[2], f[3], h.served_by, lg)
        t = msg.tensors
        self.scatter(pending, t["class"], t["confidence"], t["exit"], t["flags"], h.served_by, lg)

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
                rows = _rows(logits, slice(off, end))
                self._fill(req, idx, cls[off:end], conf[off:end], ex[off:end], flags[off:end], served_by[off:end], rows)
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


def _rows(lg: np.ndarray | None, at: Any) -> np.ndarray | None:
    return None if lg is None else lg[at]
