"""The HTTP/1.1 front door of a node: the Open Inference Protocol's REST endpoints, in the node's own loop.

``cis serve ... --http-port PORT``. No thread of its own: the listening socket and every
connection are registered in one epoll selector whose descriptor the node's zmq poll
watches beside its ROUTER (:mod:`cis.runtime.oip.door`), so a request is read, parsed
(httptools, the C parser uvicorn uses), decoded (:mod:`cis.runtime.oip.codec`) and admitted in
the same turn of the loop that runs its batch, and its answer is written when the node
replies; nothing competes with the node for the GIL and no request crosses a thread
(docs/runtime.md says what this saved against a door thread). Non-blocking throughout:

- a request must arrive whole within ``timeout`` seconds of its first byte (else ``408``
  and the connection closes), and a connection idle for ``timeout`` seconds is closed; a slow
  or half-sent body holds only its buffer, never a worker;
- a body over ``max_body`` bytes gets ``413`` as soon as its Content-Length (or its running
  size) says so, and the connection closes; a request head over :data:`cis.runtime.oip.http_connection.MAX_HEAD` gets
  ``400``;
- at most ``max_connections`` connections (and what the open-files limit allows): a new one
  beyond is closed at once;
- keep-alive and pipelining (answers in request order, at most :data:`MAX_PIPELINE` waiting);
  ``Expect: 100-continue`` is answered;
- TLS (``ssl``, handshakes non-blocking too) and a bearer token (``Authorization: Bearer``;
  the health endpoints need none).
"""

from __future__ import annotations

import errno
import hmac
import logging
import selectors
import socket
import ssl
import time
from typing import Any

import httptools

from cis.core.errors import CisError
from cis.core.logs import Every, event
from cis.runtime.oip import codec, door
from cis.runtime.oip.door import DoorConfig, Ticket
from cis.runtime.oip.http_connection import READ, READ_WRITE, Connection, Refused, fd_room, response, route
from cis.runtime.requests import Request

log = logging.getLogger("cis.runtime.node")
READ_BYTES = 256 << 10
MAX_PIPELINE = 32  # requests read ahead of their answers on one connection
TICK = 0.5  # seconds between timeout scans


