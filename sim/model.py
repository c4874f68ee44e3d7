"""The SimPy model of a CIS: nodes with workers and queues, uplinks, and the story of one request.

A request arrives at a node, waits for a worker (or is dropped when the queue
is full), runs the node's stages, and is then either served there or, when the
exit policy lets it go and the transfer cap has a token, sent over the uplink
to the parent, where the story repeats from the next stage. The root serves
everything that reaches it.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import simpy
from simpy.core import EmptySchedule
from tqdm import tqdm

from cis.policy import ExitPolicy, TokenBucket
from cis.spec import CisSpec, Link, Node
from sim.arrivals import deterministic, mmpp, poisson, read_trace
from sim.config import SimConfig
from sim.streams import indices, spawn, uniforms, unit_exponentials
from sim.workload import Profile

EVENTS_PER_UPDATE = 20_000  # SimPy events between progress bar updates
LOOPBACK = Link(bandwidth=math.inf, latency=0.0)  # processes on one machine: the hop overhead is the cost


@dataclass
class Plan:
    """Everything the model needs, resolved from spec, config and bundle (see :mod:`sim.run`)."""

    spec: CisSpec
    config: SimConfig
    visit_means: dict[str, dict[int, float]]  # node -> stages done on arrival -> mean seconds
    payloads: dict[int, int]  # stage after which a request leaves -> bytes
    masks: dict[str, list[bool]] | None = None  # with a profile: node -> row -> keep?
    shares: dict[str, float] | None = None  # without: node -> share it keeps
    profile: Profile | None = None
    policy: ExitPolicy | None = None  # with a profile: the thresholds behind ``masks``
    rows: dict[str, list[int]] | None = None  # replay: node -> profile rows of its arrivals, in order
    exit_at: list[int] | None = None  # patience rule: the exit that serves each profile row


class Uplink:
    """A child's link to its parent: one FIFO wire at ``bandwidth``, then ``latency`` in flight.

    The wire is a single FIFO server whose service time (payload / bandwidth) is
    known when a request joins it, so when the request leaves the wire follows
    from Lindley's recursion: it starts when both it and the wire are ready.
    One timeout then covers queueing, transmission and flight: the schedule of a
    ``simpy.Resource`` of capacity 1, with a quarter of the events.
    """

    def __init__(self, link: Link):
        self.bandwidth, self.latency = link.bandwidth, link.latency
        self.free_at = 0.0  # when the wire finishes what it already holds
        self.busy = 0.0
        self.sent = 0

    def delay(self, now: float, nbytes: int) -> float:
        """Seconds from joining the wire at ``now`` until arrival at the parent."""
        hold = nbytes / self.bandwidth
        self.free_at = max(now, self.free_at) + hold
        self.busy += hold
        self.sent += 1
        return self.free_at + self.latency - now


class Station:
    """One node: its workers and queue, its exit policy and transfer cap, and what it counted."""

    def __init__(
        self,
        env: simpy.Environment,
        node: Node,
        index: int,
        means: dict[int, float],
        units: Iterator[float],
        keeps: Callable[[int], bool],
        bucket: TokenBucket,
        overhead: float = 0.0,
    ):
        self.id, self.index, self.exit = node.id, index, node.exit
        self.workers = simpy.Resource(env, capacity=node.workers)
        self.limit = node.queue_limit
        self.means, self.units = means, units
        self.overhead = overhead  # node work per visit beyond the stages (the runtime's messaging)
        self.keeps, self.bucket = keeps, bucket
        self.parent: Station | None = None
        self.uplink: Uplink | None = None
        self.received = self.served = self.forwarded = self.capped = self.dropped = 0
        self.busy = self.waited = 0.0
        self.max_queue = 0

    def full(self) -> bool:
        return self.limit is not None and len(self.workers.queue) >= self.limit

    def service_time(self, done: int) -> float:
        return self.means[done] * next(self.units) + self.overhead

    def forwards(self, row: int, now: float) -> bool:
        """The exit decision: forward when the policy lets the request go and the cap has a token."""
        if self.parent is None or self.keeps(row):
            return False
        if self.bucket.take(now):
            return True
        self.capped += 1
        return False


class Log:
    """One row per request, in completion order, kept as packed arrays (a million requests fit)."""

    def __init__(self) -> None:
        self.id, self.entry, self.node = array("q"), array("i"), array("i")
        self.exit, self.correct = array("b"), array("b")  # exit 0: dropped; correct -1: unknown
        self.arrive, self.finish = array("d"), array("d")

    def add(self, rid: int, entry: int, node: int, exit_: int, correct: int, arrive: float, finish: float) -> None:
        self.id.append(rid)
        self.entry.append(entry)
        self.node.append(node)
        self.exit.append(exit_)
        self.correct.append(correct)
        self.arrive.append(arrive)
        self.finish.append(finish)

    def arrays(self) -> dict[str, np.ndarray]:
        cols = {
            k: np.frombuffer(getattr(self, k), dtype=getattr(self, k).typecode)
            for k in ("id", "entry", "node", "exit", "correct", "arrive", "finish")
        }
        order = np.argsort(cols["id"], kind="stable")
        return {k: v[order] for k, v in cols.items()}


@dataclass
class Model:
    """The running system: stations, the log, and when to stop arrivals."""

    env: simpy.Environment
    stations: dict[str, Station]
    payloads: dict[int, int]
    correct: dict[int, list[int]] | None
    limit: float  # stop after this many arrivals
    horizon: float  # stop arrivals after this time
    hops: Iterator[float] | None = (
        None  # messaging round trip per node visit, one draw per request (None: no cost, the spec's links only)
    )
    exit_at: list[int] | None = None  # patience rule: the exit that serves each profile row (else the node's own)
    log: Log = field(default_factory=Log)
    arrived: int = 0
    last_arrival: float = 0.0

    def served_exit(self, row: int, node_exit: int) -> int:
        """The node's own exit, or under patience the row's exit (a capped forward is served at the node's)."""
        return node_exit if self.exit_at is None else min(self.exit_at[row], node_exit)

    def outcome(self, row: int, exit_: int) -> int:
        return -1 if self.correct is None else self.correct[exit_][row]


def request(env: simpy.Environment, model: Model, rid: int, station: Station, row: int):
    """The story of one request, from its arrival at ``station`` to the node that serves (or drops) it."""
    entry, arrived, done, back = station.index, env.now, 0, 0.0
    # one messaging cost per request, paid on every node visit: its visits happen within
    # milliseconds, under the same machine load (and cis.app.calibration.calibrate_visits measures
    # exactly this, each request's average cost per visit)
    rtt = next(model.hops) if model.hops is not None else 0.0
    if rtt:  # the client's message to the entry node: half a round trip, the reply the other half
        back += rtt / 2
        yield env.timeout(rtt / 2)
    while True:
        station.received += 1
        if station.full():
            station.dropped += 1
            model.log.add(rid, entry, station.index, 0, -1, arrived, env.now)
            return
        with station.workers.request() as turn:
            queued = env.now
            if not turn.triggered:
                station.max_queue = max(station.max_queue, len(station.workers.queue))
            yield turn
            station.waited += env.now - queued
            service = station.service_time(done)
            station.busy += service
            yield env.timeout(service)
        done = station.exit
        if not station.forwards(row, env.now):
            station.served += 1
            exit_ = model.served_exit(row, done)
            # the reply travels back through every node visited (the spec's links carry replies for free)
            model.log.add(rid, entry, station.index, exit_, model.outcome(row, exit_), arrived, env.now + back)
            return
        station.forwarded += 1
        assert station.uplink is not None and station.parent is not None  # only a station with a parent forwards
        delay = station.uplink.delay(env.now, model.payloads[done])
        back += rtt / 2
        delay += rtt / 2
        yield env.timeout(delay)
        station = station.parent


def source(env: simpy.Environment, model: Model, station: Station, times: Iterator[float], rows: Iterator[int]):
    """Local arrivals at one node, until the horizon or the request limit."""
    for t in times:
        if t > model.horizon:
            return
        yield env.timeout(t - env.now)
        if model.arrived >= model.limit:
            return
        row = next(rows, None)
        if row is None:  # a replay ran out of rows for this node
            return
        model.last_arrival = env.now
        env.process(request(env, model, model.arrived, station, row))
        model.arrived += 1


def build(plan: Plan) -> tuple[Model, list[tuple[Station, Iterator[float], Iterator[int]]]]:
    """Stations, uplinks and the arrival streams of every node, all seeded from the config."""
    spec, config = plan.spec, plan.config
    env = simpy.Environment()
    rngs = iter(spawn(config.seed, 4 * len(spec.nodes) + 1))
    trace = (
        read_trace(config.trace, {n.id: n.arrival_rate for n in spec.nodes}, next(rngs))
        if config.arrivals == "trace" and config.trace is not None  # SimConfig: a trace names its file
        else None
    )
    stations: dict[str, Station] = {}
    feeds = []
    for index, node in enumerate(spec.nodes):
        arrival_rng, service_rng, decision_rng, row_rng = (next(rngs) for _ in range(4))
        units = unit_exponentials(service_rng) if config.service == "exponential" else itertools.repeat(1.0)
        station = Station(
            env,
            node,
            index,
            plan.visit_means[node.id],
            units,
            _keeper(plan, node.id, decision_rng),
            _bucket(node, config.burst),
            config.visit_overhead,
        )
        stations[node.id] = station
        if plan.rows is not None:  # replay: this node's arrivals take these rows, in order
            rows = iter(plan.rows.get(node.id, []))
        else:
            rows = indices(row_rng, plan.profile.samples) if plan.profile is not None else itertools.repeat(-1)
        times = _times(node, config, arrival_rng, trace)
        if times is not None:
            feeds.append((station, times, rows))
    for node in spec.nodes:
        if node.parent is not None:
            stations[node.id].parent = stations[node.parent]
            stations[node.id].uplink = Uplink(LOOPBACK if config.loopback else node.link)
    correct = None
    if plan.profile is not None:
        correct = {e: plan.profile.correct[:, e - 1].astype(np.int8).tolist() for e in range(1, spec.num_exits + 1)}
    limit = config.requests if config.requests is not None else math.inf
    horizon = config.duration if config.duration is not None else math.inf
    hops = None
    if config.hop_rtt:  # its own stream, spawned after the others: runs without it keep their numbers
        hop_rng = spawn(config.seed, 4 * len(spec.nodes) + 2)[-1]
        hops = (
            itertools.repeat(config.hop_rtt[0])
            if len(config.hop_rtt) == 1
            else (config.hop_rtt[i] for i in indices(hop_rng, len(config.hop_rtt)))
        )
    return Model(env, stations, plan.payloads, correct, limit, horizon, hops, plan.exit_at), feeds


def _keeper(plan: Plan, node_id: str, rng: np.random.Generator) -> Callable[[int], bool]:
    """With a profile, the policy's precomputed decision per row; without, a draw against the node's share."""
    if plan.masks is not None:
        return plan.masks[node_id].__getitem__
    assert plan.shares is not None  # no profile: the plan has the shares
    share, draws = plan.shares[node_id], uniforms(rng)
    return lambda _row: next(draws) < share


def _bucket(node: Node, burst_seconds: float | None) -> TokenBucket:
    burst = None if burst_seconds is None else max(1.0, node.max_transfer_rate * burst_seconds)
    return TokenBucket(node.max_transfer_rate, burst)


def _times(
    node: Node, config: SimConfig, rng: np.random.Generator, trace: dict[str, list[float]] | None
) -> Iterator[float] | None:
    if trace is not None:
        return iter(trace[node.id]) if trace[node.id] else None
    if node.arrival_rate <= 0:
        return None
    if config.arrivals == "deterministic":
        return deterministic(node.arrival_rate)
    if config.arrivals == "mmpp":
        return mmpp(node.arrival_rate, config.mmpp_ratio, config.mmpp_dwell, rng)
    return poisson(node.arrival_rate, rng)


def run_model(plan: Plan) -> Model:
    """Build the model, run it until every request is served or dropped, and return it."""
    model, feeds = build(plan)
    env = model.env
    for station, times, rows in feeds:
        env.process(source(env, model, station, times, rows))
    if not plan.config.progress:
        env.run()
        return model
    by_requests = plan.config.requests is not None
    total = plan.config.requests if by_requests else plan.config.duration
    assert total is not None  # a request count or a duration bounds every run (SimConfig)
    with tqdm(total=total, unit="req" if by_requests else "s", desc="simulate", leave=False, disable=None) as bar:
        try:
            while True:
                for _ in range(EVENTS_PER_UPDATE):
                    env.step()
                bar.update(min(model.arrived if by_requests else env.now, total) - bar.n)
        except EmptySchedule:
            pass
    return model
