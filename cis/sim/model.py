"""The SimPy model of a CIS: nodes that batch, links that carry bytes and fail, and the story of one request.

A request arrives at a node, waits for a worker (or is dropped when the queue
is full), runs the node's stages in a micro-batch (:mod:`cis.sim.station`), and is
then either served there or, when the exit policy lets it go, the parent is up
and the transfer cap has a token, sent over the uplink (:mod:`cis.sim.links`) to
the parent, where the story repeats from the next stage. The root serves
everything that reaches it; the answer travels back down the same links.
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

from cis.core.policy.exit_policy import ExitPolicy
from cis.core.policy.transfer_cap import TokenBucket
from cis.core.spec import CisSpec, Link, Node
from cis.runtime.wire import FLAG_CAPPED, FLAG_DEGRADED
from cis.sim.arrivals import deterministic, mmpp, poisson, read_trace
from cis.sim.config import SimConfig
from cis.sim.cores import Machine
from cis.sim.links import Uplink
from cis.sim.service import Profile
from cis.sim.spans import COMPUTE, FORWARD, QUEUE, REQUEST, SpanLog
from cis.sim.station import Station
from cis.sim.streams import indices, spawn, uniforms, unit_exponentials

EVENTS_PER_UPDATE = 20_000  # SimPy events between progress bar updates
LOOPBACK = Link(bandwidth=math.inf, latency=0.0)  # processes on one machine: the hop overhead is the cost


@dataclass
class Plan:
    """Everything the model needs, resolved from spec, config and bundle (see :mod:`cis.sim.simulation`)."""

    spec: CisSpec
    config: SimConfig
    stage_tables: dict[str, list[list[float]]]  # node -> stage k (from 0) -> seconds of a batch of n (index n)
    payloads: dict[int, int]  # stage after which a request leaves -> carry bytes
    messages: dict[int, int] | None = None  # stage -> bytes a forward puts on the wire (None: the payload)
    reply_bytes: int = 0  # bytes a one-sample reply puts on the wire (0: replies travel free)
    masks: dict[str, list[bool]] | None = None  # with a profile: node -> row -> keep?
    shares: dict[str, float] | None = None  # without: node -> share it keeps
    profile: Profile | None = None
    policy: ExitPolicy | None = None  # with a profile: the thresholds behind ``masks``
    rows: dict[str, list[int]] | None = None  # replay: node -> profile rows of its arrivals, in order
    exit_at: list[int] | None = None  # the exit the policy serves each profile row at (None: the node's own)

    @property
    def visit_means(self) -> dict[str, dict[int, float]]:
        """Node -> stages done on arrival -> seconds of a one-request visit."""
        return {
            nid: {done: sum(t[1] for t in tables[done:]) for done in range(len(tables))}
            for nid, tables in self.stage_tables.items()
        }


class Log:
    """One row per request, in completion order, kept as packed arrays (a million requests fit)."""

    COLUMNS = ("id", "entry", "node", "exit", "correct", "flags", "arrive", "finish")

    def __init__(self) -> None:
        self.id, self.entry, self.node = array("q"), array("i"), array("i")
        self.exit, self.correct = array("b"), array("b")  # exit 0: dropped; correct -1: unknown
        self.flags = array("B")  # the runtime's reply flags: 1 degraded, 2 capped
        self.arrive, self.finish = array("d"), array("d")

    def add(
        self, rid: int, entry: int, node: int, exit_: int, correct: int, arrive: float, finish: float, flags: int = 0
    ) -> None:
        self.id.append(rid)
        self.entry.append(entry)
        self.node.append(node)
        self.exit.append(exit_)
        self.correct.append(correct)
        self.flags.append(flags)
        self.arrive.append(arrive)
        self.finish.append(finish)

    def arrays(self) -> dict[str, np.ndarray]:
        cols = {k: np.frombuffer(getattr(self, k), dtype=getattr(self, k).typecode) for k in self.COLUMNS}
        order = np.argsort(cols["id"], kind="stable")
        return {k: v[order] for k, v in cols.items()}


@dataclass
class Model:
    """The running system: stations, the log, and when to stop arrivals."""

    env: simpy.Environment
    stations: dict[str, Station]
    machine: Machine | None  # the shared hosts' cores and the cores' interference (None: every node on its own)
    messages: dict[int, int]  # stage -> bytes of a forward on the wire
    reply_bytes: int
    correct: dict[int, list[int]] | None
    limit: float  # stop after this many arrivals
    horizon: float  # stop arrivals after this time
    hops: Iterator[float] | None = (
        None  # messaging round trip per node visit, one draw per request (None: no cost, the spec's links only)
    )
    exit_at: list[int] | None = None  # the exit the policy serves each profile row at (None: the node's own)
    forward_timeout: float = 1.0  # seconds a forward waits per tier above (the runtime's --forward-timeout)
    heartbeat_timeout: float = 1.0  # a parent unheard for this long is down (the runtime's heartbeat rule)
    spans: SpanLog | None = None  # each visit's queue, compute, forward and request spans (None: not recorded)
    entries: Iterator[float] | None = None  # the client's messaging round trip, one draw per request (None: hops')
    log: Log = field(default_factory=Log)
    arrived: int = 0
    last_arrival: float = 0.0

    def served_exit(self, row: int, node_exit: int) -> int:
        """The node's own exit, or the row's exit when the policy fixes one (a capped forward: the node's)."""
        return node_exit if self.exit_at is None else min(self.exit_at[row], node_exit)

    def outcome(self, row: int, exit_: int) -> int:
        return -1 if self.correct is None else self.correct[exit_][row]


def request(env: simpy.Environment, model: Model, rid: int, station: Station, row: int):
    """The story of one request, from its arrival at ``station`` to the node that serves (or drops) it.

    On the way up every forward is remembered with the time its node gives up
    waiting (forward_timeout x tiers above); the answer then travels back down
    the same links. A forward that a full parent refuses, that an outage loses,
    or whose answer comes back too late is served by the node that sent it, at
    its own exit, flagged degraded: what the runtime does. With ``model.spans``
    each visit's queue, compute, forward and request spans are recorded.
    """
    entry, arrived, done, flags = station.index, env.now, 0, 0
    spans = model.spans
    # one messaging cost per request, paid on every node visit: its visits happen within
    # milliseconds, under the same machine load (and cis.sim.calibration.calibrate_visits measures
    # exactly this, each request's average cost per visit)
    rtt = next(model.hops) if model.hops is not None else 0.0
    half = rtt / 2
    # the client's own messages (its request in, the answer out): the entry cost when the run has one
    outer = next(model.entries) / 2 if model.entries is not None else half
    trail: list[Hop] = []  # the nodes that forwarded it, from the entry up
    if outer:  # the client's message to the entry node: half a round trip, the reply the other half
        yield env.timeout(outer)
    while True:
        station.received += 1
        entered = env.now
        if station.full():
            if not trail:  # a client's request at a full entry node: refused (the runtime answers overloaded)
                station.dropped += 1
                model.log.add(rid, entry, station.index, 0, -1, arrived, env.now)
                return
            station.refused += 1  # the refusal goes back: the child serves the request, degraded
            hop = trail.pop()
            station, entered, first = hop.station, hop.entered, hop.first
            assert station.uplink is not None  # it forwarded: it has a parent
            back = station.uplink.reply(env.now, model.reply_bytes)
            flags = FLAG_DEGRADED
            station.degraded += 1
            back = back if back is not None and back <= hop.giveup else hop.giveup
            yield env.timeout(back - env.now + half)
            if spans is not None:
                spans.add(rid, station.index, FORWARD, hop.sent, env.now, 0, (first, station.exit))
            yield from _answer(env, model, rid, entry, arrived, station, row, flags, trail, (half, outer),
                               (entered, env.now, first))
            return
        first = done + 1  # the first stage it runs here
        waiting = station.visit(done)
        start, begin, n = yield waiting
        if spans is not None:
            assert station.admitted is not None  # recording spans: the station notes admissions
            entered = station.admitted.pop(waiting, entered)  # came during a batch: stamped with its start
            spans.add(rid, station.index, QUEUE, entered, begin, n, (first, station.exit))
            spans.add(rid, station.index, COMPUTE, begin, env.now, n, (first, station.exit))
        done = station.exit
        now = env.now
        if station.parent is None or station.keeps(row):
            break
        if not station.parent_up(now, model.heartbeat_timeout):
            station.degraded += 1
            flags = FLAG_DEGRADED
            break
        if not station.take_token(now):
            flags = FLAG_CAPPED
            break
        station.forwarded += 1
        giveup = now + model.forward_timeout * station.tiers_above
        assert station.uplink is not None  # a station with a parent has its uplink
        reach = station.uplink.forward(now, model.messages[done])
        if reach is None:  # lost in an outage: the node waits, then serves it here
            station.degraded += 1
            flags = FLAG_DEGRADED
            if spans is not None:
                spans.add(rid, station.index, FORWARD, now, giveup, 0, (first, station.exit))
            yield env.timeout(giveup - now)
            break
        trail.append(Hop(station, giveup, now, entered, first))
        yield env.timeout(reach - now + half)
        station = station.parent
    yield from _answer(env, model, rid, entry, arrived, station, row, flags, trail, (half, outer),
                       (entered, env.now, first))


class Hop:
    """A node that forwarded a request: when it gives up waiting, when it sent it, when the request came in,
    the first stage it ran there."""

    __slots__ = ("station", "giveup", "sent", "entered", "first")

    def __init__(self, station: Station, giveup: float, sent: float, entered: float, first: int):
        self.station, self.giveup, self.sent, self.entered, self.first = station, giveup, sent, entered, first


def _answer(env, model: Model, rid, entry, arrived, station: Station, row, flags, trail, halves, visit):
    """Serve at ``station`` and carry the answer down the trail to the client (``visit``: when the request
    came in at ``station``, when its answer left, the first stage it ran there; ``halves``: a forward's
    messaging on its way down, the client's)."""
    half, outer = halves
    station.served += 1
    server, t = station, env.now
    spans = model.spans
    if spans is not None:
        spans.add(rid, station.index, REQUEST, visit[0], visit[1], 0, (visit[2], station.exit))
    exit_ = server.exit if flags & FLAG_DEGRADED else model.served_exit(row, server.exit)
    for hop in reversed(trail):
        child, giveup = hop.station, hop.giveup
        back = child.uplink.reply(t, model.reply_bytes)
        if back is None or back > giveup:  # lost or too late: the child has answered it itself
            server.served -= 1
            child.served += 1
            child.degraded += 1
            server, t, flags, exit_ = child, giveup, FLAG_DEGRADED, child.exit
            came = giveup
        else:
            child.last_reply = back
            t = came = back
            came += half  # the answer's way down to the child
        if spans is not None:
            spans.add(rid, child.index, FORWARD, hop.sent, came, 0, (hop.first, child.exit))
            spans.add(rid, child.index, REQUEST, hop.entered, came, 0, (hop.first, child.exit))
        t += half
    t += outer
    if t > env.now and model.reply_bytes:  # replies share the links' wires: keep their order in time
        yield env.timeout(t - env.now)
    model.log.add(rid, entry, server.index, exit_, model.outcome(row, exit_), arrived, t, flags)


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
    max_batch = config.max_batch or 1
    machine = None
    if spec.hosts or config.interference:  # the nodes' batches share cores, or slow each other
        machine = Machine(env, {h.id: h.cores for h in spec.hosts}, config.interference)
    for index, node in enumerate(spec.nodes):
        arrival_rng, service_rng, decision_rng, row_rng = (next(rngs) for _ in range(4))
        units = _units(config, service_rng)
        station = Station(
            env,
            node,
            index,
            plan.stage_tables[node.id],
            units,
            _keeper(plan, node.id, decision_rng),
            _bucket(node, config.burst),
            config.visit_overhead,
            max_batch,
            _slowdown(config.idle_slowdown),
            machine,
            _batch_work(config.batch_overhead.get(node.id, config.batch_overhead.get("*"))),
            bool(config.service_spread),
            config.message_work,
        )
        stations[node.id] = station
        if plan.rows is not None:  # replay: this node's arrivals take these rows, in order
            rows = iter(plan.rows.get(node.id, []))
        else:
            rows = indices(row_rng, plan.profile.samples) if plan.profile is not None else itertools.repeat(-1)
        times = _times(node, config, arrival_rng, trace)
        if times is not None:
            feeds.append((station, times, rows))
    _connect(spec, config, stations)
    if config.spans:
        for st in stations.values():
            st.admitted = {}
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
    entries = None
    if config.entry_rtt:  # its own stream too
        entry_rng = spawn(config.seed, 4 * len(spec.nodes) + 4)[-1]
        entries = (config.entry_rtt[i] for i in indices(entry_rng, len(config.entry_rtt)))
    messages = plan.messages if plan.messages is not None else plan.payloads
    model = Model(
        env, stations, machine, messages, plan.reply_bytes, correct, limit, horizon, hops, plan.exit_at,
        config.forward_timeout, config.heartbeat_timeout, SpanLog() if config.spans else None, entries,
    )
    return model, feeds


def _connect(spec: CisSpec, config: SimConfig, stations: dict[str, Station]) -> None:
    """Every child's uplink (loopback: no bandwidth, no latency), its heartbeat phase and its scheduled faults."""
    phases = uniforms(spawn(config.seed, 4 * len(spec.nodes) + 3)[-1])  # its own stream: runs without faults keep
    for node in spec.nodes:
        if node.parent is None:
            continue
        link = LOOPBACK if config.loopback else node.link
        st = stations[node.id]
        st.parent, st.tiers_above = stations[node.parent], max(1, spec.depth(node.id))
        st.uplink = Uplink.make(
            link.bandwidth, link.latency, config.link_burst, heartbeat=config.heartbeat,
            phase=next(phases) * config.heartbeat, rto=config.rto,
        )
    for fault in config.faults:
        up = stations[fault.node].uplink
        assert up is not None  # cis.core.faults refuses a fault on the root's (absent) uplink
        if fault.action == "down":
            up.go_down(fault.at)
        elif fault.action == "up":
            up.come_up(fault.at)
        else:
            assert fault.value is not None  # a bandwidth change carries its rate
            up.up.set_rate(fault.at, fault.value)
            up.down.set_rate(fault.at, fault.value)


def _units(config: SimConfig, rng: np.random.Generator) -> Iterator[float]:
    """Multipliers of each batch's stage time: a measured spread, exponential draws, or 1."""
    if config.service_spread:
        spread = config.service_spread
        return (spread[i] for i in indices(rng, len(spread)))
    return unit_exponentials(rng) if config.service == "exponential" else itertools.repeat(1.0)


def _batch_work(value) -> Callable[[float], float] | None:
    """A node's work per batch by how long it idled before it: a constant, or a table (linear, flat beyond)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return lambda _idle: float(value)
    return _slowdown(tuple((float(g), float(w)) for g, w in value))


def _slowdown(table: tuple[tuple[float, float], ...]) -> Callable[[float], float] | None:
    """Idle seconds -> extra seconds of the next batch, linear between the table's points (flat beyond them)."""
    if not table:
        return None
    gaps, extra = zip(*sorted(table))
    return lambda idle: float(np.interp(idle, gaps, extra))


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