class HttpDoor:
    """The HTTP front door of one node (see the module's docstring); :meth:`open` binds it."""

    def __init__(self, model: codec.Model, cfg: DoorConfig) -> None:
        self.model, self.cfg = model, cfg
        self.node: Any = None
        self.tls: ssl.SSLContext | None = None
        if cfg.cert:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                self.tls.load_cert_chain(cfg.cert, cfg.key)
            except (OSError, ssl.SSLError) as exc:
                raise CisError(f"--http-tls-cert {cfg.cert}, --http-tls-key {cfg.key}: cannot load ({exc})") from None
        self.token = b"Bearer " + cfg.token.encode() if cfg.token else None
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Connection] = {}
        self.listener: socket.socket | None = None
        self.url = ""
        self.max_connections = cfg.max_connections
        self.paused_until = 0.0  # accepting paused (out of descriptors) until then
        self.dropped = 0  # connections closed at once: over max_connections
        self.warn = Every(10.0)
        ready = response(200, b'{"ready":true}')
        self.canned = {"live": response(200, b'{"live":true}'), "ready": ready}

    # ------------------------------------------------------------ the node's side (door.Door)

    def open(self, node: Any) -> None:
        self.node = node
        host = self.cfg.bind_host
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, self.cfg.port), family=family, backlog=4096)
        except OSError as exc:
            raise CisError(
                f"node {node.cfg.node_id!r}: cannot serve HTTP on {host}:{self.cfg.port} ({exc.strerror or exc}); "
                "pick another --http-port (0: a free one) or --http-host"
            ) from None
        self.listener.setblocking(False)
        self.sel.register(self.listener, READ, None)
        self.max_connections = fd_room(self.cfg.max_connections)
        port = self.listener.getsockname()[1]
        self.url = door.url("https" if self.tls else "http", host, port)
        door.announce("http", node.cfg.node_id, self.url, self.cfg, self.model.name)

    def fileno(self) -> int:
        return self.sel.fileno()

    def on_ready(self) -> None:
        for key, mask in self.sel.select(0):
            conn = key.data
            if conn is None:
                self._accept()
            elif mask & selectors.EVENT_WRITE and (conn.out or not conn.shaken):
                self._writable(conn)
            elif mask & selectors.EVENT_READ:
                self._read(conn)

    def tick(self, now: float) -> float:
        if self.paused_until and now >= self.paused_until and self.listener is not None:
            self.paused_until = 0.0
            self.sel.register(self.listener, READ, None)
        for conn in [c for c in self.conns.values() if c.deadline <= now]:
            if conn.reading or not conn.shaken:
                self._fail(conn, "timeout", f"request not complete within {self.cfg.timeout:g} s")
            else:
                self._close(conn)  # idle, or not reading its answers
        return now + TICK

    def result(self, ticket: Ticket, req: Request) -> None:
        conn, slot = ticket.handle
        if conn.closed:
            self.node.counters["undeliverable"] += 1
            return
        assert ticket.request is not None
        body, header_length = codec.encode_json(
            self.model, ticket.request, *door.result_arrays(req), req.served_by, req.logits
        )
        if header_length is None:
            slot[0] = response(200, body, close=slot[1])
        else:
            extra = b"inference-header-content-length: %d\r\n" % header_length
            slot[0] = response(200, body, b"application/octet-stream", extra, close=slot[1])
        self._flush(conn)

    def error(self, ticket: Ticket, code: str, message: str) -> None:
        conn, slot = ticket.handle
        if conn.closed:
            self.node.counters["undeliverable"] += 1
            return
        slot[0] = self._error_response(code, message, slot[1], ticket.id)
        self._flush(conn)

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn)
        if self.listener is not None:
            if not self.paused_until:
                self.sel.unregister(self.listener)
            self.listener.close()
        self.sel.close()

    # ------------------------------------------------------------ requests

    def dispatch(self, conn: Connection) -> None:
        """A request has arrived whole: answer it, or hand it to the node (its answer comes later)."""
        keep = conn.parser.should_keep_alive()
        slot: list = [None, not keep]
        conn.slots.append(slot)
        if not keep:
            conn.closing = True  # nothing after this request is read
        if len(conn.slots) > MAX_PIPELINE:
            slot[1] = conn.closing = True
            slot[0] = self._error_response("overloaded", f"over {MAX_PIPELINE} requests waiting on one connection")
            return
        method = conn.parser.get_method()
        endpoint, name, version = route(conn.url.split(b"?", 1)[0].decode("latin-1"))
        canned = self.canned.get(endpoint)
        if canned is not None and method == b"GET":
            slot[0] = self._health(endpoint) if slot[1] or endpoint == "ready" else canned
            return
        if not endpoint:
            slot[0] = self._error_response("not_found", f"no endpoint {conn.url.decode('latin-1')!r}", slot[1])
            return
        wanted = b"POST" if endpoint == "infer" else b"GET"
        if method != wanted:
            text = f"{method.decode()} {conn.url.decode('latin-1')}: expected {wanted.decode()}"
            slot[0] = self._error_response("method_not_allowed", text, slot[1], extra=b"allow: %s\r\n" % wanted)
            return
        if self.token is not None and not hmac.compare_digest(conn.headers.get(b"authorization", b""), self.token):
            text = "missing or wrong bearer token (header Authorization: Bearer TOKEN)"
            slot[0] = self._error_response("unauthenticated", text, slot[1], extra=b"www-authenticate: Bearer\r\n")
            return
        if endpoint == "infer":
            return self._infer(conn, slot, name or "", version)
        try:
            if endpoint == "server":
                slot[0] = response(200, codec._ENCODE(codec.server_metadata()), close=slot[1])
                return
            self.model.check(name or "", version)
        except codec.OipError as exc:
            slot[0] = self._error_response(exc.code, exc.message, slot[1])
            return
        if endpoint == "model":
            slot[0] = response(200, codec._ENCODE(self.model.metadata()), close=slot[1])
        else:
            ready = self.serving()
            body = codec._ENCODE({"name": self.model.name, "ready": ready})
            slot[0] = response(200 if ready else 503, body, close=slot[1])

    def _infer(self, conn: Connection, slot: list, name: str, version: str | None) -> None:
        body = conn.body[0] if len(conn.body) == 1 else b"".join(conn.body)
        conn.body = []
        ticket = Ticket(self, (conn, slot), None)
        try:
            self.model.check(name, version)
            length = conn.headers.get(codec.HEADER_LENGTH.encode())
            if length is not None and not length.strip().isdigit():
                raise codec.OipError("bad_message", f"Inference-Header-Content-Length is {length!r}; expected bytes")
            ticket.request = codec.decode_json(body, self.model, None if length is None else int(length))
        except codec.OipError as exc:
            return door.refuse(self.node, ticket, exc.code, exc.message)
        trace = conn.headers.get(b"traceparent")
        ticket.request.traceparent = trace.decode("latin-1") if trace is not None else None
        door.submit(self.node, ticket)

    def serving(self) -> bool:
        node = self.node
        return not node.stopping and node.executor.stage_ok

    def _health(self, endpoint: str) -> bytes:
        if endpoint == "live":
            return response(200, b'{"live":true}', close=True)
        ready = self.serving()
        return response(200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))

    def _error_response(
        self, code: str, message: str, close: bool = False, req_id: str | None = None, extra: bytes = b""
    ) -> bytes:
        body: dict[str, Any] = {"error": message, "code": code}
        if req_id is not None:
            body["id"] = req_id
        return response(codec.HTTP_STATUS.get(code, 500), codec._ENCODE(body), extra=extra, close=close)

    # ------------------------------------------------------------ connections

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
            if len(self.conns) >= self.max_connections:
                sock.close()
                self.dropped += 1
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = Connection(sock, self, time.monotonic(), self.tls is None)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, READ, conn)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment (the listener would wake the loop at once again)."""
        assert self.listener is not None
        self.sel.unregister(self.listener)
        self.paused_until = time.monotonic() + 0.1
        held = self.warn.due(time.monotonic())
        if held is not None:
            event(
                log, logging.WARNING, "door_full",
                f"node {self.node.cfg.node_id}: http front door cannot accept ({exc.strerror}); "
                f"{len(self.conns)} connections open",
                node=self.node.cfg.node_id, connections=len(self.conns), held=held,
            )  # fmt: skip

    def _read(self, conn: Connection) -> None:
        if not conn.shaken and not self._handshake(conn):
            return
        sock = conn.sock
        try:
            data = sock.recv(READ_BYTES)
            if self.tls is not None:
                while data and sock.pending():
                    data += sock.recv(sock.pending())
        except (BlockingIOError, ssl.SSLWantReadError):
            return
        except ssl.SSLWantWriteError:
            return self._want(conn, READ_WRITE)
        except OSError:
            return self._close(conn)
        if not data:
            return self._close(conn)
        if conn.closing:
            return  # the last request it may send is read: the rest is dropped
        if not conn.reading:
            conn.deadline = time.monotonic() + self.cfg.timeout
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return self._fail(conn, "bad_message", "protocol upgrades are not served")
        except (httptools.HttpParserError, Refused):
            code, text = conn.reject or ("bad_message", "malformed HTTP/1.1 request")
            return self._fail(conn, code, text)
        if conn.slots:
            self._flush(conn)

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
        conn.deadline = time.monotonic() + self.cfg.timeout
        self._want(conn, READ_WRITE if conn.out else READ)
        return True

    def _writable(self, conn: Connection) -> None:
        if not conn.shaken:
            if self._handshake(conn):
                self._read(conn)
            return
        self._flush(conn)

    def _fail(self, conn: Connection, code: str, message: str) -> None:
        """Answer a request that cannot be read (or not in time) and close the connection after it."""
        conn.reading, conn.closing = False, True
        conn.slots.append([self._error_response(code, message, close=True), True])
        self._flush(conn)

    def write(self, conn: Connection, data: bytes) -> None:
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        """Write what is ready, in request order; close after an answer that says so."""
        close = False
        while conn.slots and conn.slots[0][0] is not None:
            data, close = conn.slots.popleft()
            conn.out += data
            if close:
                conn.slots.clear()
                break
        if close:
            conn.closing = True
        if conn.out and conn.shaken:
            try:
                sent = conn.sock.send(conn.out)
                del conn.out[:sent]
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass
            except OSError:
                return self._close(conn)
        if conn.out:
            self._want(conn, READ_WRITE)
            if conn.deadline == float("inf"):
                conn.deadline = time.monotonic() + self.cfg.timeout  # a client that does not read its answers
            return
        if conn.closing and not conn.slots:
            return self._close(conn)
        self._want(conn, READ)
        if not conn.reading and not conn.slots:
            conn.deadline = time.monotonic() + self.cfg.timeout  # idle

    def _want(self, conn: Connection, events: int) -> None:
        if conn.events != events and not conn.closed:
            conn.events = events
            self.sel.modify(conn.sock, events, conn)

    def _close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.conns.pop(conn.sock.fileno(), None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
