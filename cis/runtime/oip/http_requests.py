"""What an HTTP request gets from the front door (:mod:`cis.runtime.oip.http_door`, whose connections call
these as the parser reaches each part of a request): its route and its refusal when its head ends (before any
body byte is read), its answer when it has arrived whole, or its hand-over to the node (the node's answer comes
back through :meth:`Requests.result` and :meth:`Requests.error`)."""

from __future__ import annotations

from typing import Any, cast

from cis.runtime.oip import codec, door, triton
from cis.runtime.oip.door import Door, Ticket
from cis.runtime.oip.http_connection import Connection, Refused, head_only, response, route
from cis.runtime.requests import Request

MAX_PIPELINE = 32  # requests read ahead of their answers on one connection
MAX_DIGITS = 20  # an Inference-Header-Content-Length of more digits is no byte count
_HEADER_LENGTH = codec.HEADER_LENGTH.encode()
_LIVE = response(200, b'{"live":true}')


class Requests:
    """The request side of :class:`cis.runtime.oip.http_door.HttpDoor` (its base class): needs the door's
    ``model``, ``cfg``, ``node``, ``token``, ``refused`` and its ``write``/``_flush`` of a connection."""

    model: codec.Model
    cfg: Any
    node: Any
    token: bytes | None
    refused: Any

    def write(self, conn: Connection, data: bytes) -> None: ...

    def _flush(self, conn: Connection) -> None: ...

    def result(self, ticket: Ticket, req: Request) -> None:
        conn, slot = ticket.handle
        if conn.closed:
            self.node.counters["undeliverable"] += 1
            return
        assert ticket.request is not None
        ticket.request.version = door.answered_by(req, ticket.request.version)
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

    def headed(self, conn: Connection) -> None:
        """A request's head has ended: route it, and refuse now, before any body byte is read, a request with a
        body that will be refused (the connection then closes). Its Content-Length is taken from the budget."""
        if conn.closed:
            raise Refused
        method = conn.parser.get_method()
        endpoint, name, version = route(conn.url.split(b"?", 1)[0].decode("latin-1"))
        conn.route = (method, endpoint, name, version)
        conn.refusal = self._refusal(conn, method, endpoint)
        length = conn.headers.get(b"content-length")
        size = int(length) if length is not None else 0  # llhttp has checked its digits
        if not size and b"chunked" not in conn.headers.get(b"transfer-encoding", b"").lower():
            return
        if conn.refusal is not None:
            code, text, extra = conn.refusal
            conn.stop(code, text, extra, "token" if code == "unauthenticated" else "")
        json_length = conn.headers.get(_HEADER_LENGTH, b"").strip()
        conn.json_header = bool(json_length)
        self.limit_body(conn, size)
        if json_length.isdigit() and len(json_length) <= MAX_DIGITS and int(json_length) > self.cfg.max_json:
            conn.stop("too_large", self._json_text(int(json_length)), limit="max_json_bytes")
        if size:
            conn.take(size)
            conn.reserved = size
        if conn.headers.get(b"expect", b"").lower() == b"100-continue":
            self.write(conn, b"HTTP/1.1 100 Continue\r\n\r\n")

    def limit_body(self, conn: Connection, size: int) -> None:
        """Refuse a body of ``size`` bytes (declared, or read so far) over the request or the JSON limit."""
        cfg = self.cfg
        if size > cfg.max_body:
            text = f"body of {size} bytes; this node accepts at most {cfg.max_body} (--door-max-request-bytes)"
            conn.stop("too_large", text, limit="max_request_bytes")
        if not conn.json_header and size > cfg.max_json:
            conn.stop("too_large", self._json_text(size), limit="max_json_bytes")

    def _json_text(self, size: int) -> str:
        return (
            f"{size} bytes of JSON; this node decodes at most {self.cfg.max_json} (--http-max-json-bytes): send the "
            "tensors as binary data (Inference-Header-Content-Length, Triton's binary tensor data extension)"
        )

    def _refusal(self, conn: Connection, method: bytes, endpoint: str) -> tuple[str, str, bytes] | None:
        """(code, text, extra headers) of a request refused for its path, method or token; None for the others."""
        url = conn.url.decode("latin-1")
        if not endpoint:
            return "not_found", f"no endpoint {url!r}", b""
        wanted = (b"POST",) if endpoint == "infer" else (b"GET", b"HEAD")
        if method not in wanted:
            text = f"{method.decode('latin-1')} {url}: expected {' or '.join(w.decode() for w in wanted)}"
            return "method_not_allowed", text, b"allow: %s\r\n" % b", ".join(wanted)
        if self.token is not None and endpoint not in ("live", "ready"):
            if not door.bearer(conn.headers.get(b"authorization"), self.token):
                text = "missing or wrong bearer token (header Authorization: Bearer TOKEN)"
                return "unauthenticated", text, b"www-authenticate: Bearer\r\n"
        return None

    def dispatch(self, conn: Connection) -> None:
        """A request has arrived whole: answer it, or hand it to the node (its answer comes later)."""
        if conn.closed or conn.closing:
            return conn.let_go()  # behind a request that closes the connection: not served
        keep = conn.parser.should_keep_alive()
        slot: list = [None, not keep]
        conn.slots.append(slot)
        conn.closing = not keep  # nothing after this request is read
        method, endpoint, name, version = conn.route
        if len(conn.slots) > MAX_PIPELINE:
            slot[1] = conn.closing = True
            self.refused["max_pipeline"] += 1
            slot[0] = self._error_response(
                "overloaded", f"over {MAX_PIPELINE} requests waiting on one connection", True
            )
        elif conn.refusal is not None:
            code, text, extra = conn.refusal
            self.refused["token"] += code == "unauthenticated"
            slot[0] = self._error_response(code, text, slot[1], extra=extra)
        elif endpoint == "infer":
            self._infer(conn, slot, name or "", version)
        else:
            slot[0] = self._answer(endpoint, name or "", version, slot[1])
        conn.let_go()
        if method == b"HEAD" and slot[0] is not None:
            slot[0] = head_only(slot[0])

    def _answer(self, endpoint: str, name: str, version: str | None, close: bool) -> bytes:
        """The answer of every endpoint but infer."""
        if endpoint == "live":
            return response(200, b'{"live":true}', close=True) if close else _LIVE
        ready = self.serving()
        if endpoint == "ready":
            return response(200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"), close=close)
        if endpoint == "server":
            return response(200, codec.encode(codec.server_metadata()), close=close)
        versions = door.versions(self.node)
        try:
            self.model.check(name, version, versions)
        except codec.OipError as exc:
            return self._error_response(exc.code, exc.message, close)
        if endpoint == "model_ready":
            body = codec.encode({"name": self.model.name, "ready": ready})
            return response(200 if ready else 503, body, close=close)
        if endpoint == "config":
            answer = triton.config(self.model, self.node, versions)
        elif endpoint == "stats":
            named = version if version not in (None, "", codec.VERSION) else versions[-1]  # 1: the newest
            answer = triton.statistics(self.model, self.node, named)
        else:
            answer = self.model.metadata(versions)
        return response(200, codec.encode(answer), close=close)

    def _infer(self, conn: Connection, slot: list, name: str, version: str | None) -> None:
        body = conn.body[0] if len(conn.body) == 1 else b"".join(conn.body)
        conn.body = []
        ticket = Ticket(cast("Door", self), (conn, slot), None)
        try:
            versions = door.versions(self.node)
            self.model.check(name, version, versions)
            length = _header_length(conn.headers.get(_HEADER_LENGTH))
            request = codec.decode_json(body, self.model, length)
        except codec.OipError as exc:
            ticket.req_id = exc.req_id
            return door.refuse(self.node, ticket, exc.code, exc.message)
        except Exception as exc:  # whatever else a hostile body raises in decoding: a bad request all the same
            return door.refuse(self.node, ticket, "bad_message", f"inference request cannot be decoded ({exc!r:.200})")
        request.traceparent = door.trace_context(conn.headers.get(b"traceparent"))
        request.tracestate = door.trace_state(request.traceparent, [conn.headers.get(b"tracestate", b"")])
        request.version = versions[-1]
        ticket.request = request
        door.submit(self.node, ticket)

    def serving(self) -> bool:
        node = self.node
        return not node.stopping and node.executor.stage_ok

    def _error_response(
        self, code: str, message: str, close: bool = False, req_id: str | None = None, extra: bytes = b""
    ) -> bytes:
        body: dict[str, Any] = {"error": message, "code": code}
        if req_id is not None:
            body["id"] = req_id
        return response(codec.HTTP_STATUS.get(code, 500), codec.encode(body), extra=extra, close=close)


def _header_length(value: bytes | None) -> int | None:
    """The Inference-Header-Content-Length as a byte count (None when absent), or a ``bad_message``."""
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit() or len(value) > MAX_DIGITS:
        shown = value[:24] + (b"... (%d characters)" % len(value) if len(value) > 24 else b"")
        raise codec.OipError("bad_message", f"Inference-Header-Content-Length is {shown!r}; expected a byte count")
    return int(value)
