"""One node of the model: its queue, its workers that run micro-batches, its exit decision and counters.

A request joins the node's FIFO queue (or is refused when ``queue_limit``
requests already wait; ``queue_limit`` x replicas for a node with replicas).
Each of the node's ``workers`` (``workers`` x ``replicas``: a node with replicas is
that many servers, docs/simulator.md *Replicas*) takes, whenever it is
free, every waiting request up to ``max_batch`` and runs them as one batch, as
the runtime's node does (``cis serve --max-batch``, ``--max-wait 0``): stage k
runs once on all the requests of the batch that need it, so a batch takes
``sum_k T_k(n_k) / speed``, where n_k is how many of its requests run stage k
and T_k(n) the stage's time on a batch of n (the latency profile, interpolated
between its batch sizes), drawn once per batch with the run's service
distribution (a measured spread of single calls shrinks over a batch as
sqrt(T(1) / T(n)): what goes fast and slow during one long batch averages
out); plus ``overhead`` per request (the node's work per message: decode,
admit) and ``batch_overhead`` per batch (what a runtime batch costs beyond its
stage calls), and ``message_work`` per message that reaches the node while
one of its batches runs (its core receives and reads the message beside the
batch, which runs that much longer). A worker that idled before a batch takes longer over it
(``slowdown``: the idle time's extra seconds; a process that slept must be
woken, and a machine's caches and clock go cold while a core sleeps). A node
on a shared host runs its batches on the host's cores, shared with the other
nodes there; with ``interference`` every batch runs slower while other cores of
the machine run batches (``cores``: :class:`cis.sim.cores.Machine`).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterator

import simpy

from cis.core.policy.transfer_cap import TokenBucket
from cis.core.spec import Node
from cis.sim.cores import Machine
from cis.sim.links import Uplink


class Station:
    """One node: its workers and queue, its exit policy and transfer cap, and what it counted."""

    def __init__(
        self,
        env: simpy.Environment,
        node: Node,
        index: int,
        tables: list[list[float]],
        units: Iterator[float],
        keeps: Callable[[int], bool],
        bucket: TokenBucket,
        overhead: float = 0.0,
        max_batch: int = 1,
        slowdown: Callable[[float], float] | None = None,
        cores: Machine | None = None,
        batch_overhead: Callable[[float], float] | None = None,
        per_call_spread: bool = False,
        message_work: float = 0.0,
    ):
        self.env = env
        self.id, self.index, self.exit = node.id, index, node.exit
        self.limit = None if node.queue_limit is None else node.queue_limit * node.replicas  # each replica's
        self.tables = tables  # stage k -> seconds of a batch of n (index n), at this node's speed
        self.means = {done: sum(t[1] for t in tables[done:]) for done in range(node.exit)}  # batch of one
        self.units = units
        # the multipliers are measured single calls' (service_spread): a batch of n is n calls' work, and
        # independent slow and fast moments average out over it, so its spread shrinks as sqrt(1 / length)
        self.per_call_spread = per_call_spread
        self.overhead = overhead  # node work per request beyond the stages (the runtime's messaging)
        # node work per batch beyond the stages, by how long the node idled before it (decision, replies, cold caches)
        self.batch_overhead = batch_overhead
        self.max_batch = max_batch
        self.message_work = message_work  # seconds of the node's core per message that comes during a batch
        self.came_busy = 0  # messages that came while a batch ran, not yet paid for
        self.running = 0  # workers running a batch now
        self.slowdown = slowdown  # idle seconds -> extra seconds of the batch that ends the idling
        self.keeps, self.bucket = keeps, bucket
        self.cores = cores  # the machine whose cores it runs on (None: a core of its own, unaffected by others)
        self.host = node.host
        self.parent: Station | None = None
        self.uplink: Uplink | None = None
        self.tiers_above = 0
        self.last_reply = -1e300  # when the parent last answered a forward (it counts as a heartbeat)
        self.queue: collections.deque[tuple[simpy.Event, int, float]] = collections.deque()
        self.idle: list[simpy.Event] = []
        # With spans: when each waiting request was admitted, as the runtime's node stamps it. The node reads
        # its socket between batches and stamps what it reads after a batch with the time it last found the
        # socket empty: just before that batch started. A request that comes during a batch is admitted then.
        self.admitted: dict[simpy.Event, float] | None = None
        self.started_at = 0.0  # when the batch now running started
        self.received = self.served = self.forwarded = self.capped = self.dropped = 0
        self.refused = self.degraded = self.batches = 0
        self.busy = self.waited = 0.0
        self.max_queue = 0
        self.servers = node.workers * node.replicas  # a node with replicas: each replica's workers serve its queue
        for _ in range(self.servers):
            env.process(self._worker())

    def full(self) -> bool:
        return self.limit is not None and len(self.queue) >= self.limit

    def visit(self, done: int) -> simpy.Event:
        """Queue a request that has run stages 1..done; the event fires when its batch has run, with the value
        (when the batch started, when its stages started, how many requests it ran)."""
        event = self.env.event()
        self.queue.append((event, done, self.env.now))
        if self.idle:
            self.idle.pop().succeed()
        else:
            self.came_busy += self.running > 0
            if self.admitted is not None:
                self.admitted[event] = self.started_at
            if len(self.queue) > self.max_queue:
                self.max_queue = len(self.queue)
        return event

    def batch_time(self, dones: list[int]) -> float:
        """Seconds of stage work for a batch whose requests have run stages 1..done each."""
        if len(dones) == 1:
            return self.means[dones[0]]
        counts = collections.Counter(dones)
        total, joined = 0.0, 0
        for k in range(min(dones), self.exit):  # stage k + 1 runs on every request with done <= k
            joined += counts.get(k, 0)
            total += self.tables[k][joined]
        return total

    def _worker(self):
        env, queue = self.env, self.queue
        idle_from = None
        while True:
            cold = idled = 0.0
            if not queue:  # also when woken after another server took what was waiting: wait again
                idle_from = env.now if idle_from is None else idle_from
                wake = env.event()
                self.idle.append(wake)
                yield wake
                if not queue:
                    continue
                idled = env.now - idle_from
                if self.slowdown is not None:
                    cold = self.slowdown(idled)
            idle_from = None
            if self.batch_overhead is not None:
                cold += self.batch_overhead(idled)
            batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
            now = env.now
            self.waited += sum(now - t for _, _, t in batch)
            dones = [done for _, done, _ in batch]
            stages = self.batch_time(dones)
            unit = next(self.units)
            if self.per_call_spread and len(batch) > 1 and stages > 0:
                unit = 1.0 + (unit - 1.0) * math.sqrt(self.means[min(dones)] / stages)
            reading = self.overhead * len(batch)
            service = stages * unit + cold + reading
            self.busy += service
            self.batches += 1
            self.started_at = now
            self.running += 1
            yield env.timeout(service) if self.cores is None else self.cores.run(service, self.host)
            while self.message_work and self.came_busy:  # the messages that came meanwhile took the core too
                extra, self.came_busy = self.message_work * self.came_busy, 0
                self.busy += extra
                yield env.timeout(extra) if self.cores is None else self.cores.run(extra, self.host)
            self.running -= 1
            # (batch start, its stages' start: the node's work per message comes first, batch size)
            ran = (now, now + reading, len(batch))
            for event, _, _ in batch:
                event.succeed(ran)

    def parent_up(self, listened: float, timeout: float) -> bool:
        """The runtime's heartbeat rule (:meth:`Uplink.up_at`) as of ``listened``, when the node last read its
        sockets: the start of the batch it decides after (a batch's own length is not the parent's silence)."""
        return self.uplink is None or self.uplink.up_at(listened, self.last_reply, timeout)

    def take_token(self, now: float) -> bool:
        """The transfer cap: a token lets the request go, else it is served here (capped)."""
        if self.bucket.take(now):
            return True
        self.capped += 1
        return False
