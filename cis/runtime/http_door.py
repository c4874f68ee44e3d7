"""The HTTP/1.1 front door of a node: the Open Inference Protocol's REST endpoints, in the node's own loop.

``cis serve ... --http-port PORT``. No thread of its own: the listening socket and every
connection are registered in one epoll selector whose descriptor the node's zmq poll
watches beside its ROUTER (:mod:`cis.runtime.doors`), so a request is read, parsed
(httptools, the C parser uvicorn uses), decoded (:mod:`cis.runtime.oip`) and admitted in
the same turn of the loop that runs its batch, and its answer is written when the node
replies; nothing competes with the node for the GIL and no request crosses a thread
(docs/runtime.md says what this saved against a door thread). Non-blocking throughout:

- a request must arrive whole within ``timeout`` seconds of its first byte (else ``408``
  and the connection closes), and a connection idle for ``timeout`` seconds is closed; a slow
  or half-sent body holds only its buffer, never a worker;
- a body over ``max_body`` bytes gets ``413`` as soon as its Content-Length (or its running
  size) says so, and the connection closes; a request head over :data:`MAX_HEAD` gets ``400``;
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
import resource
import selectors
import socket
import ssl
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

from cis.errors import CisError
from cis.logs import Every, event
from cis.runtime import doors, oip
from cis.runtime.doors import DoorConfig, Ticket
from cis.runtime.requests import Request

log = logging.getLogger("cis.runtime.node")
READ_BYTES = 256 << 10
MAX_HEAD = 64 << 10  # bytes of request line and headers
MAX_PIPELINE = 32  # requests read ahead of their answers on one connection
TICK = 0.5  # seconds between timeout scans
FD_MARGIN = 64  # descriptors kept free for the node's own sockets and files
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 413: "Content Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
    504: "Gateway Timeout",
}  # fmt: skip
JSON = b"application/json"
_READ, _RW = selectors.EVENT_READ, selectors.EVENT_READ | selectors.EVENT_WRITE


def response(status: int, body: bytes, content_type: bytes = JSON, extra: bytes = b"", close: bool = False) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n" % (
        status, REASONS[status].encode(), content_type, len(body), extra, b"connection: close\r\n" if close else b"",
    )  # fmt: skip
    return head + body


def route(path: str) -> tuple[str, str | None, str | None]:
    """(endpoint, model name, version) of a path; endpoint ``""`` when no endpoint has that path."""
    parts = path.rstrip("/").split("/")
    if parts[:2] != ["", "v2"]:
        return "", None, None
    rest = parts[2:]
    if not rest:
        return "server", None, None
    if rest == ["health", "live"]:
        return "live", None, None
    if rest == ["health", "ready"]:
        return "ready", None, None
    if rest[0] != "models" or len(rest) < 2:
        return "", None, None
    name, version, rest = unquote(rest[1]), None, rest[2:]
    if rest[:1] == ["versions"] and len(rest) >= 2:
        version, rest = unquote(rest[1]), rest[2:]
    endpoint = {(): "model", ("ready",): "model_ready", ("infer",): "infer"}.get(tuple(rest), "")
    return endpoint, name, version


class _Conn:
    """One client connection and the httptools parser that calls back into it."""

    __slots__ = (
        "sock", "door", "parser", "url", "headers", "head_bytes", "body", "size", "reading", "deadline", "out",
        "slots", "closing", "closed", "shaken", "reject", "events",
    )  # fmt: skip

    def __init__(self, sock: Any, door: HttpDoor, now: float, shaken: bool) -> None:
        self.sock, self.door = sock, door
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.head_bytes = b"", 0
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.reading = False  # a request has begun and not ended
        self.deadline = now + door.cfg.timeout  # the handshake and the first request, or idle
        self.out = bytearray()
        self.slots: deque[list] = deque()  # per request read: [response bytes or None, close after it]
        self.closing = self.closed = False
        self.shaken = shaken  # TLS handshake done (plain: always)
        self.reject: tuple[str, str] | None = None
        self.events = _READ

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.head_bytes, self.body, self.size = b"", {}, 0, [], 0
        self.reading, self.deadline = True, time.monotonic() + self.door.cfg.timeout

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value
        self._count(len(name) + len(value))

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD:
            self._stop("bad_message", f"request line and headers over {MAX_HEAD} bytes")

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.door.cfg.max_body:
            self._stop("too_large", f"body of {int(length)} bytes; this node accepts at most {self.door.cfg.max_body}")
        if self.headers.get(b"expect", b"").lower() == b"100-continue":
            self.door.write(self, b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.door.cfg.max_body:
            self._stop("too_large", f"body over {self.door.cfg.max_body} bytes, the most this node accepts")
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.reading = False
        self.deadline = float("inf")  # answered by the node; idle again once written
        self.door.dispatch(self)

    def _stop(self, code: str, message: str) -> None:
        self.reject = (code, message)
        raise _Stop


class _Stop(Exception):
    """Raised in a parser callback to stop reading a request that is refused already."""


class HttpDoor:
    """The HTTP front door of one node (see the module's docstring); :meth:`open` binds it."""

    def __init__(self, model: oip.Model, cfg: DoorConfig) -> None:
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
        self.conns: dict[int, _Conn] = {}
        self.listener: socket.socket | None = None
        self.url = ""
        self.max_connections = cfg.max_connections
        self.paused_until = 0.0  # accepting paused (out of descriptors) until then
        self.dropped = 0  # connections closed at once: over max_connections
        self.warn = Every(10.0)
        ready = response(200, b'{"ready":true}')
        self.canned = {"live": response(200, b'{"live":true}'), "ready": ready}

    # ------------------------------------------------------------ the node's side (doors.Door)

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
        self.sel.register(self.listener, _READ, None)
        self.max_connections = _fd_room(self.cfg.max_connections)
        port = self.listener.getsockname()[1]
        self.url = doors.url("https" if self.tls else "http", host, port)
        doors.announce("http", node.cfg.node_id, self.url, self.cfg, self.model.name)

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
            self.sel.register(self.listener, _READ, None)
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
        body, header_length = oip.encode_json(self.model, ticket.request, *doors.result_arrays(req), req.served_by)
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

    def dispatch(self, conn: _Conn) -> None:
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
                slot[0] = response(200, oip._ENCODE(oip.server_metadata()), close=slot[1])
                return
            self.model.check(name or "", version)
        except oip.OipError as exc:
            slot[0] = self._error_response(exc.code, exc.message, slot[1])
            return
        if endpoint == "model":
            slot[0] = response(200, oip._ENCODE(self.model.metadata()), close=slot[1])
        else:
            ready = self.serving()
            body = oip._ENCODE({"name": self.model.name, "ready": ready})
            slot[0] = response(200 if ready else 503, body, close=slot[1])

    def _infer(self, conn: _Conn, slot: list, name: str, version: str | None) -> None:
        body = conn.body[0] if len(conn.body) == 1 else b"".join(conn.body)
        conn.body = []
        ticket = Ticket(self, (conn, slot), None)
        try:
            self.model.check(name, version)
            length = conn.headers.get(oip.HEADER_LENGTH.encode())
            if length is not None and not length.strip().isdigit():
                raise oip.OipError("bad_message", f"Inference-Header-Content-Length is {length!r}; expected bytes")
            ticket.request = oip.decode_json(body, self.model, None if length is None else int(length))
        except oip.OipError as exc:
            return doors.refuse(self.node, ticket, exc.code, exc.message)
        trace = conn.headers.get(b"traceparent")
        ticket.request.traceparent = trace.decode("latin-1") if trace is not None else None
        doors.submit(self.node, ticket)

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
        return response(oip.HTTP_STATUS.get(code, 500), oip._ENCODE(body), extra=extra, close=close)

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
            conn = _Conn(sock, self, time.monotonic(), self.tls is None)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, _READ, conn)

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

    def _read(self, conn: _Conn) -> None:
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
            return self._want(conn, _RW)
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
        except (httptools.HttpParserError, _Stop):
            code, text = conn.reject or ("bad_message", "malformed HTTP/1.1 request")
            return self._fail(conn, code, text)
        if conn.slots:
            self._flush(conn)

    def _handshake(self, conn: _Conn) -> bool:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, _READ)
            return False
        except ssl.SSLWantWriteError:
            self._want(conn, _RW)
            return False
        except (ssl.SSLError, OSError):
            self._close(conn)
            return False
        conn.shaken = True
        conn.deadline = time.monotonic() + self.cfg.timeout
        self._want(conn, _RW if conn.out else _READ)
        return True

    def _writable(self, conn: _Conn) -> None:
        if not conn.shaken:
            if self._handshake(conn):
                self._read(conn)
            return
        self._flush(conn)

    def _fail(self, conn: _Conn, code: str, message: str) -> None:
        """Answer a request that cannot be read (or not in time) and close the connection after it."""
        conn.reading, conn.closing = False, True
        conn.slots.append([self._error_response(code, message, close=True), True])
        self._flush(conn)

    def write(self, conn: _Conn, data: bytes) -> None:
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
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
            self._want(conn, _RW)
            if conn.deadline == float("inf"):
                conn.deadline = time.monotonic() + self.cfg.timeout  # a client that does not read its answers
            return
        if conn.closing and not conn.slots:
            return self._close(conn)
        self._want(conn, _READ)
        if not conn.reading and not conn.slots:
            conn.deadline = time.monotonic() + self.cfg.timeout  # idle

    def _want(self, conn: _Conn, events: int) -> None:
        if conn.events != events and not conn.closed:
            conn.events = events
            self.sel.modify(conn.sock, events, conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.conns.pop(conn.sock.fileno(), None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def _fd_room(wanted: int) -> int:
    """How many connections the open-files limit leaves room for (raising the soft limit towards the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_MARGIN))
