"""A client's entry nodes: one DEALER per address, which of them are connected, where each request went, and the
one retry of a request whose entry node died (docs/runtime.md, *Clients*).

The story of a request here:

1. :meth:`Entries.send` sends it to the connected entry node with the fewest requests in flight (ties in turn:
   :func:`cis.runtime.upstream.least_outstanding`); with one address, there;
2. it is retried **once, with the same id**, when its entry node died: the node's connection closed while the
   request was in flight (a socket monitor says so at once), it was refused (``shutting_down``: retried only
   where another entry node is connected, else that error is the answer), or no reply came within
   ``retry_after`` seconds (a node that hangs, or a link that dropped). The retry goes to another entry node
   that is connected, else to the same address, where ZeroMQ holds it until the node is back (restarted:
   ``cis serve --all`` restarts a node at once). A node that gets the same id twice over one
   connection answers once (:mod:`cis.runtime.seen`), so a retry of a request that was only slow costs nothing
   there; elsewhere the first answer wins and the other is dropped.

Without retries (``retry_after`` None or 0) nothing is kept and no monitor runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from cis.runtime import protocol as P
from cis.runtime.addresses import connect
from cis.runtime.client_checks import check_connection_options
from cis.runtime.security import CurveConfig, secure_client
from cis.runtime.upstream import least_outstanding
from cis.runtime.wire import RETRY_AFTER, RETRY_CODES

__all__ = ["RETRY_AFTER", "RETRY_CODES", "Entries"]
_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


@dataclass
class Try:
    frames: list  # the request as sent, kept for its retry
    sock: int  # the entry node it went to last
    sent: float  # time.perf_counter() of that send
    retried: bool = False


class Entries:
    def __init__(
        self, ctx: zmq.Context, addresses: Sequence[str], curve: CurveConfig | None, retry_after: float | None
    ):
        check_connection_options(curve, retry_after)
        self.addresses = list(addresses)
        self.retry_after = retry_after or 0.0
        self.socks = [self._socket(ctx, a, curve) for a in self.addresses]
        self.monitors: dict[zmq.Socket, int] = {}  # opened at the first request (a status probe needs none)
        self.up = [True] * len(self.socks)  # connected, as far as the monitors said (nothing said yet: assumed)
        self.load = [0] * len(self.socks)  # requests in flight per entry node
        self.tries: dict[int, Try] = {}  # request id -> where it went (its frames too, when retries are on)
        self.turn = 0
        self.retries = 0

    @staticmethod
    def _socket(ctx: zmq.Context, address: str, curve: CurveConfig | None) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = sock.rcvhwm = 100000
        if curve is not None and curve.enabled:
            secure_client(sock, curve)
        connect(sock, address)  # '127.0.0.1:5555', 'http://...', port 99999: one line, not a traceback
        return sock

    def watch(self) -> list[zmq.Socket]:
        """The sockets to poll besides the DEALERs: one monitor each, opened now when retries are on."""
        if self.retry_after and not self.monitors:
            self.monitors = {s.get_monitor_socket(_EVENTS): i for i, s in enumerate(self.socks)}
        return list(self.monitors)

    def send(self, rid: int, frames: list) -> None:
        i = 0 if len(self.socks) == 1 else least_outstanding(self.load, self.up, self.turn)
        if i is None:  # none connected: the one with the least in flight holds it until it is back
            i = min(range(len(self.load)), key=self.load.__getitem__)
        self.turn = (i + 1) % len(self.socks)
        P.send(self.socks[i], frames)
        if self.retry_after or len(self.socks) > 1:
            self.tries[rid] = Try(frames if self.retry_after else [], i, time.perf_counter())
            self.load[i] += 1

    def done(self, rid: int) -> None:
        """The request is answered (or given up): forget it."""
        t = self.tries.pop(rid, None)
        if t is not None:
            self.load[t.sock] -= 1

    def retry(self, rid: int, lost: bool = True) -> bool:
        """Send request ``rid`` again, once: to another connected entry node, else (``lost``: it died with the
        request) to the same, which holds it until the node is back. False when it was retried already, or
        when it is not ``lost`` and no other node is connected (it waits where it is)."""
        t = self.tries.get(rid)
        if t is None or t.retried or not self.retry_after:
            return False
        others = [u and k != t.sock for k, u in enumerate(self.up)]
        j = least_outstanding(self.load, others, self.turn)
        if j is None and not lost:
            return False
        j = t.sock if j is None else j
        try:  # never blocks: a DEALER whose connection failed (e.g. a CURVE handshake refused) has no pipe
            P.send(self.socks[j], t.frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False  # not sent: the request's own timeout ends it
        self.load[t.sock] -= 1
        self.load[j] += 1
        t.sock, t.sent, t.retried = j, time.perf_counter(), True
        self.retries += 1
        return True

    def on_monitor(self, mon: zmq.Socket) -> None:
        """A connection event: connected, or closed (every request in flight there is retried), or refused
        while reconnecting (its requests go elsewhere if another node is connected)."""
        i = self.monitors[mon]
        while True:
            try:
                ev = recv_monitor_message(mon, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            self.up[i] = ev == zmq.EVENT_CONNECTED
            if ev != zmq.EVENT_CONNECTED:
                lost = ev == zmq.EVENT_DISCONNECTED
                for rid in [r for r, t in self.tries.items() if t.sock == i and not t.retried]:
                    self.retry(rid, lost)

    def due(self) -> None:
        """Retry the requests without a reply for ``retry_after`` seconds (oldest first; sent in id order)."""
        if not self.retry_after:
            return
        late, due = time.perf_counter() - self.retry_after, []
        for rid, t in self.tries.items():
            if t.retried:
                continue
            if t.sent > late:
                break
            due.append(rid)
        for rid in due:
            self.retry(rid)

    def close(self) -> None:
        for s in self.socks:
            if self.monitors:
                s.disable_monitor()
            s.close(0)
        for m in self.monitors:
            m.close(0)
