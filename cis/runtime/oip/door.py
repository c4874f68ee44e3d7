"""Front doors: how a request that came over HTTP or gRPC enters a node's normal path.

A door (:mod:`cis.runtime.oip.http_door`, :mod:`cis.runtime.oip.grpc_door`) is an adapter: it
decodes the Open Inference Protocol (:mod:`cis.runtime.oip.codec`) into a
:class:`cis.runtime.protocol.Message` of kind ``infer`` and hands it to
:meth:`cis.runtime.node.Node.admit`, the same call a ZeroMQ INFER takes: the same
executor admission (entry stage, queue limit, deadline, finite values), the same
micro-batches, thresholds, forwards and counters (``cis_requests_total{kind="infer"}``).
Instead of a ROUTER identity, the request's ``prefix`` is a :class:`Ticket`; the node
hands the answer (or the error) of a request whose prefix is a ticket to the ticket's
door (:meth:`Door.result`, :meth:`Door.error`) instead of its ROUTER.

A door is polled by the node's own loop: :meth:`Door.fileno` is a file descriptor the
node's zmq poll watches beside its sockets (the HTTP door's epoll selector, the gRPC
door's wake-up socket), and :meth:`Door.on_ready` does the door's non-blocking work when
it is readable; :meth:`Door.tick` runs its timers (connections past their timeout).
"""

from __future__ import annotations

import collections
import hmac
import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from cis.core.logs import event
from cis.runtime import protocol as P
from cis.runtime.oip.codec import VERSION, InferRequest
from cis.runtime.requests import Request
from cis.runtime.wire import is_traceparent, is_tracestate

if TYPE_CHECKING:
    from cis.runtime.node_config import NodeConfig

log = logging.getLogger("cis.runtime.node")
LOOPBACK = "127.0.0.1"
_wire_ids = itertools.count(1)


@dataclass
class DoorConfig:
    """One door's settings (``cis serve --http-*`` / ``--grpc-*`` / ``--door-*``; docs/runtime.md, *Limits of the
    front door*)."""

    port: int  # 0: a free port
    host: str | None = None  # None: every interface (0.0.0.0) with TLS and a token, else loopback only
    cert: str | None = None  # TLS certificate chain (PEM) and its private key
    key: str | None = None
    token: str | None = None  # bearer token: every request but the health checks must carry it
    timeout: float = 30.0  # seconds for a request to arrive whole, and for an idle connection to stay
    max_connections: int = 10000  # HTTP connections open at once; beyond, the longest idle one is closed
    max_body: int = 64 << 20  # bytes of one request (HTTP body, gRPC message): --door-max-request-bytes
    head_timeout: float = 10.0  # seconds for a TLS handshake, and for a request's line and headers (<= timeout)
    max_json: int = 4 << 20  # bytes of a request's JSON (HTTP: the body, or its JSON header with binary data)
    max_buffered: int = 256 << 20  # bytes all of the node's doors may hold of unfinished requests

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def bind_host(self) -> str:
        if self.host:
            return self.host
        return "0.0.0.0" if self.tls and self.token else LOOPBACK


class Budget:
    """The bytes all of a node's doors may hold of unfinished requests (``--door-max-buffered-bytes``): taken
    before they are buffered, given back the moment the door lets go of them. Shared by the node's doors (the
    gRPC door takes from grpcio's threads, hence the lock)."""

    __slots__ = ("limit", "held", "lock")

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.held -= n

    def refusal(self, n: int) -> str:
        return (
            f"the front doors hold {self.held} bytes of unfinished requests; {n} more would pass "
            f"--door-max-buffered-bytes {self.limit}; retry later"
        )


def bearer(value: bytes | str | None, token: bytes) -> bool:
    """Whether an Authorization value carries ``token`` as a bearer token (the scheme in any case, RFC 7235)."""
    if value is None:
        return False
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
    scheme, _, given = raw.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


