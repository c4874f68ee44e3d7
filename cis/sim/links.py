"""The link between a child and its parent: two wires, a propagation latency, outages.

A **wire** is one direction: a FIFO server at ``bandwidth`` bytes/s. With a
``burst`` (bytes) it is a token bucket as ``tc tbf`` shapes a link: the bucket
fills at the rate up to ``burst`` while the wire idles, and a message takes
``max(0, bytes - tokens) / rate`` once the wire is free (burst 0: ``bytes / rate``).
A message's service time is known when it joins, so when its last byte leaves
follows from Lindley's recursion; one timeout covers queueing and transmission.

What is on the wire (:func:`wire_bytes`): ``payload`` counts the carry alone;
``tcp`` counts the runtime's message (header and tensor frames, ZeroMQ's frame
prefixes) cut into TCP segments, each with its Ethernet, IPv4 and TCP header.

An **outage** (a ``down`` fault until the next ``up``) loses everything sent
in either direction. TCP does not notice it: the first unanswered segment is
sent again after the retransmission timeout, which doubles after each try
(Linux: 200 ms at first). So the connection carries data again at the first
retransmission after the link is back (:meth:`Outage.recovered`), not when it
comes back: on the child's side from its first send into the outage (a
heartbeat, at the latest one heartbeat after it began, or a forward), on the
parent's side from the first reply it sent into it (if any). Until then the
link is *dead*.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

MSS = 1448  # TCP payload per segment: a 1500-byte MTU less IPv4 (20), TCP (20) and its timestamp option (12)
SEGMENT_OVERHEAD = 66  # bytes per segment on the wire: Ethernet (14), IPv4 (20), TCP with timestamps (32)
RTO_MAX = 120.0  # Linux TCP_RTO_MAX: the retransmission timeout stops doubling here


def wire_bytes(message: int) -> int:
    """Bytes a ``message`` of that many bytes puts on an Ethernet link over TCP/IPv4."""
    return message + math.ceil(message / MSS) * SEGMENT_OVERHEAD


class Wire:
    """One direction of a link: FIFO at ``rate`` bytes/s (changing at scheduled times), a ``burst``-byte bucket."""

    def __init__(self, rate: float, burst: float = 0.0):
        self.changes: list[tuple[float, float]] = [(0.0, rate)]  # (from time, bytes/s), in time order
        self.burst = burst
        self.tokens = burst  # at ``free_at``
        self.free_at = 0.0
        self.busy = 0.0
        self.sent = 0

    def set_rate(self, at: float, rate: float) -> None:
        self.changes.append((at, rate))
        self.changes.sort(key=lambda c: c[0])

    def rate(self, t: float) -> float:
        i = bisect.bisect_right(self.changes, t, key=lambda c: c[0]) - 1
        return self.changes[max(i, 0)][1]

    def send(self, now: float, nbytes: float) -> float:
        """When the last byte of a message that joins at ``now`` has left (the message's rate: at its start)."""
        self.sent += 1
        start = max(now, self.free_at)
        rate = self.rate(start)
        if math.isinf(rate):
            return start
        tokens = min(self.burst, self.tokens + (start - self.free_at) * rate)
        hold = max(0.0, nbytes - tokens) / rate
        self.tokens = max(0.0, tokens - nbytes)
        self.free_at = start + hold
        self.busy += nbytes / rate
        return self.free_at


@dataclass
class Outage:
    """One partition of a link: from ``start`` until ``end`` (inf: never healed)."""

    start: float
    end: float = math.inf
    child_first: float | None = None  # the child's first send into the outage
    parent_first: float | None = None  # the parent's first reply into it
    heartbeat: float = 0.2
    phase: float = 0.0  # the child's heartbeats go at phase + k * heartbeat
    rto: float = 0.2

    def first_heartbeat(self) -> float:
        k = math.ceil((self.start - self.phase) / self.heartbeat)
        return self.phase + k * self.heartbeat

    def recovered(self) -> float:
        """When the connection carries data again: each side's first retransmission at or after ``end``."""
        if math.isinf(self.end):
            return math.inf
        child = min(self.first_heartbeat(), self.child_first if self.child_first is not None else math.inf)
        sides = [child] + ([self.parent_first] if self.parent_first is not None else [])
        return max(_retransmission(first, self.end, self.rto) for first in sides)


def _retransmission(first: float, end: float, rto: float) -> float:
    """The first retry at or after ``end`` of a segment first sent at ``first`` (timeout doubling from ``rto``)."""
    t, wait = first, rto
    while t < end:
        t += wait
        wait = min(2 * wait, RTO_MAX)
    return t


@dataclass
class Uplink:
    """A child's link to its parent: ``up`` (forwards) and ``down`` (replies) wires, latency, outages."""

    up: Wire
    down: Wire
    latency: float
    heartbeat: float = 0.2
    phase: float = 0.0
    rto: float = 0.2
    outages: list[Outage] = field(default_factory=list)

    @classmethod
    def make(
        cls, bandwidth: float, latency: float, burst: float = 0.0, heartbeat: float = 0.2, phase: float = 0.0,
        rto: float = 0.2,
    ) -> Uplink:
        return cls(Wire(bandwidth, burst), Wire(bandwidth, burst), latency, heartbeat, phase, rto)

    def go_down(self, at: float) -> None:
        if not self.outages or not math.isinf(self.outages[-1].end):
            self.outages.append(Outage(at, heartbeat=self.heartbeat, phase=self.phase, rto=self.rto))

    def come_up(self, at: float) -> None:
        if self.outages and math.isinf(self.outages[-1].end):
            self.outages[-1].end = at

    def outage_at(self, t: float) -> Outage | None:
        """The outage that keeps the link dead at ``t`` (from its start until the connection recovers)."""
        for o in reversed(self.outages):
            if o.start <= t:
                return o if t < o.recovered() else None
        return None

    def _lost(self, now: float, first: str) -> bool:
        """Whether an outage loses what leaves at ``now``; the outage notes the first such loss on that side
        (``first``: child_first going up, parent_first coming down)."""
        lost = self.outage_at(now)
        if lost is not None and getattr(lost, first) is None:
            setattr(lost, first, now)
        return lost is not None

    def forward(self, now: float, nbytes: float) -> float | None:
        """When a forward sent at ``now`` reaches the parent; None when an outage loses it."""
        if self._lost(now, "child_first"):
            return None
        return self.up.send(now, nbytes) + self.latency

    def reply(self, now: float, nbytes: float) -> float | None:
        """When a reply the parent sends at ``now`` reaches the child; None when an outage loses it."""
        if self._lost(now, "parent_first"):
            return None
        if not nbytes:  # the abstract link (wire "payload"): replies travel free
            return now
        return self.down.send(now, nbytes) + self.latency

    def up_at(self, listened: float, answered: float, timeout: float) -> bool:
        """The runtime's heartbeat rule (cis.runtime.upstream): the parent is down once the first ping after its
        last answer (a pong, or ``answered``: a forward's reply) stayed unanswered for ``timeout`` seconds, as of
        when the child last looked at its sockets (``listened``). Without outages it is always up."""
        if not self.outages:
            return True
        last = max(self.heard(listened), answered)
        asked = self.phase + (math.floor((last - self.phase) / self.heartbeat) + 1) * self.heartbeat
        return listened - asked < timeout

    def heard(self, t: float) -> float:
        """When the child last heard its parent answer a heartbeat, as of ``t`` (pongs come back at once)."""
        last_beat = self.phase + math.floor((t - self.phase) / self.heartbeat) * self.heartbeat
        lost = self.outage_at(t)
        if lost is not None:  # heartbeats into the outage go unanswered
            return lost.start - ((lost.start - self.phase) % self.heartbeat)
        for o in reversed(self.outages):
            if o.start <= t:  # the heartbeats sent into it are answered when the connection recovers
                return max(last_beat, o.recovered())
        return last_beat
