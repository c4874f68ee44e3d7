"""HTTP/1.1 for the front door (:mod:`cis.runtime.oip.http_door`): one connection and its parser's callbacks,
the answer's bytes, the Open Inference Protocol's paths, the open-files room. No selector here."""

from __future__ import annotations

import resource
import selectors
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

MAX_HEAD = 64 << 10  # bytes of request line and headers
FD_MARGIN = 64  # descriptors kept free for the node's own sockets and files
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 413: "Content Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
    504: "Gateway Timeout",
}  # fmt: skip
JSON = b"application/json"
# the endpoints under /v2/models/NAME[/versions/V]
ENDPOINTS = {(): "model", ("ready",): "model_ready", ("infer",): "infer", ("config",): "config", ("stats",): "stats"}
READ, READ_WRITE = selectors.EVENT_READ, selectors.EVENT_READ | selectors.EVENT_WRITE


def head_only(answer: bytes) -> bytes:
    """The answer to HEAD: the head GET would get (its content-length included), no body."""
    return answer[: answer.index(b"\r\n\r\n") + 4]


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
        if not rest[1]:
            return "", None, None  # .../versions//...: no version named (gRPC's "" means none; a path's is none)
        version, rest = unquote(rest[1]), rest[2:]
    endpoint = ENDPOINTS.get(tuple(rest), "")
    return endpoint, name, version


class Connection:
    """One client connection and the httptools parser that calls back into it.

    Deadlines move only with progress on a request (docs/runtime.md, *Limits of the front door*): a TLS
    handshake must end within ``head_timeout`` of the accept, a request's line and headers within
    ``head_timeout`` of its first byte and the whole request within ``timeout``; an idle connection lasts
    ``timeout`` from its last answer. Bytes that begin no request (bare CRLF) move none of them. The bytes a
    request holds while it is read are taken from the doors' :class:`~cis.runtime.oip.door.Budget` first
    (a Content-Length body at once, when its head ends) and given back the moment the door lets go of them;
    :meth:`release` drops the parser, whose callbacks hold this object, so nothing waits for a cycle
    collection."""

    __slots__ = (
        "sock", "fd", "door", "parser", "url", "headers", "head_bytes", "head_raw", "body", "size", "held", "reserved",
        "reading", "in_head", "progress", "begun", "deadline", "out", "slots", "closing", "closed", "shaken", "reject",
        "events", "route", "refusal", "json_header", "lingering",
    )  # fmt: skip

    def __init__(self, sock: Any, door: Any, now: float, shaken: bool) -> None:
        self.sock, self.fd, self.door = sock, sock.fileno(), door
        self.parser: Any = httptools.HttpRequestParser(self)
        self.url, self.head_bytes, self.head_raw = b"", 0, 0
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = self.held = self.reserved = 0  # body bytes read; bytes taken from the budget; of them, reserved
        self.reading = False  # a request has begun and not ended
        self.in_head = True  # no request's headers are being waited for past their end
        self.progress = False  # a request's head or body ended during the last feed
        self.begun = now
        cfg = door.cfg
        self.deadline = now + (cfg.timeout if shaken else min(cfg.head_timeout, cfg.timeout))  # idle, or handshake
        self.out = bytearray()
        self.slots: deque[list] = deque()  # per request read: [response bytes or None, close after it]
        self.closing = self.closed = False
        self.shaken = shaken  # TLS handshake done (plain: always)
        self.reject: tuple[str, str, bytes, str] | None = None  # code, text, extra headers, the limit
        self.events = READ
        self.route: tuple[bytes, str, str | None, str | None] = (b"", "", None, None)  # method, endpoint, name, version
        self.refusal: tuple[str, str, bytes] | None = None  # the answer of a request refused at its head
        self.json_header = False  # the body is a JSON header and binary tensors
        self.lingering = False  # its last answer is sent and its write side shut: what still comes is dropped

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.closed:
            raise Refused  # closed during this feed (an answer that closes it): read nothing more
        self.url, self.headers, self.head_bytes, self.body, self.size = b"", {}, 0, [], 0
        self.reading, self.in_head, self.refusal = True, True, None
        self.begun = now = time.monotonic()
        cfg = self.door.cfg
        self.deadline = now + min(cfg.head_timeout, cfg.timeout)
        self.door.busy(self)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"tracestate" and name in self.headers:  # several lines are one list, joined (RFC 9110 5.3)
            value = self.headers[name] + b"," + value
        self.headers[name] = value
        self._count(len(name) + len(value))

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD:
            self.stop("bad_message", f"request line and headers over {MAX_HEAD} bytes", limit="max_head_bytes")

    def on_headers_complete(self) -> None:
        self.in_head, self.progress = False, True
        self.deadline = self.begun + self.door.cfg.timeout
        self.door.headed(self)

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.reserved:  # chunked: no length was reserved
            self.door.limit_body(self, self.size)
            self.take(len(data))
            self.reserved = self.size
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.reading, self.in_head, self.progress = False, True, True
        self.deadline = float("inf")  # answered by the node; idle again once written
        self.door.dispatch(self)

    def take(self, n: int) -> None:
        """Hold ``n`` more bytes of this request, or refuse it (503) when the doors' budget has no room."""
        budget = self.door.budget
        if not budget.take(n):
            self.stop("overloaded", budget.refusal(n), limit="max_buffered_bytes")
        self.held += n

    def counted(self, n: int) -> bool:
        """After a feed of ``n`` bytes: count them as head bytes when no request's head or body ended in it (the
        parser keeps a partial head itself); False (and :attr:`reject` says why) when the head is over its limit
        or the budget has no room for it."""
        if self.progress:
            self.progress = False
            self.door.budget.give(self.head_raw)
            self.held -= self.head_raw
            self.head_raw = 0
            return True
        if not self.in_head:
            return True
        self.head_raw += n
        if self.head_raw > MAX_HEAD:
            self.reject = ("bad_message", f"request line and headers over {MAX_HEAD} bytes", b"", "max_head_bytes")
            return False
        budget = self.door.budget
        if not budget.take(n):
            self.head_raw -= n
            self.reject = ("overloaded", budget.refusal(n), b"", "max_buffered_bytes")
            return False
        self.held += n
        return True

    def let_go(self) -> None:
        """Give back what the request being read holds (its body is the node's now, or dropped)."""
        self.body = []
        if self.held:
            self.door.budget.give(self.held)
        self.held = self.reserved = self.head_raw = 0

    def release(self) -> None:
        """The connection ended: drop the parser (its callbacks refer to this object) and every buffer."""
        self.let_go()
        self.parser = None
        self.headers, self.out = {}, bytearray()
        self.slots.clear()

    def stop(self, code: str, message: str, extra: bytes = b"", limit: str = "") -> None:
        """Refuse the request being read from inside a parser callback: answered, and the connection closes."""
        self.reject = (code, message, extra, limit)
        raise Refused


class Refused(Exception):
    """Raised in a parser callback to stop reading a request that is refused already."""


def fd_room(wanted: int) -> int:
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