def trace_context(value: bytes | str | None) -> str | None:
    """A caller's ``traceparent`` as the node takes it: a version-00 one as it came; one of a later version
    (W3C: parse its first four fields, ignore what follows) as version 00 of the same ids; anything else as it
    came (the node starts a new trace for it)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    later = text[:2] not in ("00", "ff") and _HEX2.fullmatch(text[:2]) is not None
    if later and len(text) >= 55 and (len(text) == 55 or text[55] == "-"):  # 4 fields, or more after a dash
        return "00" + text[2:55]
    return text


_HEX2 = re.compile(r"[0-9a-f]{2}")


def trace_state(traceparent: str | None, lines: list[bytes] | list[str]) -> str:
    """A caller's ``tracestate`` as the node carries it beside ``traceparent`` (as :func:`trace_context` took
    it): its header lines (gRPC: metadata values) joined with commas (HTTP's rule for a list), the spaces and
    tabs around each member taken off (W3C's optional whitespace). "" (dropped; W3C: a tracestate that cannot
    be parsed must not fail the request) when the traceparent is none or not valid (W3C: no tracestate
    without it), or when that is not a tracestate the wire carries (docs/protocol.md, *Trace context*), over
    512 characters included (W3C would let a participant cut whole members off; this door drops it all)."""
    if not lines or traceparent is None or not is_traceparent(traceparent):
        return ""
    texts = (v.decode("latin-1") if isinstance(v, bytes) else v for v in lines)
    text = ",".join(member.strip(" \t") for t in texts for member in t.split(","))
    return text if is_tracestate(text) else ""


def versions(node: Any) -> list[str]:
    """The bundle versions a node holds, newest last: its ``versions`` (bundle ids, where the node keeps them),
    else the id of the bundle it serves (the first 16 hex digits of its manifest's sha256), else ``["1"]``."""
    held = getattr(node, "versions", None)
    if held:
        return [str(v) for v in held]
    sha = getattr(getattr(node, "cfg", None), "bundle_sha256", "") or ""
    return [sha[:16]] if sha else [VERSION]


def url(scheme: str, host: str, port: int) -> str:
    shown = LOOPBACK if host in ("0.0.0.0", "::", "") else host
    return f"{scheme}://{'[' + shown + ']' if ':' in shown else shown}:{port}"


def announce(door: str, node_id: str, where: str, cfg: DoorConfig, model: str) -> None:
    """The door's start line; it says when it listens on loopback only, and warns when it listens
    elsewhere without TLS or without a token."""
    host = cfg.bind_host
    note = ""
    if not cfg.host and host == LOOPBACK:
        note = f"; binds {LOOPBACK} only (no TLS and bearer token): --http-host HOST opens it"
    elif host in ("0.0.0.0", "::", ""):  # the URL shown is loopback's, one that connects from here
        note = f"; listens on every interface ({host or '0.0.0.0'})"
    if host not in (LOOPBACK, "::1", "localhost") and not (cfg.tls and cfg.token):
        missing = " and ".join(w for w, ok in (("TLS", cfg.tls), ("a bearer token", cfg.token)) if not ok)
        event(
            log, logging.WARNING, "door_open",
            f"node {node_id}: {door} front door on {host or '0.0.0.0'} without {missing}",
            node=node_id, door=door, host=host,
        )  # fmt: skip
    event(
        log, logging.INFO, "door_start",
        f"node {node_id}: {door} front door at {where} (model {model!r}"
        f"{', TLS' if cfg.tls else ''}{', bearer token' if cfg.token else ''}){note}",
        node=node_id, door=door, url=where, host=host, tls=cfg.tls, token=bool(cfg.token),
    )  # fmt: skip


class Ticket:
    """Where a door request's answer goes: the door, the door's own handle (a connection, a waiting
    RPC), and the decoded request (its id, the outputs it wants, its ``traceparent``); ``req_id``: the id of a
    request that could not be decoded, where it was read."""

    __slots__ = ("door", "handle", "request", "answer", "req_id")

    def __init__(self, door: Door, handle: Any, request: InferRequest | None, req_id: str | None = None) -> None:
        self.door, self.handle, self.request, self.req_id = door, handle, request, req_id
        self.answer: Any = None  # what the door keeps of the answer until it is sent

    @property
    def traceparent(self) -> str | None:
        return self.request.traceparent if self.request is not None else None

    @property
    def id(self) -> str | None:
        return self.request.id if self.request is not None else self.req_id


class Door(Protocol):
    url: str
    kind: str  # "http" or "grpc": the door label of its metrics
    budget: Budget  # the bytes of unfinished requests it may hold (shared by the node's doors)
    refused: collections.Counter  # limit name -> requests or connections that limit refused or closed

    @property
    def connections(self) -> int:
        """Open connections (HTTP) or calls in progress (gRPC)."""

    def open(self, node: DoorNode) -> None:
        """Bind and start; ``node`` is the cis.runtime.node.Node whose loop polls :meth:`fileno`."""

    def fileno(self) -> int: ...

    def on_ready(self) -> None:
        """The descriptor is readable: do what waits, without blocking."""

    def tick(self, now: float) -> float:
        """Timers at monotonic ``now``; returns when to be called again."""

    def result(self, ticket: Ticket, req: Request) -> None: ...

    def error(self, ticket: Ticket, code: str, message: str) -> None: ...

    def close(self) -> None: ...


class DoorNode(Protocol):
    """What the front doors use of their node (:class:`cis.runtime.node.Node`, which imports this module, so
    the doors name it by this protocol): its settings and counters, its executor (queue depth, timings), the
    node's own path for a decoded request (``admit``) and for one it refuses, and the poll loop's bookkeeping."""

    cfg: NodeConfig
    counters: collections.Counter
    outcomes: collections.Counter
    executor: Any  # cis.runtime.executor.Executor (its queue, timings); named here it would close an import circle
    stopping: bool
    doors: list[Door]
    door_fds: dict[int, Door]
    poll_items: list[tuple[Any, int]]
    door_due: float
    observe_latency: Callable[[float], None] | None

    def admit(self, prefix: Any, msg: P.Message) -> None: ...

    def refuse(self, prefix: Any, req_id: int, code: str, message: str, kind: str | None, v: int = ...) -> None: ...


def answered_by(req: Request, named: str | None) -> str | None:
    """The ``model_version`` of a door's reply: the bundle that answered (the one the request was admitted with),
    not the newest held (during a rollout's load phase that one is held but does not serve yet)."""
    version = getattr(req.version, "id", "")
    return version or named


def result_arrays(req: Request) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A complete request's class, confidence, exit and flags as arrays (a parent's answer passed on whole
    may still be its raw frames)."""
    out = []
    for a, dt in ((req.cls, np.int64), (req.conf, np.float32), (req.exit, np.int32), (req.flags, np.uint8)):
        out.append(a if type(a) is np.ndarray else np.frombuffer(a, dt))
    return out[0], out[1], out[2], out[3]


def message(request: InferRequest) -> P.Message:
    """The INFER message a door request becomes: stage 1, the request's tensors, its deadline (from the
    request's timeout), the caller's ``traceparent`` as it came (the node's tracing starts a new trace when it
    is not a valid one) and its ``tracestate`` (only beside a valid traceparent: :func:`trace_state`),
    ``want_logits`` when it names ``logits`` or ``probabilities``. The node sees it as it sees a decoded ZeroMQ
    INFER."""
    deadline = time.time() + request.timeout if request.timeout else 0.0
    head = P.InferHeader(
        v=1, id=next(_wire_ids), deadline=deadline, traceparent=request.traceparent or "",
        tracestate=request.tracestate, want_logits=request.wants_logits,
    )  # fmt: skip
    return P.Message(head, tensors=request.tensors)


def submit(node: DoorNode, ticket: Ticket) -> None:
    """Hand a decoded request to the node's normal path (:meth:`cis.runtime.node.Node.admit`)."""
    assert ticket.request is not None
    node.admit(ticket, message(ticket.request))


def refuse(node: DoorNode, ticket: Ticket, code: str, text: str) -> None:
    """A request the door could not decode: counted by the node as an ``infer`` with that outcome, answered
    through the ticket (as the node answers a ZeroMQ request it cannot decode)."""
    node.refuse(ticket, 0, code, text, P.INFER)


def open_doors(node: DoorNode) -> None:
    """Bind each of a node's doors and add its descriptor to the node's poll items (Node.open)."""
    for door in node.doors:
        door.open(node)
        node.door_fds[door.fileno()] = door
        node.poll_items.append((door.fileno(), zmq.POLLIN))
    node.door_due = time.monotonic() if node.doors else math.inf
