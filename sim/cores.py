"""A machine's cores shared by the nodes it hosts (the spec's ``[hosts]``): processor sharing.

Each node runs its batches on one core at a time (one onnxruntime thread per
stage, one process per node). Nodes that share a host of C cores share them as
the operating system's scheduler does, in time slices far shorter than a batch:
while k batches run on the host, each advances at ``min(1, C / k)`` seconds of
work per second (processor sharing). A batch alone on the host runs at full
speed; two on one core take twice as long each.

:meth:`Cores.run` returns an event that fires when ``work`` seconds of a core
have been done for that batch. Every arrival or departure recomputes when the
next batch finishes (a timer that a later change makes stale is ignored).
"""

from __future__ import annotations

import simpy

DONE = 1e-9  # seconds of work left that count as finished (float rounding of the clock)


class Cores:
    """``cores`` cores shared, in processor sharing, by the batches that run on them."""

    def __init__(self, env: simpy.Environment, cores: int):
        self.env, self.cores = env, cores
        self.left: dict[simpy.Event, float] = {}  # each running batch's work still to do (core seconds)
        self.since = 0.0  # when ``left`` was last brought up to date
        self.turn = 0  # the scheduled finish that is current (older timers are stale)
        self.busy = 0.0  # core seconds done

    def rate(self) -> float:
        """Seconds of work per second each running batch gets."""
        return min(1.0, self.cores / len(self.left)) if self.left else 1.0

    def run(self, work: float) -> simpy.Event:
        """An event that fires when ``work`` core seconds have been done for this batch."""
        self._advance()
        event = self.env.event()
        self.left[event] = work
        self._schedule()
        return event

    def _advance(self) -> None:
        now = self.env.now
        if self.left:
            done = (now - self.since) * self.rate()
            for event in self.left:
                self.left[event] -= done
            self.busy += done * len(self.left)
        self.since = now

    def _schedule(self) -> None:
        self.turn += 1
        if not self.left:
            return
        turn, first = self.turn, min(self.left.values())
        timer = self.env.timeout(max(0.0, first) / self.rate())
        timer.callbacks.append(lambda _: self._finish(turn))

    def _finish(self, turn: int) -> None:
        if turn != self.turn:  # a batch came or went since this timer was set
            return
        self._advance()
        for event in [e for e, w in self.left.items() if w <= DONE]:
            del self.left[event]
            event.succeed()
        self._schedule()
