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
  forward took, with the parent's answer or with this node's own (the answering
  half, :class:`cis.runtime.answers.Answers`).

A node may hold several bundles (:mod:`cis.runtime.versions`): a request is admitted
with one (the current one, or the one its header names: a child's forward names the
bundle that made its carry, refused ``bundle_mismatch`` when the node does not hold
it) and a micro-batch holds the requests of one bundle, run by its stages and policy.

The work per batch is a fixed number of numpy calls plus a few Python operations
per *request*, never per sample; a request answered whole (all here, or all by
the parent) is answered with the batch's arrays, or the parent's, as they are.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from cis.core.bundle import ID_DIGITS
from cis.core.policy.decision import BatchDecision
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.policy.transfer_cap import TokenBucket
from cis.core.records import json_float
from cis.core.stages.contract import LOGITS
from cis.core.stages.runner import StageInputError
from cis.runtime import protocol as P
from cis.runtime import tracing
from cis.runtime.adapt import ThresholdController
from cis.runtime.answers import Answers
from cis.runtime.events import FailureLog, MismatchLog
from cis.runtime.feeds import nonfinite_rows, overflowed
from cis.runtime.node_config import NodeConfig
from cis.runtime.requests import Outbox, Request, Stage, exit_logits, flag_nonfinite
from cis.runtime.versions import Version, Versions

if TYPE_CHECKING:
    from cis.runtime.metrics_http import BatchTimings


