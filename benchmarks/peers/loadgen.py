"""One open-loop load generator for every system the peers benchmark drives, over three transports.

The generator sends request i (one sample, batch 1) to its entry node at its scheduled time (Poisson
arrivals at a rate, or back to back), whatever happened to the requests before it, and records per request
the seconds from its send to its answer, or why there was none: ``refused`` (the server answered with an
error: cis's ``overloaded``, an HTTP 503, Ray's back-pressure) or ``timeout`` (no answer within the limit).
The same schedule, inputs and entry nodes drive every system; only the transport differs:

- :class:`CisNative`: :class:`cis.Client`, one per entry node, read from asyncio's loop (the ZeroMQ path);
- :class:`RayHandle`: a Ray Serve ``DeploymentHandle`` (``handle.infer.remote(node, x)``, awaited);
- :class:`OipHttp`: tritonclient's asyncio HTTP client (``tritonclient.http.aio``), the Open Inference
  Protocol's infer call in JSON, for cis's front door, Ray Serve's HTTP ingress, KServe and MLServer.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cis.metrics import latency_summary


class Refused(Exception):
    """The server answered with an error instead of a result (``code``: its error code or HTTP status)."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class Transport(Protocol):
    name: str

    async def call(self, node: str, x: np.ndarray) -> dict: ...

    async def close(self) -> None: ...


@dataclass
class Outcome:
    sent: float  # seconds from the run's start to the send
    latency: float | None  # seconds from the send to the answer; None without one
    error: str | None = None  # None: answered; "timeout"; or the refusal's code
    answer: dict | None = None  # cls, exit, node (lists): what served it


@dataclass
class Run:
    outcomes: list[Outcome]
    seconds: float  # from the first send to the last outcome
    target_rate: float | None
    lag_p99_s: float  # how late the generator sent, 99th percentile (its own limit)
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        ok = [o.latency for o in self.outcomes if o.error is None and o.latency is not None]
        errors: dict[str, int] = {}
        for o in self.outcomes:
            if o.error is not None:
                key = "timeout" if o.error == "timeout" else "refused"
                errors[key] = errors.get(key, 0) + 1
        n = len(self.outcomes)
        span = max((o.sent for o in self.outcomes), default=0.0)
        lat = latency_summary(ok) if ok else {}
        # p99 over every request, a missing answer counting as infinitely late: what "holds p99" means
        every = sorted([*ok, *([math.inf] * (n - len(ok)))])
        p99_all = every[min(n - 1, math.ceil(0.99 * n) - 1)] if n else math.nan
        return {
            "requests": n,
            "answered": len(ok),
            "refused": errors.get("refused", 0),
            "timed_out": errors.get("timeout", 0),
            "target_rate": self.target_rate,
            "sent_rate": (n - 1) / span if span > 0 else None,
            "answered_rate": len(ok) / self.seconds if self.seconds > 0 else None,
            "lag_p99_s": self.lag_p99_s,
            "p50_s": lat.get("p50_s"),
            "p99_s": lat.get("p99_s"),
            "mean_s": lat.get("mean_s"),
            "max_s": lat.get("max_s"),
            "p99_all_s": p99_all,
        }


