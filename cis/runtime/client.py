"""``cis.Client``: send batches to a node, get per-sample answers.

    with Client("tcp://127.0.0.1:5553") as c:
        r = c.infer(x)                 # one request with the whole batch
        r = c.infer(x, traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")  # joins a trace
        r.cls, r.confidence, r.exit, r.served_by, r.degraded, r.latency
        r = c.infer(x, logits=True)    # also the answering exit's logits: r.logits (N, C), r.probabilities
        r.bundle                       # the id of the bundle that answered (docs/protocol.md, *Bundle identity*)
        c.control("load", path="/srv/bundle-v2")   # update kinds: load, switch, drop, reload -> the node's status
        rs = c.infer_many(x, batch_size=1, window=64)   # pipelined: many requests in flight

    with Client(["tcp://10.0.0.5:5553", "tcp://10.0.0.6:5553"]) as c:   # several entry nodes (replicas)
        ...                            # spread over the connected ones; a request whose node died is retried

One DEALER socket per address (:mod:`cis.runtime.entries`: where each request goes, and its one retry when its
entry node dies); not thread-safe (use one Client per thread).
Requests that name no bundle go as protocol version 1 (which they are), so the client talks to nodes of
either version.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import zmq

from cis.core.errors import CisError
from cis.core.policy.confidence import softmax
from cis.runtime import protocol as P
from cis.runtime.client_checks import (
    check_pacing,
    check_spread,
    check_timeout,
    client_addresses,
    request_array,
    request_samples,
)
from cis.runtime.entries import RETRY_AFTER, RETRY_CODES, Entries
from cis.runtime.security import CurveConfig
from cis.runtime.tracing import trace_fields

_NO_LIMIT = 1 << 62  # a client reads whatever its node sends
_NONE: dict = {}  # no more header fields
_WANT_LOGITS = {"want_logits": True}


class ServerError(CisError):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Result:
    """The answer to one request: per sample class, confidence, exit, flags and serving node."""

    cls: np.ndarray
    confidence: np.ndarray
    exit: np.ndarray
    flags: np.ndarray
    served_by: list[str]
    latency: float  # seconds from send to reply, seen by the client
    error: ServerError | None = None
    sent: float = math.nan  # time.perf_counter() when the request was sent (cis infer --out: sent_s)
    logits: np.ndarray | None = None  # (N, C) float32, the answering exit's: only when asked for (logits=True)
    bundle: str = ""  # the id of the bundle that answered every sample ("" from a node without one, or an error)
    retried: bool = False  # sent a second time (its entry node died or did not answer in time: cis.runtime.entries)

    @property
    def probabilities(self) -> np.ndarray | None:
        """The softmax of :attr:`logits` (float32 (N, C)); None without logits."""
        return None if self.logits is None else softmax(self.logits).astype(np.float32)

    @property
    def degraded(self) -> np.ndarray:
        return (self.flags & P.FLAG_DEGRADED).astype(bool)

    @property
    def capped(self) -> np.ndarray:
        return (self.flags & P.FLAG_CAPPED).astype(bool)

    @property
    def nonfinite(self) -> np.ndarray:
        """Samples whose input held NaN/inf, answered with class -1 (only from nodes run with --nonfinite flag)."""
        return (self.flags & P.FLAG_NONFINITE).astype(bool)

    def __len__(self) -> int:
        return len(self.cls)

    def samples(self) -> list[dict]:
        return [
            {"class": int(c), "confidence": float(p), "exit": int(e), "node": s, "latency": self.latency,
             "degraded": bool(d), "capped": bool(k)}
            for c, p, e, s, d, k in zip(
                self.cls, self.confidence, self.exit, self.served_by, self.degraded, self.capped
            )
        ]  # fmt: skip


def _error_result(n: int, err: ServerError, latency: float, sent: float = math.nan, retried: bool = False) -> Result:
    return Result(np.full(n, -1, np.int64), np.zeros(n, np.float32), np.zeros(n, np.int32), np.zeros(n, np.uint8),
                  [""] * n, latency, err, sent, retried=retried)  # fmt: skip


class Client:
    """Requests to one entry node, or spread over several (``address``: a list; e.g. a node's replicas). A request
    whose entry node died (its connection closed, ``shutting_down``, or no reply within ``retry_after`` s) is
    sent once more with the same id, to another entry node or to the same one once it is back; ``retry_after``
    None or 0: never (docs/runtime.md, *Clients*)."""

    def __init__(
        self,
        address: str | Sequence[str],
        timeout: float = 30.0,
        input_name: str = "input",
        curve: CurveConfig | None = None,
        context: zmq.Context | None = None,
        retry_after: float | None = RETRY_AFTER,
    ):
        addresses = client_addresses(address)
        check_timeout(timeout)
        self.address = ", ".join(addresses)
        self.timeout = timeout
        self.input_name = input_name
        self._ctx = context or zmq.Context.instance()
        self.entries = Entries(self._ctx, addresses, curve, retry_after)
        self.sock = self.entries.socks[0]  # status() asks the first entry node
        self._poller = zmq.Poller()  # one poller for the sockets' life (Socket.poll builds one per call)
        for sock in self.entries.socks:
            self._poller.register(sock, zmq.POLLIN)
        self._watching = False
        self._ids = itertools.count(1)
        self._sent: dict[int, tuple[float, int]] = {}

    # ------------------------------------------------------------ async form

    def submit(
        self,
        batch: np.ndarray | dict,
        deadline: float | None = None,
        stage: int = 1,
        traceparent: str | None = None,
        logits: bool = False,
        bundle: str | None = None,
        tracestate: str | None = None,
    ) -> int:
        """Send one request (a batch of samples) without waiting; returns its id. ``traceparent``: a W3C trace
        context (``00-<trace id>-<span id>-<flags>``) the request joins (docs/runtime.md, *Tracing*), and
        ``tracestate`` its W3C tracestate (only beside a traceparent), which every node passes on; ``logits``:
        the answer also carries the logits of the exit that answered each sample (``Result.logits``); ``bundle``:
        a bundle id the node holds that must answer it (else ``bundle_mismatch``), instead of its current one."""
        self._check_open()
        tensors = dict(batch) if isinstance(batch, dict) else {self.input_name: request_array(batch)}
        n = request_samples(tensors)
        rid = next(self._ids)
        trace = trace_fields(traceparent, tracestate)
        want = _WANT_LOGITS if logits else _NONE
        fields = {"stage": stage, "deadline": float(deadline or 0.0), "route": [], **trace, **want}
        if bundle:
            fields["bundle"] = bundle
        frames = P.encode(P.INFER, rid, tensors, v=P.VERSION if bundle else 1, **fields)
        # timed before the send: a node on this core may run the request before the sender gets the core back
        self._sent[rid] = (time.perf_counter(), n)
        if not self._watching:  # the entry nodes' connection events (retries), polled from the first request on
            for mon in self.entries.watch():
                self._poller.register(mon, zmq.POLLIN)
            self._watching = True
        self.entries.send(rid, frames)
        return rid

    def poll(self, timeout: float) -> list[tuple[int, Result]]:
        """Results that arrive within ``timeout`` seconds (at least one if any comes); meanwhile, requests whose
        entry node died are retried (:mod:`cis.runtime.entries`)."""
        out: list[tuple[int, Result]] = []
        ready = self._poller.poll(int(max(timeout, 0) * 1000))
        while ready:
            for sock, _ in ready:
                if sock in self.entries.monitors:
                    self.entries.on_monitor(sock)
                    continue
                while True:
                    try:
                        frames, _, _ = P.recv(sock, _NO_LIMIT)
                    except zmq.Again:
                        break
                    got = self._parse(frames)
                    if got is not None:
                        out.append(got)
            ready = self._poller.poll(0)
        self.entries.due()
        return out

    def _parse(self, frames) -> tuple[int, Result] | None:
        now = time.perf_counter()
        try:
            msg = P.decode(frames, kinds=P.REPLY_KINDS)
        except P.ProtocolError:
            return None
        if msg.id not in self._sent or msg.kind not in (P.RESULT, P.ERROR):
            return None
        h = msg.head
        if isinstance(h, P.ErrorHeader) and h.code in RETRY_CODES and self.entries.retry(msg.id, lost=False):
            return None  # its entry node is going away: sent to another, its answer comes later
        t0, n = self._sent.pop(msg.id)
        retried = self.entries.tries[msg.id].retried if msg.id in self.entries.tries else False
        self.entries.done(msg.id)
        if isinstance(h, P.ErrorHeader):
            return msg.id, _error_result(n, ServerError(h.code, h.message), now - t0, t0, retried)
        assert isinstance(h, P.ResultHeader)
        t = msg.tensors
        lg = t.get(P.RESULT_LOGITS)
        return msg.id, Result(
            t["class"].copy(), t["confidence"].copy(), t["exit"].copy(), t["flags"].copy(), h.served_by, now - t0,
            sent=t0, logits=None if lg is None else lg.copy(), bundle=h.bundle, retried=retried,
        )

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    def _expired(self, timeout: float) -> list[tuple[int, tuple[float, int]]]:
        """Forget and return the requests sent more than ``timeout`` s ago. They were sent in id order, so
        only the oldest few are looked at, not every request in flight."""
        out, now, sent = [], time.perf_counter(), self._sent
        for rid, (t0, n) in sent.items():
            if now - t0 <= timeout:
                break
            out.append((rid, (t0, n)))
        for rid, _ in out:
            del sent[rid]
            self.entries.done(rid)
        return out

    # ------------------------------------------------------------ blocking forms

    def infer(
        self,
        batch: np.ndarray | dict,
        timeout: float | None = None,
        deadline: float | None = None,
        traceparent: str | None = None,
        logits: bool = False,
        tracestate: str | None = None,
    ) -> Result:
        """Send one request and wait for its answer; raises ServerError or TimeoutError. ``logits``: the answer
        carries the answering exit's logits too (``Result.logits``, ``Result.probabilities``)."""
        wait = self.timeout if timeout is None else check_timeout(timeout)
        rid = self.submit(batch, deadline, traceparent=traceparent, logits=logits, tracestate=tracestate)
        end = time.monotonic() + wait
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            for got_id, res in self.poll(min(left, 0.1)):  # 0.1 s: the retry deadline is looked at in between
                if got_id == rid:
                    if res.error is not None:
                        raise res.error
                    return res
        self._sent.pop(rid, None)
        self.entries.done(rid)
        raise TimeoutError(f"no reply from {self.address} within {wait:.1f} s")

    def infer_many(
        self,
        x: np.ndarray,
        batch_size: int = 1,
        window: int = 64,
        rate: float | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        traceparent: str | None = None,
        logits: bool = False,
        tracestate: str | None = None,
    ) -> list[Result]:
        """Pipelined: requests of ``batch_size`` samples, up to ``window`` in flight (or sent at
        ``rate`` requests/s); results in order. A request that gets no reply within ``timeout``
        seconds gets an error result with code "timeout". ``traceparent``: every request joins that trace
        (``tracestate``: with that tracestate); ``logits``: every result carries its logits."""
        check_pacing(window, rate, batch_size, timeout)
        chunks = [x[i : i + batch_size] for i in range(0, len(x), batch_size)]
        return list(self.stream(chunks, window, rate, timeout, deadline, traceparent, logits, tracestate))

    def stream(
        self,
        chunks,
        window: int = 64,
        rate: float | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        traceparent: str | None = None,
        logits: bool = False,
        tracestate: str | None = None,
    ) -> Iterator[Result]:
        check_pacing(window, rate, timeout=timeout)
        timeout = self.timeout if timeout is None else timeout
        chunks = list(chunks)
        results: dict[int, Result] = {}
        ids: list[int] = []
        start = time.perf_counter()
        nxt = 0
        emitted = 0
        while emitted < len(chunks):
            now = time.perf_counter()
            while nxt < len(chunks) and self.in_flight < window and (rate is None or now >= start + nxt / rate):
                d = time.time() + deadline if deadline else None
                ids.append(self.submit(chunks[nxt], d, traceparent=traceparent, logits=logits, tracestate=tracestate))
                nxt += 1
            wait = 0.05
            if rate is not None and nxt < len(chunks):
                wait = max(0.0, min(wait, start + nxt / rate - time.perf_counter()))
            for rid, res in self.poll(wait):
                results[rid] = res
            for rid, (t0, n) in self._expired(timeout):
                results[rid] = _error_result(
                    n, ServerError("timeout", f"no reply within {timeout:.1f} s"), time.perf_counter() - t0, t0
                )
            while emitted < len(ids) and ids[emitted] in results:
                yield results.pop(ids[emitted])
                emitted += 1

    def status(self, timeout: float = 2.0) -> dict:
        return self.control(P.STATUS, timeout, v=1)

    def control(self, kind: str, timeout: float = 2.0, v: int = P.VERSION, **fields) -> dict:
        """Send a message that a node answers with its status (``status``, or an update kind: ``load`` with
        ``path``, ``switch`` or ``drop`` with ``bundle``, ``reload``; docs/protocol.md); the node's status
        after it. Raises ServerError when the node answers an error, TimeoutError when it does not answer."""
        check_timeout(timeout)
        return self.await_status(self.send_control(kind, v, **fields), timeout, kind)

    def send_control(self, kind: str, v: int = P.VERSION, **fields) -> int:
        """Send a message without tensors (see :meth:`control`) without waiting; its id."""
        self._check_open()
        rid = next(self._ids)
        P.send(self.sock, P.encode(kind, rid, v=v, **fields))
        return rid

    def await_status(self, rid: int, timeout: float, kind: str = "") -> dict:
        """Wait for the answer to message ``rid``: the node's status (a status_reply), or ServerError (an error);
        TimeoutError when none comes within ``timeout`` seconds (other messages are dropped meanwhile)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            wait = min(max(end - time.monotonic(), 0), 3600.0)  # a poll takes a C long of ms: 1e17 s overflows it
            if not self.sock.poll(int(wait * 1000) + 1, zmq.POLLIN):
                continue
            try:
                msg = P.decode(P.recv(self.sock, _NO_LIMIT)[0], kinds=P.REPLY_KINDS)
            except (zmq.Again, P.ProtocolError):
                continue
            if msg.id != rid:
                continue
            if isinstance(msg.head, P.ErrorHeader):
                raise ServerError(msg.head.code, msg.head.message)
            if isinstance(msg.head, P.StatusReplyHeader):
                return msg.head.status
        what = "status" if kind in ("", P.STATUS) else "answer to " + kind
        raise TimeoutError(f"no {what} from {self.address} within {timeout:.1f} s")

    def close(self) -> None:
        """Close the sockets; a second close does nothing, a request after it raises CisError."""
        if not self.sock.closed:
            self.entries.close()

    def _check_open(self) -> None:
        if self.sock.closed:
            raise CisError(f"Client({self.address!r}) is closed; expected an open Client (make a new one)")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def infer_spread(
    clients: dict[str, Client],
    x: np.ndarray,
    entries: dict[str, np.ndarray],
    window: int = 32,
    rate: float | None = None,
    timeout: float = 30.0,
    times: np.ndarray | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> list[Result | None]:
    """Send sample i (one request each) to ``clients[node]`` for the node whose ``entries`` hold i,
    with up to ``window`` requests in flight per client, paced at ``rate`` requests/s in total, or
    each sample no earlier than ``times[i]`` seconds after the start (non-decreasing; e.g. Poisson).
    Returns one Result per sample in sample order (error results for errors and timeouts). ``traceparent``:
    every request joins that trace (``tracestate``: with that tracestate)."""
    check_pacing(window, rate, timeout=timeout)
    check_spread(clients, entries, len(x))
    queue = sorted((int(i), nid) for nid, idx in entries.items() for i in idx)
    if times is None and rate is not None:
        times = np.arange(len(x)) / rate
    spread = _Spread(clients, len(x))
    start, sent = time.perf_counter(), 0
    while spread.done < len(queue):
        now = time.perf_counter()
        while sent < len(queue):
            i, nid = queue[sent]
            if clients[nid].in_flight >= window or (times is not None and now < start + times[i]):
                break
            rid = clients[nid].submit(x[i : i + 1], traceparent=traceparent, tracestate=tracestate)
            spread.owner[(nid, rid)] = i
            sent += 1
        wait = 0.05
        if times is not None and sent < len(queue):
            wait = max(0.0, min(wait, start + times[queue[sent][0]] - time.perf_counter()))
        spread.collect(wait, timeout)
    return spread.results


class _Spread:
    """infer_spread's replies: one poller over every client's sockets, each sample's result."""

    def __init__(self, clients: dict[str, Client], n: int) -> None:
        self.clients = clients
        self.results: list[Result | None] = [None] * n
        self.owner: dict[tuple[str, int], int] = {}  # (node, request id) -> sample
        self.done = 0
        self.poller = zmq.Poller()
        for c in clients.values():
            for sock in c.entries.socks:
                self.poller.register(sock, zmq.POLLIN)

    def collect(self, wait: float, timeout: float) -> None:
        """Results that came within ``wait`` seconds, then the requests past ``timeout`` as timeout errors."""
        self.poller.poll(int(wait * 1000))
        for nid, c in self.clients.items():  # also each client's connection events and retries
            for rid, res in c.poll(0):
                self._put(nid, rid, res)
            for rid, (t0, n) in c._expired(timeout):
                no_reply = ServerError("timeout", f"no reply within {timeout:.1f} s")
                self._put(nid, rid, _error_result(n, no_reply, time.perf_counter() - t0, t0))

    def _put(self, nid: str, rid: int, res: Result) -> None:
        j = self.owner.pop((nid, rid), None)
        if j is not None:
            self.results[j] = res
            self.done += 1
