"""A machine's cores shared by the nodes it hosts (the spec's ``[hosts]``): processor sharing, and the cores of
one machine slowing each other (``interference``).

Each node runs its batches on one core at a time (one onnxruntime thread per
stage, one process per node). Nodes that share a host of C cores share them as
the operating system's scheduler does, in time slices far shorter than a batch:
while k batches run on the host, each advances at ``min(1, C / k)`` seconds of
work per second (processor sharing). A batch alone on the host runs at full
speed; two on one core take twice as long each. A node without a host has a
core of its own.

The cores of one machine are not independent: they share its caches, its
memory and, on a virtual machine, the physical cores under them. While m
*other* cores of the machine run batches, every batch advances
``1 + interference * m`` times slower (twin_spans: on the 2-core development
VM the cloud's batches ran 0.10-0.18 s longer per second that a device's batch
ran beside them on the other core). ``interference`` 0 (the default) keeps the
cores independent.

:meth:`Machine.run` returns an event that fires when ``work`` seconds of a core
have been done for that batch. Every arrival or departure recomputes when the
next batch finishes (a timer that a later change makes stale is ignored).
"""

from __future__ import annotations

import simpy

DONE = 1e-9  # seconds of work left that count as finished (float rounding of the clock)
OWN = None  # the host of a node with a core of its own


class Machine:
    """The batches running on one machine: its hosts' cores shared in processor sharing, every batch slowed by
    ``interference`` per other busy core."""

    def __init__(self, env: simpy.Environment, hosts: dict[str, int] | None = None, interference: float = 0.0):
        self.env, self.hosts, self.interference = env, dict(hosts or {}), interference
        self.left: dict[simpy.Event, float] = {}  # each running batch's work still to do (core seconds)
        self.on: dict[simpy.Event, str | None] = {}  # each running batch's host (OWN: a core of its own)
        self.running: dict[str | None, int] = {}  # batches running per host
        self.since = 0.0  # when ``left`` was last brought up to date
        self.turn = 0  # the scheduled finish that is current (older timers are stale)
        self.host_busy: dict[str | None, float] = {h: 0.0 for h in self.hosts}  # core seconds done per host

    def busy_cores(self) -> float:
        """Cores of the machine running a batch now."""
        return sum(k if h is OWN else min(k, self.hosts[h]) for h, k in self.running.items())

    def rate(self, host: str | None = OWN) -> float:
        """Seconds of work per second a batch running on ``host`` gets now."""
        k = self.running.get(host, 0)
        share = 1.0 if host is OWN or k == 0 else min(1.0, self.hosts[host] / k)
        if self.interference and self.left:
            share /= 1.0 + self.interference * max(0.0, self.busy_cores() - 1.0)
        return share

    def run(self, work: float, host: str | None = OWN) -> simpy.Event:
        """An event that fires when ``work`` core seconds have been done for this batch on ``host``."""
        self._advance()
        event = self.env.event()
        self.left[event], self.on[event] = work, host
        self.running[host] = self.running.get(host, 0) + 1
        self._schedule()
        return event

    def _advance(self) -> None:
        now = self.env.now
        if self.left:
            rates = {h: self.rate(h) for h in self.running}
            for event, host in self.on.items():
                done = (now - self.since) * rates[host]
                self.left[event] -= done
                if host in self.host_busy:
                    self.host_busy[host] += done
        self.since = now

    def _schedule(self) -> None:
        self.turn += 1
        if not self.left:
            return
        turn = self.turn
        first = min(max(0.0, w) / self.rate(self.on[e]) for e, w in self.left.items())
        timer = self.env.timeout(first)
        timer.callbacks.append(lambda _: self._finish(turn))

    def _finish(self, turn: int) -> None:
        if turn != self.turn:  # a batch came or went since this timer was set
            return
        self._advance()
        for event in [e for e, w in self.left.items() if w <= DONE]:
            del self.left[event]
            host = self.on.pop(event)
            self.running[host] -= 1
            if not self.running[host]:
                del self.running[host]
            event.succeed()
        self._schedule()


class Cores(Machine):
    """One host of ``cores`` cores shared, in processor sharing, by the batches that run on it."""

    HOST = "host"

    def __init__(self, env: simpy.Environment, cores: int):
        super().__init__(env, {self.HOST: cores})
        self.cores = cores

    def run(self, work: float, host: str | None = HOST) -> simpy.Event:
        return super().run(work, host)

    @property
    def busy(self) -> float:
        """Core seconds done on the host."""
        return self.host_busy[self.HOST]