def poisson_offsets(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """Send times (seconds from the start) of ``n`` Poisson arrivals at ``rate`` per second."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps)[:-1]])


async def drive(
    transport: Transport,
    x: np.ndarray,
    nodes: Sequence[str],
    offsets: np.ndarray | None,
    timeout: float = 2.0,
    keep_answers: bool = False,
    target_rate: float | None = None,
) -> Run:
    """Send ``x[i]`` (as a batch of one) to ``nodes[i]`` at ``offsets[i]`` s (None: one after another, each
    once the last is answered); wait for every answer or its timeout."""
    n = len(nodes)
    outcomes: list[Outcome | None] = [None] * n
    lags: list[float] = []

    async def one(i: int, t_send: float) -> None:
        try:
            got = await asyncio.wait_for(transport.call(nodes[i], x[i : i + 1]), timeout)
            lat = time.perf_counter() - t_send
            outcomes[i] = Outcome(t_send - start, lat, None, got if keep_answers else None)
        except asyncio.TimeoutError:
            outcomes[i] = Outcome(t_send - start, None, "timeout")
        except Refused as exc:
            outcomes[i] = Outcome(t_send - start, None, exc.code)

    start = time.perf_counter()
    tasks = []
    for i in range(n):
        if offsets is None:
            await one(i, time.perf_counter())
            continue
        due = start + float(offsets[i])
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        now = time.perf_counter()
        lags.append(max(0.0, now - due))
        tasks.append(asyncio.ensure_future(one(i, now)))
    if tasks:
        await asyncio.gather(*tasks)
    seconds = time.perf_counter() - start
    lag = float(np.percentile(lags, 99)) if lags else 0.0
    return Run([o for o in outcomes if o is not None], seconds, target_rate, lag)


def holds(summary: dict, p99_limit: float) -> bool:
    """A rate is held when every request was answered, p99 stayed under the limit and the generator kept up
    (99 % of its sends within half that limit of their scheduled times: else the rate was not offered)."""
    kept_up = summary["lag_p99_s"] <= p99_limit / 2
    return summary["answered"] == summary["requests"] and summary["p99_all_s"] < p99_limit and kept_up


# ---------------------------------------------------------------- transports


class CisNative:
    """cis.Client per entry node, its ZeroMQ socket read from asyncio's loop."""

    name = "cis (cis.Client, ZeroMQ)"

    def __init__(self, addresses: dict[str, str], timeout: float = 30.0):
        import zmq

        from cis.runtime.client import Client

        self._zmq = zmq
        self.clients = {node: Client(addr, timeout=timeout) for node, addr in addresses.items()}
        self.pending: dict[tuple[str, int], asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _attach(self) -> None:
        self._loop = asyncio.get_running_loop()
        for node, c in self.clients.items():
            self._loop.add_reader(c.sock.getsockopt(self._zmq.FD), self._drain, node)

    def _drain(self, node: str) -> None:
        """Read every reply waiting (ZeroMQ's descriptor is edge-triggered: read until nothing is left)."""
        for rid, res in self.clients[node].poll(0):
            fut = self.pending.pop((node, rid), None)
            if fut is None or fut.done():
                continue
            if res.error is not None:
                fut.set_exception(Refused(res.error.code))
            else:
                fut.set_result({"cls": res.cls.tolist(), "exit": res.exit.tolist(), "node": list(res.served_by),
                                "confidence": res.confidence.tolist()})  # fmt: skip

    async def call(self, node: str, x: np.ndarray) -> dict:
        if self._loop is None:
            self._attach()
        assert self._loop is not None
        fut = self._loop.create_future()
        rid = self.clients[node].submit(x)
        self.pending[(node, rid)] = fut
        self._drain(node)  # the send may have taken the descriptor's edge of a reply already here
        try:
            return await fut
        finally:
            self.pending.pop((node, rid), None)

    async def close(self) -> None:
        for c in self.clients.values():
            if self._loop is not None:
                self._loop.remove_reader(c.sock.getsockopt(self._zmq.FD))
            c.close()


class RayHandle:
    """A Ray Serve DeploymentHandle to the devices deployment, from a driver connected to the cluster."""

    name = "Ray Serve (DeploymentHandle)"

    def __init__(self, handle):
        self.handle = handle

    async def call(self, node: str, x: np.ndarray) -> dict:
        try:
            got = await self.handle.infer.remote(node, x)
        except Exception as exc:  # Ray's back-pressure and its other refusals: an error answer
            raise Refused(type(exc).__name__) from None
        return {"cls": got["cls"].tolist(), "exit": got["exit"].tolist(), "node": list(got["node"]),
                "confidence": got["confidence"].tolist()}  # fmt: skip

    async def close(self) -> None:
        pass


# tritonclient's asyncio client posts bytes (aiohttp then says application/octet-stream, which KServe reads as
# Triton's binary extension) and reads bodies undecoded while aiohttp asks for gzip (which MLServer sends):
# say JSON when it is JSON, and ask for no compression
JSON_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
BINARY_HEADERS = {"Accept-Encoding": "identity"}


class OipHttp:
    """tritonclient's asyncio HTTP client: ``infer`` in the Open Inference Protocol, to each entry node's URL, on
    ``model`` (None: the model is named after the entry node, as Ray's ingress here); ``input_name`` is the
    model's input (cis's front door: from its metadata). The input goes as JSON, or with ``binary`` as Triton's
    binary tensor extension (cis's front door and KServe read it; MLServer and the Ray app here do not)."""

    name = "Open Inference Protocol over HTTP (tritonclient)"

    def __init__(self, urls: dict[str, str], model: str | None = "cis", input_name: str = "input",
                 conn_limit: int = 256, binary: bool = False):  # fmt: skip
        import tritonclient.http.aio as aio

        self._aio = aio
        self.urls, self.model, self.input_name, self.binary = urls, model, input_name, binary
        self.headers = BINARY_HEADERS if binary else JSON_HEADERS
        self.clients = {u: aio.InferenceServerClient(url=u.split("://", 1)[-1], conn_limit=conn_limit)
                        for u in set(urls.values())}  # fmt: skip

    async def call(self, node: str, x: np.ndarray) -> dict:
        from tritonclient.utils import InferenceServerException

        url, model = self.urls[node], self.model or node
        inp = self._aio.InferInput(self.input_name, list(x.shape), "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(x, dtype=np.float32), binary_data=self.binary)
        try:
            result = await self.clients[url].infer(model, [inp], headers=self.headers)
        except InferenceServerException as exc:
            raise Refused(str(exc.status() or "error")) from None
        out = {}
        for o in result.get_response().get("outputs", []):
            out[o["name"]] = list(o.get("data", []))
        params = result.get_response().get("parameters") or {}
        return {"outputs": out, "parameters": params}

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()
