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
READ, READ_WRITE = selectors.EVENT_READ, selectors.EVENT_READ | selectors.EVENT_WRITE


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


class Connection:
    """One client connection and the httptools parser that calls back into it."""

    __slots__ = (
        "sock", "door", "parser", "url", "headers", "head_bytes", "body", "size", "reading", "deadline", "out",
        "slots", "closing", "closed", "shaken", "reject", "events",
    )  # fmt: skip

    def __init__(self, sock: Any, door: Any, now: float, shaken: bool) -> None:
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
        self.events = READ

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
