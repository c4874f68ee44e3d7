"""The SimPy model of a CIS: nodes that batch, links that carry bytes and fail, and the story of one request.

A request arrives at a node, waits for a worker (or is dropped when the queue
is full), runs the node's stages in a micro-batch (:mod:`cis.sim.station`), and is
then either served there or, when the exit policy lets it go, the parent is up
and the transfer cap has a token, sent over the uplink (:mod:`cis.sim.links`) to
the parent, where the story repeats from the next stage. The root serves
everything that reaches it; the answer travels back down the same links.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import simpy

from cis.core.policy.exit_policy import ExitPolicy
from cis.core.spec import CisSpec, Link
from cis.runtime.wire import FLAG_CAPPED, FLAG_DEGRADED
from cis.sim.config import SimConfig
from cis.sim.cores import Machine
from cis.sim.service import Profile
from cis.sim.spans import COMPUTE, FORWARD, QUEUE, REQUEST, SpanLog
from cis.sim.station import Station

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
            yield from _refused(env, model, (rid, entry, arrived, row), station, trail, (half, outer))
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
        moved, flags = yield from _up(env, model, (rid, row), station, trail, (entered, first, start, n), half)
        if not moved:
            break
        assert station.parent is not None  # it moved up: it has a parent
        station = station.parent
    yield from _answer(env, model, rid, entry, arrived, station, row, flags, trail, (half, outer),
                       (entered, env.now, first, n))


def _up(env, model: Model, ids: tuple[int, int], station: Station, trail: list,
        visit: tuple[float, int, float, int], half: float):
    """Forward the request from ``station`` to its parent when the policy, the parent's heartbeat, the
    transfer cap and the link let it: ``(True, 0)`` once it reached the parent (the node joins the trail), or
    ``(False, flags)`` when ``station`` serves it (flagged capped or degraded, or 0: its policy keeps it).
    ``visit``: when the request came in at ``station``, the first stage it ran there, when its batch started
    (the node's last look at its sockets, as of which it judges its parent) and the batch's size."""
    rid, row = ids
    now = env.now
    if station.parent is None or station.keeps(row):
        return False, 0
    if not station.parent_up(visit[2], model.heartbeat_timeout):
        station.degraded += 1
        return False, FLAG_DEGRADED
    if not station.take_token(now):
        return False, FLAG_CAPPED
    station.forwarded += 1
    giveup = now + model.forward_timeout * station.tiers_above
    assert station.uplink is not None  # a station with a parent has its uplink
    reach = station.uplink.forward(now, model.messages[station.exit])
    if reach is None:  # lost in an outage: the node waits, then serves it here
        station.degraded += 1
        if model.spans is not None:
            model.spans.add(rid, station.index, FORWARD, now, giveup, visit[3], (visit[1], station.exit))
        yield env.timeout(giveup - now)
        return False, FLAG_DEGRADED
    trail.append(Hop(station, giveup, now, visit[0], visit[1], visit[3]))
    yield env.timeout(reach - now + half)
    return True, 0


def _refused(env, model: Model, ids: tuple[int, int, float, int], full: Station, trail: list, halves):
    """``full`` refused the forward: the refusal goes back, and the child that sent it serves the request at
    its own exit, degraded (``ids``: the request's id, entry node, arrival time and profile row)."""
    rid, entry, arrived, row = ids
    half = halves[0]
    full.refused += 1
    hop = trail.pop()
    station, entered, first = hop.station, hop.entered, hop.first
    assert station.uplink is not None  # it forwarded: it has a parent
    back = station.uplink.reply(env.now, model.reply_bytes)
    station.degraded += 1
    back = back if back is not None and back <= hop.giveup else hop.giveup
    yield env.timeout(back - env.now + half)
    if model.spans is not None:
        model.spans.add(rid, station.index, FORWARD, hop.sent, env.now, hop.batch, (first, station.exit))
    yield from _answer(env, model, rid, entry, arrived, station, row, FLAG_DEGRADED, trail, halves,
                       (entered, env.now, first, hop.batch))


class Hop:
    """A node that forwarded a request: when it gives up waiting, when it sent it, when the request came in,
    the first stage it ran there, the size of the batch it ran in there."""

    __slots__ = ("station", "giveup", "sent", "entered", "first", "batch")

    def __init__(self, station: Station, giveup: float, sent: float, entered: float, first: int, batch: int):
        self.station, self.giveup, self.sent, self.entered, self.first = station, giveup, sent, entered, first
        self.batch = batch


def _answer(env, model: Model, rid, entry, arrived, station: Station, row, flags, trail, halves, visit):
    """Serve at ``station`` and carry the answer down the trail to the client (``visit``: when the request
    came in at ``station``, when its answer left, the first stage it ran there, its batch's size; ``halves``: a
    forward's messaging on its way down, the client's)."""
    half, outer = halves
    station.served += 1
    server, t = station, env.now
    spans = model.spans
    if spans is not None:
        spans.add(rid, station.index, REQUEST, visit[0], visit[1], visit[3], (visit[2], station.exit))
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
            spans.add(rid, child.index, FORWARD, hop.sent, came, hop.batch, (hop.first, child.exit))
            spans.add(rid, child.index, REQUEST, hop.entered, came, hop.batch, (hop.first, child.exit))
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