class Executor(Answers):
    def __init__(
        self, config: NodeConfig, stages: Mapping[int, Stage], out: Outbox, counters: collections.Counter | None = None
    ):
        self.cfg = config
        policy = ExitPolicy(config.measure, {config.node_id: config.threshold}, config.patience)
        try:
            first = Version(config.bundle_sha256[:ID_DIGITS], stages, policy, config.exit, config.bundle)
        except ValueError:
            raise ValueError(f"node {config.node_id!r}: no stage {config.exit} (its exit)") from None
        first.sha256 = config.bundle_sha256
        self.versions = Versions(first)  # the bundles the node holds (cis.runtime.versions)
        self.out = out
        self.counters = counters if counters is not None else collections.Counter()
        self.bucket = TokenBucket(config.max_transfer_rate, config.transfer_burst, now=time.monotonic())
        self.controller: ThresholdController | None = None
        self.adapt_to(first)
        self.queue: collections.deque[Request] = collections.deque()
        self.queued = 0  # samples in the queue
        self.stage_ok = True  # False after a stage raised, until a stage run succeeds (health: stage_failed)
        self.served_early = np.zeros(config.exit, np.int64)  # samples the policy answered at exit e < the node's
        self._const: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.timings: BatchTimings | None = None  # queue time, compute time, batch size (set by metrics_http)
        self.tracer: tracing.Tracer | None = None  # the node's spans (cis.runtime.tracing), when it traces
        self.failures = FailureLog(config.name)  # a stage's or the decision's traceback, rate-limited
        self.mismatches = MismatchLog(config.name)  # bundle_mismatch: logged once per peer and bundle

    @property
    def stages(self) -> dict[int, Stage]:
        return self.versions.current.stages

    @property
    def policy(self) -> ExitPolicy:
        return self.versions.current.policy

    @property
    def carry_names(self) -> list[str]:
        return self.versions.current.carry_names

    def status(self) -> dict:
        """The executor's ``status`` keys: threshold (of the bundle new requests go to), queue, cap, adapt."""
        bucket, cfg = self.bucket, self.cfg
        return {
            "threshold": json_float(self.policy.thresholds[cfg.node_id]),
            "queue_depth": self.queued,
            "queue_requests": len(self.queue),
            "queue_limit": cfg.queue_limit,
            "transfer_cap": {k: json_float(getattr(bucket, k)) for k in ("rate", "burst", "tokens")},
            "adapt": self.controller.to_json() if self.controller else None,
            # what a request at stage 1 carries: cis infer sends files without a bundle
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in self.stages[1].inputs]
            if 1 in self.stages else [],
        }

    def adapt_to(self, version: Version) -> None:
        """The online threshold controller (``adapt``) of the version new requests go to, starting from its
        threshold; none without adapt, at the root or without thresholds."""
        cfg, policy = self.cfg, version.policy
        thresholded = cfg.adapt and cfg.parent and policy.thresholded
        start = policy.thresholds[cfg.node_id] if thresholded else 0.0
        self.controller = ThresholdController(cfg.adapt_target, start, gain=cfg.adapt_gain) if thresholded else None

    # ------------------------------------------------------------ admission

    def admit(self, prefix: Sequence[bytes], msg: P.Message, t0: float) -> tuple[str, str] | None:
        """Queue an INFER/FORWARD, or return (error code, message) without queueing it.

        Checked in this order: the bundle it names (a forward always names one), entry stage, tensors against
        that stage, samples against the queue limit, deadline, room in the queue, finite values."""
        h, limit = msg.head, self.cfg.queue_limit
        bid = h.bundle
        version = self.versions.current if not bid and msg.kind == P.INFER else self.versions.held.get(bid)
        if version is None:
            return self._mismatch(msg)
        if bid:
            version.named_at = t0
        stage = h.stage
        contract = version.contracts.get(stage)
        if contract is None:
            return "bad_stage", f"entry stage {stage!r}; node {self.cfg.node_id} runs stages {sorted(version.stages)}"
        problem, n = contract.check(msg.tensors)
        if problem:
            return "bad_tensor", f"stage {stage}: {problem}"
        trace = None
        # a tracestate (trace_states) without its traceparent (trace_parts) is refused there, traced or not
        if self.tracer is not None or h.traceparent or h.trace_parts or h.tracestate or h.trace_states:
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
                h.want_logits, version, h.v,
            )  # fmt: skip
        )
        version.active += 1
        self.queued += n
        self.counters["requests"] += 1
        self.counters["samples"] += n
        return None

    def _mismatch(self, msg: P.Message) -> tuple[str, str]:
        """A request naming a bundle this node does not hold: counted, logged once per peer and bundle."""
        h, held = msg.head, self.versions.ids
        self.counters["bundle_mismatch"] += 1
        peer = h.sender or ("a child" if msg.kind == P.FORWARD else "a client")
        self.mismatches.refused(msg.kind, peer, h.bundle, held)
        named = f"bundle {h.bundle}" if h.bundle else "no bundle"
        return "bundle_mismatch", (
            f"{msg.kind} names {named}; node {self.cfg.node_id} holds {', '.join(b or '(none)' for b in held)}: "
            "a carry is continued only by the bundle that made it"
        )

    def due(self, now: float, draining: bool = False) -> bool:
        """Whether a batch should run now: a full batch waits, the oldest waited max_wait, or the node drains."""
        return bool(self.queue) and (
            self.queued >= self.cfg.max_batch or now - self.queue[0].t0 >= self.cfg.max_wait or draining
        )

    def refuse_queued(self, message: str) -> None:
        """Answer every queued request ``shutting_down`` (a drain that ran out of time): none is left unanswered."""
        while self.queue:
            req = self.queue.popleft()
            self.queued -= req.n
            self._fail(req, "shutting_down", message)

    # ------------------------------------------------------------ running

    def run_batch(self) -> None:
        """Run the next micro-batch: up to max_batch samples in arrival order (a bigger request runs alone)."""
        batch: list[Request] = []
        total, wall, queue, version = 0, time.time(), self.queue, None
        while queue and (not batch or (total + queue[0].n <= self.cfg.max_batch and queue[0].version is version)):
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
            version = req.version  # a batch holds the requests of one bundle
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
            elif isinstance(exc, StageInputError):  # the request's input (e.g. a token id outside the vocabulary)
                self._fail(batch[0], "bad_input", f"node {nid}: {exc}")  # answered with the reason; the node is well
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

    def _run_stages(
        self, batch: list[Request]
    ) -> tuple[np.ndarray, dict[str, np.ndarray], list[Request], BatchDecision, dict[int, np.ndarray] | None]:
        """Run the batch stage by stage with its bundle's stages; requests entering later join at their stage.

        Returns (logits at the node's exit, carry, the requests in sample order,
        the exit decision that saw every stage's logits, and when a request wants logits every stage's)."""
        cfg, version = self.cfg, batch[0].version
        stages, inputs = version.stages, version.input_names
        decision = version.policy.batch(cfg.node_id, cfg.exit, cfg.parent is None)
        if len(batch) == 1:  # one request: its own feeds, no concatenation
            k, req = batch[0].stage, batch[0]
            seen: dict[int, np.ndarray] | None = {} if req.want_logits else None  # every stage's, when asked
            decision.join([req.feeds], [req.n])
            names = inputs[k]  # the feeds, less the policy's state if the request carries one
            out = stages[k].run(req.feeds if len(req.feeds) == len(names) else {nm: req.feeds[nm] for nm in names})
            decision.stage(k, out[LOGITS])
            while k < cfg.exit:
                if seen is not None:
                    seen[k] = out[LOGITS]
                k += 1
                out = stages[k].run({nm: out[nm] for nm in inputs[k]})
                decision.stage(k, out[LOGITS])
            return out[LOGITS], {nm: out[nm] for nm in version.carry_names}, batch, decision, seen
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
                nm: (parts[0][nm] if len(parts) == 1 else np.concatenate([p[nm] for p in parts])) for nm in inputs[k]
            }
            out = stages[k].run(run_feeds)
            decision.stage(k, out[LOGITS])
            if seen is not None:
                seen[k] = out[LOGITS]
            feeds = out
        return out[LOGITS], {nm: out[nm] for nm in version.carry_names}, order, decision, seen

    # ------------------------------------------------------------ deciding

    def _decide(
        self, order: list[Request], logits: np.ndarray, carry: dict, decision: BatchDecision, seen: dict | None
    ) -> None:
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
        lg = None if seen is None else exit_logits(logits, seen, verdict.exit_at, keep)  # only when asked for
        if verdict.state:
            carry = {**carry, **verdict.state}
        n = len(verdict.cls)
        exit_at, flags = self._constants(n)  # read-only; copied before a flag is set
        if verdict.exit_at is not None:
            exit_at = verdict.exit_at
            self.served_early += np.bincount(exit_at, minlength=self.cfg.exit + 1)[: self.cfg.exit]  # samples_total
        serve, cls, conf = verdict.serve, verdict.cls, verdict.conf
        if over is not None or any(req.bad is not None for req in order):  # nonfinite="flag": answered here
            serve, cls, conf, flags, lg, bad = flag_nonfinite(order, over, serve, cls, conf, flags, lg)
            self.counters["nonfinite"] += bad
        wanted = 0
        if self.cfg.parent is not None:  # what goes up, as far as the parent and the cap allow
            assert serve is not None  # the policy decided; only the root decides nothing
            serve, flags, wanted = self._upward(serve, flags, n, order[0].version.policy)
        self.counters["served"] += n - wanted
        if wanted == n:  # all of it goes up (the confidence kept as float64 until a fallback needs it)
            self._forward_and_answer(order, None, cls, conf, exit_at, flags, carry, lg)
        elif not wanted:
            self._answer_all(order, cls, conf.astype(np.float32, copy=False), exit_at, flags, lg)
        else:
            self._forward_and_answer(order, serve, cls, conf.astype(np.float32, copy=False), exit_at, flags, carry, lg)

    def _upward(
        self, serve: np.ndarray, flags: np.ndarray, n: int, policy: ExitPolicy
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """(serve, flags, samples to forward) once the controller, the parent's state and the transfer cap
        have had their say on the policy's ``serve``."""
        wanted = (0 if serve[0] else 1) if n == 1 else n - int(np.add.reduce(serve))
        if self.controller is not None and policy is self.policy:  # it moves the threshold of the current bundle
            self.controller.update(wanted, n)
            policy.thresholds[self.cfg.node_id] = self.controller.threshold
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
