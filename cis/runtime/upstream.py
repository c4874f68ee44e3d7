"""A node's link to its parent: one DEALER per replica of the parent (docs/runtime.md, *Replicas*).

The story of a forward here:

1. :meth:`Upstream.send` picks the replica that is up with the fewest forwarded samples still
   unanswered (ties in turn, so equal replicas take turns) and sends the FORWARD there. Each DEALER
   sets ``ZMQ_IMMEDIATE``: a send to a replica without a connection fails at once, that replica counts
   as down from then on and the next one is tried, so a dead replica is skipped at once;
2. the forward's frames are kept until it is answered (:meth:`done`). When its replica goes down
   (a send or a heartbeat finds no connection, or no pong came for ``heartbeat_timeout``), the forward
   is sent again, as it was (same id, same deadline), to another replica that is up: a replica killed
   under load loses nothing. Where no replica is up, the forward is an orphan (:meth:`take_orphans`):
   the node serves its samples from its own exit, flagged degraded;
3. the heartbeat pings every replica every ``heartbeat`` seconds; a replica is up while it is connected
   and answered (a pong, or any reply) within ``heartbeat_timeout``. Each replica's going down and
   coming back is logged (``parent_down``, ``parent_up``, naming the replica).

With one parent address this is the single DEALER a node always had.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import zmq

from cis.core.replicas import replica_ids
from cis.runtime import events
from cis.runtime import protocol as P
from cis.runtime.addresses import connect
from cis.runtime.node_config import CurveConfig, NodeConfig
from cis.runtime.security import secure_client

_NOBLOCK = int(zmq.NOBLOCK)


class Upstream:
    """The parent's replicas as one link: pick, send, heartbeat, rescue."""

    def __init__(self, cfg: NodeConfig, now: float):
        self.cfg = cfg
        self.addresses: tuple[str, ...] = cfg.parents
        n = len(self.addresses)
        self.names = replica_ids(cfg.parent_id or "parent", n)
        self.socks: list[zmq.Socket] = []
        self.index: dict[zmq.Socket, int] = {}
        self.last_pong = [-math.inf] * n  # -inf: no answer yet, or a send found no connection since
        # silence is counted from the first ping after a replica's last answer (inf: none asked since), up to the
        # node's last look at its sockets: a node busy in a long batch, or stopped, reads no pong meanwhile and
        # sends no ping, and that is not its parent's silence (the node sets ``listened`` after each poll)
        self.asked = [math.inf] * n
        self.listened = now
        self.outstanding = [0] * n  # forwarded samples each replica has not answered yet
        self.in_flight: dict[int, tuple[int, list, int]] = {}  # forward id -> (replica, its frames, samples)
        self.orphans: list[int] = []  # forwards whose replica went down with no other up: served here
        self.turn = 0
        self.watches = [events.ParentWatch(cfg, now, name, a) for name, a in zip(self.names, self.addresses)]

    def __len__(self) -> int:
        return len(self.addresses)

    # ------------------------------------------------------------ sockets

    def open(self, ctx: zmq.Context) -> list[zmq.Socket]:
        for address in self.addresses:
            up = ctx.socket(zmq.DEALER)
            up.linger = 0
            up.immediate = True  # no queueing towards a replica that is not connected
            up.reconnect_ivl = 100
            up.reconnect_ivl_max = 250  # a restarted replica is found again within a quarter second
            up.maxmsgsize = self.cfg.max_message_bytes
            curve = self.cfg.curve
            if curve.enabled:
                secure_client(up, CurveConfig(curve.secret_file, None, curve.server_public_file or None))
            connect(up, address, f"node {self.cfg.name}: parent ")  # a bad --parent: one line
            self.index[up] = len(self.socks)
            self.socks.append(up)
        return self.socks

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)

    # ------------------------------------------------------------ state

    def is_up(self, i: int, now: float) -> bool:
        """Answered once, and not silent for ``heartbeat_timeout`` since a ping, as the node last listened."""
        return self.last_pong[i] > -math.inf and min(now, self.listened) - self.asked[i] < self.cfg.heartbeat_timeout

    def any_up(self, now: float) -> bool:
        return any(self.is_up(i, now) for i in range(len(self.addresses)))

    def answered(self, sock: zmq.Socket, now: float) -> None:
        """Any reply from a replica (a pong, a result) shows it alive; a pong after a down also says so at once."""
        i = self.index[sock]
        self.last_pong[i], self.asked[i] = now, math.inf
        if self.watches[i].up is not True:
            self.watches[i].check(True, now)

    def status(self, now: float) -> list[dict]:
        """Per replica of the parent: its name, address, whether it is up, forwarded samples unanswered."""
        return [
            {"replica": name, "address": a, "up": self.is_up(i, now), "in_flight": self.outstanding[i]}
            for i, (name, a) in enumerate(zip(self.names, self.addresses))
        ]

    # ------------------------------------------------------------ forwards

    def _pick(self, now: float) -> int | None:
        return least_outstanding(self.outstanding, [self.is_up(i, now) for i in range(len(self))], self.turn)

    def send(self, fid: int, frames: list, n: int, now: float) -> bool:
        """Send a forward to a replica that is up; False when none takes it."""
        for _ in range(len(self.addresses)):
            i = self._pick(now)
            if i is None:
                return False
            if self._send(i, frames, now):
                self.turn = (i + 1) % len(self.addresses)
                self.in_flight[fid] = (i, frames, n)
                self.outstanding[i] += n
                return True
        return False

    def done(self, fid: int) -> None:
        """The forward is answered (or given up): forget its frames."""
        got = self.in_flight.pop(fid, None)
        if got is not None:
            self.outstanding[got[0]] -= got[2]

    def _send(self, i: int, frames: list, now: float) -> bool:
        try:
            P.send(self.socks[i], frames, (), _NOBLOCK)
            return True
        except zmq.ZMQError:  # EAGAIN under ZMQ_IMMEDIATE: no connection to it, so it is down now
            self.last_pong[i] = -math.inf  # up again at its next pong
            self._down(i, now, connected=False)
            return False

    def _down(self, i: int, now: float, connected: bool) -> None:
        """Replica ``i`` is down: its forwards go to another replica, or become orphans."""
        self.watches[i].check(False, now, connected)
        for fid in [f for f, (r, _, _) in self.in_flight.items() if r == i]:
            _, frames, n = self.in_flight.pop(fid)
            self.outstanding[i] -= n
            if not self.send(fid, frames, n, now):
                self.orphans.append(fid)

    def take_orphans(self) -> list[int]:
        out, self.orphans = self.orphans, []
        return out

    # ------------------------------------------------------------ heartbeat

    def heartbeat(self, now: float, ping: Callable[[], list]) -> None:
        """Ping every replica; one without a connection, or silent for heartbeat_timeout, is down."""
        for i in range(len(self.addresses)):
            if self._send(i, ping(), now):  # a failed send marked it down already
                self.asked[i] = min(self.asked[i], now)
                if not self.is_up(i, now):
                    self._down(i, now, connected=True)


def least_outstanding(outstanding: Sequence[int], up: Sequence[bool], turn: int) -> int | None:
    """The index that is up with the least outstanding, the search starting at ``turn`` (so equal ones take
    turns); None when none is up. The one balancing rule of a child over its parent's replicas and of a client
    over its entry nodes (cis.runtime.entries)."""
    n, best = len(outstanding), None
    for k in range(n):
        i = (turn + k) % n
        if up[i] and (best is None or outstanding[i] < outstanding[best]):
            best = i
    return best
