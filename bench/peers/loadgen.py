"""The peers benchmark's transports over the one load generator (:mod:`cis.runtime.loadgen`, ``cis bench``).

Request i (one sample, batch 1) goes to its entry node at its scheduled time (Poisson arrivals at a rate, or one
after another), whatever happened to the requests before it, and per request is recorded the seconds from its
send to its answer, or why there was none: ``refused`` (the server answered with an error: cis's
``overloaded``, an HTTP 503, Ray's back-pressure) or ``timeout`` (no answer within the limit). The same schedule,
inputs and entry nodes drive every system; only the transport differs:

- :class:`CisNative`: the load generator's zmq transport (:class:`cis.Client` per entry node, read from
  asyncio's loop), reached by node id;
- :class:`RayHandle`: a Ray Serve ``DeploymentHandle`` (``handle.infer.remote(node, x)``, awaited), a transport
  of the load generator's own kind;
- :class:`OipHttp`: tritonclient's synchronous HTTP client (``tritonclient.http``, geventhttpclient, a greenlet
  per request in flight: :func:`drive_sync`), the Open Inference Protocol's infer call with each sample's body
  made once, for cis's front door, Ray Serve's HTTP ingress, KServe, MLServer and a null endpoint: the one HTTP
  client every server is measured with (docs/runtime.md, *cis or Ray Serve?*), so it keeps its own driver.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cis.core.records import latency_summary
from cis.core.stages.contract import INPUT
from cis.runtime.load_transports import Answer, Refused, Transport, ZmqTransport
from cis.runtime.loadgen import drive as run_drive
from cis.runtime.loadgen import schedule


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
            **self.extra,  # native paths: served_at, {node: answers}
        }


def offsets_of(rate: float | None, n: int, seed: int = 0) -> np.ndarray | None:
    """Send times of ``n`` Poisson arrivals at ``rate`` (the load generator's schedule); None: one by one."""
    return None if rate is None else schedule("poisson", rate, requests=n, seed=seed)


async def drive(transport: Transport, x: np.ndarray, nodes: Sequence[str], offsets: np.ndarray | None,
                timeout: float = 2.0, keep_answers: bool = False, target_rate: float | None = None) -> Run:  # fmt: skip
    """Send ``x[i]`` (as a batch of one) to ``nodes[i]`` at ``offsets[i]`` s (None: one after another, each once
    the last is answered) with the load generator (:func:`cis.runtime.loadgen.drive`); wait for every answer or
    its timeout."""
    bodies = [transport.encode(x[i : i + 1], INPUT) for i in range(len(nodes))]
    sent, latency, errors, answers, seconds = await run_drive(transport, bodies, nodes, offsets, timeout)
    outcomes = []
    served_at: dict[str, int] = {}  # node -> answers it served: 'forced' runs show every one went to the root
    for i in range(len(nodes)):
        a = answers[i] if errors[i] is None else None
        got = None if a is None or not keep_answers else {"cls": [a.cls], "exit": [a.exit], "node": [a.node],
                                                          "confidence": [a.confidence]}  # fmt: skip
        if a is not None:
            served_at[a.node] = served_at.get(a.node, 0) + 1
        outcomes.append(Outcome(float(sent[i]), None if errors[i] else float(latency[i]), errors[i], got))
    lag = float(np.percentile(np.maximum(0.0, sent - offsets), 99)) if offsets is not None and len(nodes) else 0.0
    return Run(outcomes, seconds, target_rate, lag, {"served_at": served_at})


def holds(summary: dict, p99_limit: float) -> bool:
    """A rate is held when every request was answered, p99 stayed under the limit and the generator kept up
    (99 % of its sends within half that limit of their scheduled times: else the rate was not offered)."""
    kept_up = summary["lag_p99_s"] <= p99_limit / 2
    return summary["answered"] == summary["requests"] and summary["p99_all_s"] < p99_limit and kept_up


# ---------------------------------------------------------------- transports


class CisNative(ZmqTransport):
    """The load generator's zmq transport (cis.Client per entry node), reached by node id."""

    name = "cis (cis.Client, ZeroMQ)"

    def __init__(self, addresses: dict[str, str], timeout: float = 30.0):
        super().__init__(timeout)
        self.addresses = addresses

    async def call(self, address: str, body: dict[str, np.ndarray]) -> Answer:
        return await super().call(self.addresses.get(address, address), body)


class RayHandle:
    """A Ray Serve DeploymentHandle to the devices deployment, from a driver connected to the cluster: a
    transport of the load generator's kind (:class:`cis.runtime.load_transports.Transport`). ``get`` gives the
    handle; it is asked for on the first call, on the load's event loop (Ray's throughput-optimized mode binds a
    handle's router to the loop it is first used on)."""

    name = "Ray Serve (DeploymentHandle)"

    def __init__(self, get: Callable[[], Any]):
        self.get = get
        self.handle: Any = None

    async def describe(self, address: str) -> list:
        return []

    def encode(self, x: np.ndarray, input_name: str) -> np.ndarray:
        return x

    async def call(self, node: str, x: np.ndarray) -> Answer:
        if self.handle is None:
            self.handle = self.get()
        try:
            got = await self.handle.infer.remote(node, x)
        except Exception as exc:  # Ray's back-pressure and its other refusals: an error answer
            raise Refused(type(exc).__name__) from None
        return Answer(int(got["cls"][0]), int(got["exit"][0]), str(got["node"][0]),
                      confidence=float(got["confidence"][0]))  # fmt: skip

    async def close(self) -> None:
        pass


# tritonclient's client posts bytes with no content type of its own: say JSON when it is JSON (KServe reads a body
# it is not told is JSON as Triton's binary extension), and ask for no compression (MLServer would gzip)
JSON_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
BINARY_HEADERS = {"Accept-Encoding": "identity"}
_BODIES: dict[tuple, tuple[bytes, int | None]] = {}  # (input name, binary, sample's bytes) -> body, JSON size


class OipHttp:
    """tritonclient's synchronous HTTP client (``tritonclient.http``, geventhttpclient underneath, one greenlet
    per request in flight): ``infer`` in the Open Inference Protocol, to each entry node's URL, on ``model``
    (None: the model is named after the entry node, as Ray's ingress here); ``input_name`` is the model's input
    (cis's front door: from its metadata). The input goes as JSON, or with ``binary`` as Triton's binary tensor
    extension (cis's front door and KServe read it; MLServer and the Ray app here do not).

    As light as tritonclient allows, the same for every server: each sample's request body is made once
    (:meth:`prepare`, tritonclient's ``generate_request_body``, outside the timed run) and posted as
    ``InferenceServerClient.infer`` posts it (its ``_post``: the client's plugins, headers and connection pool),
    the answer read as ``infer`` reads it (``InferResult``). Driven by :func:`drive_sync`, not asyncio."""

    name = "Open Inference Protocol over HTTP (tritonclient.http, geventhttpclient)"

    def __init__(self, urls: dict[str, str], model: str | None = "cis", input_name: str = "input",
                 binary: bool = False, concurrency: int = 256):  # fmt: skip
        import tritonclient.http as th

        self._th = th
        self.urls, self.model, self.input_name, self.binary = urls, model, input_name, binary
        self.concurrency = concurrency
        self.headers = BINARY_HEADERS if binary else JSON_HEADERS
        self.clients: dict = {}

    def open(self, timeout: float) -> None:
        """One client per URL, each with up to ``concurrency`` connections; a connection that gives no answer
        within ``timeout`` s is closed (geventhttpclient's network timeout)."""
        self.clients = {u: self._th.InferenceServerClient(url=u.split("://", 1)[-1], concurrency=self.concurrency,
                                                          network_timeout=timeout)
                        for u in set(self.urls.values())}  # fmt: skip

    def body(self, x: np.ndarray) -> tuple[bytes, int | None]:
        """The request body of one batch (and its JSON part's size with binary input), made once per sample."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        key = (self.input_name, self.binary, x.shape, x.tobytes())
        got = _BODIES.get(key)
        if got is None:
            inp = self._th.InferInput(self.input_name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=self.binary)
            got = _BODIES[key] = self._th.InferenceServerClient.generate_request_body([inp])
        return got

    def prepare(self, x: np.ndarray) -> list[tuple[bytes, int | None]]:
        return [self.body(x[i : i + 1]) for i in range(len(x))]

    def post(self, node: str, prepared: tuple[bytes, int | None], keep: bool = False) -> dict | None:
        """One infer call (``InferenceServerClient.infer`` with its body made already); with ``keep``, the outputs
        as lists (tritonclient asks for binary outputs where the server has the extension: read as numpy)."""
        body, json_size = prepared
        model = self.model or node
        headers = dict(self.headers)
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        response = self.clients[self.urls[node]]._post(f"v2/models/{model}/infer", body, headers, None)
        if response.status_code != 200:
            response.read()
            raise Refused(str(response.status_code))
        result = self._th.InferResult(response, False)
        if not keep:
            return None
        outputs = result.get_response().get("outputs", [])
        out = {o["name"]: result.as_numpy(o["name"]).ravel().tolist() for o in outputs}
        return {"outputs": out, "parameters": result.get_response().get("parameters") or {}}

    def close(self) -> None:
        for c in self.clients.values():
            c.close()


def drive_sync(transport: OipHttp, x: np.ndarray, nodes: Sequence[str], offsets: np.ndarray | None,
               timeout: float = 2.0, keep_answers: bool = False, target_rate: float | None = None) -> Run:  # fmt: skip
    """:func:`drive` for the synchronous HTTP client: a greenlet per request (gevent, what tritonclient's
    ``async_infer`` uses), the bodies made before the first send."""
    import gevent

    bodies = transport.prepare(x[: len(nodes)])
    transport.open(timeout)
    n = len(nodes)
    outcomes: list[Outcome | None] = [None] * n
    lags: list[float] = []

    def one(i: int, t_send: float) -> None:
        try:
            with gevent.Timeout(timeout + 5.0):  # a backstop: the connection's own timeout comes first
                got = transport.post(nodes[i], bodies[i], keep_answers)
            lat = time.perf_counter() - t_send
            late = lat > timeout  # waited for a free connection, then answered: too late all the same
            outcomes[i] = Outcome(t_send - start, None if late else lat, "timeout" if late else None,
                                  got if keep_answers and not late else None)  # fmt: skip
        except gevent.Timeout:
            outcomes[i] = Outcome(t_send - start, None, "timeout")
        except Refused as exc:
            outcomes[i] = Outcome(t_send - start, None, exc.code)
        except OSError as exc:  # the connection broke or its own timeout ran out: no answer
            outcomes[i] = Outcome(t_send - start, None, "timeout" if "timed out" in str(exc) else "refused")

    start = time.perf_counter()
    greenlets = []
    for i in range(n):
        if offsets is None:
            one(i, time.perf_counter())
            continue
        due = start + float(offsets[i])
        wait = due - time.perf_counter()
        if wait > 0:
            gevent.sleep(wait)
        now = time.perf_counter()
        lags.append(max(0.0, now - due))
        greenlets.append(gevent.spawn(one, i, now))
    gevent.joinall(greenlets)
    seconds = time.perf_counter() - start
    lag = float(np.percentile(lags, 99)) if lags else 0.0
    return Run([o for o in outcomes if o is not None], seconds, target_rate, lag)
