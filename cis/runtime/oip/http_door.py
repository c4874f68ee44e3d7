"""The HTTP/1.1 front door of a node: the Open Inference Protocol's REST endpoints, in the node's own loop.

``cis serve ... --http-port PORT``. No thread of its own: the listening socket and every
connection are registered in one epoll selector whose descriptor the node's zmq poll
watches beside its ROUTER (:mod:`cis.runtime.oip.door`), so a request is read, parsed
(httptools, the C parser uvicorn uses), decoded (:mod:`cis.runtime.oip.codec`) and admitted in
the same turn of the loop that runs its batch, and its answer is written when the node
replies; nothing competes with the node for the GIL and no request crosses a thread
(docs/runtime.md says what this saved against a door thread). Non-blocking throughout, and
bounded before anything is authenticated (docs/runtime.md, *Limits of the front door*):

- a request is routed and its bearer token checked when its head ends, before any body byte is
  read: a request that will be refused (401, 404, 405, a body over ``--door-max-request-bytes`` or,
  as JSON, over ``--http-max-json-bytes``) is answered then, and its connection closes;
- the bytes a request holds while it is read are taken from the node's doors' byte budget
  (``--door-max-buffered-bytes``) first, and given back the moment the door lets go of them: a
  request that would pass it gets 503 and its connection closes;
- deadlines move only with progress on a request: a TLS handshake and a request's line and headers
  must arrive within ``--http-head-timeout``, the whole request within ``--http-timeout``
  (else 408, and the connection closes), an idle connection lasts ``--http-timeout``;
- at most ``max_connections`` connections (and what the open-files limit allows): for a new
  one beyond, the longest idle connection is closed (or, when none is idle, the new one);
- every request read is answered, whatever its body raises in decoding (400, with its ``id``
  when it was read), in request order (pipelining, at most :data:`~cis.runtime.oip.http_requests.MAX_PIPELINE` waiting);
  ``Expect: 100-continue`` and HEAD are answered; a connection closing after an error answer
  drops what its client still sends for :data:`LINGER` seconds, so the answer is not lost to a reset;
- TLS (``ssl``, handshakes non-blocking too) and a bearer token (``Authorization: Bearer``;
  the health endpoints need none).
"""

from __future__ import annotations

import collections
import errno
import logging
import selectors
import socket
import ssl
import time

import httptools

from cis.core.errors import CisError
from cis.core.logs import Every, event
from cis.runtime.oip import codec, door
from cis.runtime.oip.door import Budget, DoorConfig, DoorNode
from cis.runtime.oip.http_connection import READ, READ_WRITE, Connection, Refused, fd_room
from cis.runtime.oip.http_requests import Requests

log = logging.getLogger("cis.runtime.node")
READ_BYTES = 256 << 10
TICK = 0.5  # seconds between timeout scans
LINGER = 2.0  # seconds a connection that closes after an error answer drops what its client still sends


class HttpDoor(Requests):
    """The HTTP front door of one node (see the module's docstring); :meth:`open` binds it."""

    kind = "http"

    def __init__(self, model: codec.Model, cfg: DoorConfig, budget: Budget | None = None) -> None:
        self.model, self.cfg = model, cfg
        self.node: DoorNode  # its node, from open()
        self.tls: ssl.SSLContext | None = None
        if cfg.cert:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                self.tls.load_cert_chain(cfg.cert, cfg.key)
            except (OSError, ssl.SSLError) as exc:
                raise CisError(f"--http-tls-cert {cfg.cert}, --http-tls-key {cfg.key}: cannot load ({exc})") from None
        self.token = cfg.token.encode() if cfg.token else None
        self.budget = budget if budget is not None else Budget(cfg.max_buffered)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Connection] = {}
        self.idle: dict[int, Connection] = {}  # connections with no request begun, the longest idle first
        self.refused: collections.Counter = collections.Counter()  # reason -> requests or connections
        self.listener: socket.socket | None = None
        self.url = ""
        self.max_connections = cfg.max_connections
        self.paused_until = 0.0  # accepting paused (out of descriptors) until then
        self.warn = Every(10.0)

    @property
    def connections(self) -> int:
        return len(self.conns)

    # ------------------------------------------------------------ the node's side (door.Door)

    def open(self, node: DoorNode) -> None:
        self.node = node
        host = self.cfg.bind_host
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, self.cfg.port), family=family, backlog=4096)
        except OSError as exc:
            raise CisError(
                f"node {node.cfg.name!r}: cannot serve HTTP on {host}:{self.cfg.port} ({exc.strerror or exc}); "
                "pick another --http-port (0: a free one) or --http-host"
            ) from None
        self.listener.setblocking(False)
        self.sel.register(self.listener, READ, None)
        self.max_connections = fd_room(self.cfg.max_connections)
        port = self.listener.getsockname()[1]
        self.url = door.url("https" if self.tls else "http", host, port)
        door.announce("http", node.cfg.name, self.url, self.cfg, self.model.name)

    def fileno(self) -> int:
        return self.sel.fileno()

    def on_ready(self) -> None:
        for key, mask in self.sel.select(0):
            conn = key.data
            if conn is None:
                self._accept()
            elif conn.closed:
                continue  # closed earlier in this round (to make room for a new one)
            elif mask & selectors.EVENT_WRITE and (conn.out or not conn.shaken):
                self._writable(conn)
            elif mask & selectors.EVENT_READ:
                self._read(conn)

    def tick(self, now: float) -> float:
        if self.paused_until and now >= self.paused_until and self.listener is not None:
            self.paused_until = 0.0
            self.sel.register(self.listener, READ, None)
        for conn in [c for c in self.conns.values() if c.deadline <= now]:
            self._expire(conn, now)
        return now + TICK

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn)
        if self.listener is not None:
            if not self.paused_until:
                self.sel.unregister(self.listener)
            self.listener.close()
        self.sel.close()

    # ------------------------------------------------------------ connections

    def busy(self, conn: Connection) -> None:
        """A request has begun on ``conn``: it is not idle (not to be closed to make room)."""
        self.idle.pop(conn.fd, None)

    def _accept(self) -> None:
        assert self.listener is not None
        for _ in range(256):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause(exc)
                return
            if len(self.conns) >= self.max_connections and not self._evict():
                sock.close()
                self.refused["max_connections"] += 1
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = Connection(sock, self, time.monotonic(), self.tls is None)
            self.conns[conn.fd] = self.idle[conn.fd] = conn
            self.sel.register(sock, READ, conn)

    def _evict(self) -> bool:
        """Make room for a new connection: close the longest idle one (no request begun); False when none is."""
        for conn in self.idle.values():
            self.refused["max_connections"] += 1
            self._close(conn)
            return True
        return False

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment (the listener would wake the loop at once again)."""
        assert self.listener is not None
        self.sel.unregister(self.listener)
        self.paused_until = time.monotonic() + 0.1
        held = self.warn.due(time.monotonic())
        if held is not None:
            event(
                log, logging.WARNING, "door_full",
                f"node {self.node.cfg.name}: http front door cannot accept ({exc.strerror}); "
                f"{len(self.conns)} connections open",
                node=self.node.cfg.name, connections=len(self.conns), held=held,
            )  # fmt: skip

    def _expire(self, conn: Connection, now: float) -> None:
        """``conn`` is past its deadline: 408 for a request not read in time, else closed."""
        cfg = self.cfg
        if conn.closing or conn.lingering:
            return self._close(conn)  # its last answer not taken in time, or its linger is over
        if not conn.shaken:
            self.refused["handshake_timeout"] += 1
            return self._close(conn)
        if not conn.reading:
            self.refused["idle_timeout"] += 1
            return self._close(conn)
        if conn.in_head:
            limit, text = "head_timeout", f"request line and headers not complete within {cfg.head_timeout:g} s"
        else:
            limit, text = "request_timeout", f"request not complete within {cfg.timeout:g} s"
        self._fail(conn, "timeout", text, limit=limit)
        if not conn.closed:
            conn.deadline = now + LINGER

    def _read(self, conn: Connection) -> None:
        if not conn.shaken and not self._handshake(conn):
            return
        data = self._receive(conn)
        if data is None or conn.closing:
            return  # nothing, or the last request it may send is read: the rest is dropped
        why = ""
        try:
            conn.parser.feed_data(data)
            ok = conn.closed or conn.counted(len(data))
        except httptools.HttpParserUpgrade:
            conn.reject, ok = ("bad_message", "protocol upgrades are not served", b"", ""), False
        except (httptools.HttpParserError, Refused) as exc:
            ok, why = False, _parser_fault(exc)
        if not ok:
            code, text, extra, limit = conn.reject or ("bad_message", f"malformed HTTP/1.1 request{why}", b"", "")
            return self._fail(conn, code, text, extra, limit)
        if conn.slots:
            self._flush(conn)

    def _receive(self, conn: Connection) -> bytes | None:
        """What the connection has sent, or None (nothing yet; or it ended, and is closed)."""
        sock = conn.sock
        try:
            data = sock.recv(READ_BYTES)
            if self.tls is not None:
                while data and sock.pending():
                    data += sock.recv(sock.pending())
        except (BlockingIOError, ssl.SSLWantReadError):
            return None
        except ssl.SSLWantWriteError:
            self._want(conn, READ_WRITE)
            return None
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return None
        return data

    def _handshake(self, conn: Connection) -> bool:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, READ)
            return False
        except ssl.SSLWantWriteError:
            self._want(conn, READ_WRITE)
            return False
        except (ssl.SSLError, OSError):
            self._close(conn)
            return False
        conn.shaken = True
        self._idle(conn)
        self._want(conn, READ_WRITE if conn.out else READ)
        return True

    def _writable(self, conn: Connection) -> None:
        if not conn.shaken:
            if self._handshake(conn):
                self._read(conn)
            return
        self._flush(conn)

    def _fail(self, conn: Connection, code: str, message: str, extra: bytes = b"", limit: str = "") -> None:
        """Answer a request that cannot be read (or not in time) and close the connection after it."""
        if conn.closed:
            return
        if limit:
            self.refused[limit] += 1
        conn.let_go()
        conn.reading, conn.closing = False, True
        conn.slots.append([self._error_response(code, message, close=True, extra=extra), True])
        self._flush(conn)

    def write(self, conn: Connection, data: bytes) -> None:
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        """Write what is ready, in request order; after an answer that closes, linger, then close."""
        while conn.slots and conn.slots[0][0] is not None:
            data, close = conn.slots.popleft()
            conn.out += data
            if close:
                conn.slots.clear()
                conn.closing = True
        if conn.out and conn.shaken and not self._send(conn):
            return
        if conn.out:
            self._want(conn, READ_WRITE)
            if conn.deadline == float("inf"):
                conn.deadline = time.monotonic() + self.cfg.timeout  # a client that does not read its answers
            return
        if conn.closing and not conn.slots:
            return self._linger(conn)
        self._want(conn, READ)
        if not conn.reading and not conn.slots:
            self._idle(conn)

    def _send(self, conn: Connection) -> bool:
        """Send what the socket takes now; False when the connection broke (it is closed)."""
        try:
            sent = conn.sock.send(conn.out)
            del conn.out[:sent]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            pass
        except OSError:
            self._close(conn)
            return False
        return True

    def _idle(self, conn: Connection) -> None:
        """``conn`` has no request under way: it may stay ``timeout`` seconds, and is the newest idle one."""
        conn.deadline = time.monotonic() + self.cfg.timeout
        self.idle.pop(conn.fd, None)
        self.idle[conn.fd] = conn

    def _linger(self, conn: Connection) -> None:
        """Its last answer is sent: shut its write side and drop what still comes until the client closes (or
        :data:`LINGER` seconds), so a client still sending a refused body reads the answer, not a reset."""
        if conn.lingering:
            return
        conn.lingering = True
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return self._close(conn)
        conn.deadline = time.monotonic() + LINGER
        self._want(conn, READ)
        self.idle[conn.fd] = conn  # may make room for a new connection at once

    def _want(self, conn: Connection, events: int) -> None:
        if conn.events != events and not conn.closed:
            conn.events = events
            self.sel.modify(conn.sock, events, conn)

    def _close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.conns.pop(conn.fd, None)
        self.idle.pop(conn.fd, None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        conn.release()


def _parser_fault(exc: Exception) -> str:
    """What httptools found wrong (e.g. ": Invalid character in Content-Length"); none for a callback's fault."""
    if isinstance(exc, Refused | httptools.HttpParserCallbackError) or not str(exc):
        return ""
    return f": {exc}"
