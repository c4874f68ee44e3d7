"""The load generator (``cis bench``): an open loop that sends requests on an arrival schedule, whatever the replies.

    from cis.runtime.loadgen import run_load
    result = run_load("tcp://127.0.0.1:5553", rate=200, arrivals="poisson", transport="zmq", duration=10)
    result.summary()          # p50/p99, the rate it held, errors by class (JSON-ready)
    result.write("out")       # out/requests.csv (cis.core.records' layout) and out/bench.json

Request i carries one sample (batch 1), ``x[i mod len(x)]``, and goes at its scheduled time (the arrival processes
of :mod:`cis.core.arrivals`: Poisson, or evenly spaced, at ``rate`` requests/s) to its address (round robin over
several, or the ones ``entries`` names), however many requests are still unanswered: an open loop, so an overloaded
server shows as latency and errors, never as a lower offered rate (a closed loop waits for answers and hides it).
Latency runs from the send to the answer; a request with no answer within ``timeout`` seconds counts as a
``timeout`` error. The generator checks itself: ``lag_p99_s`` says how late it sent (99th percentile) and
``sent_rate`` what it really offered.

One asyncio loop sends and reads for every transport (:mod:`cis.runtime.load_transports`): ``zmq`` (cis.Client's
DEALER socket), ``http`` and ``grpc`` (the Open Inference Protocol of ``cis serve --http-port/--grpc-port``, or any
server that speaks it); a caller may hand in a transport of its own (the peers benchmark's Ray Serve handle).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.arrivals import deterministic, poisson
from cis.core.arrivals import send_offsets as arrival_offsets  # loadgen's own send_offsets checks the flags
from cis.core.errors import CisError
from cis.core.policy.exit_policy import assign_entries
from cis.core.records import json_float, latency_summary, percentile_all, write_requests
from cis.core.spec import CisSpec
from cis.runtime.load_transports import TRANSPORTS, Answer, Refused, Transport, make_transport, sample_inputs

ARRIVALS = ("poisson", "uniform")
DEFAULT_DURATION = 10.0  # seconds of load when neither a duration nor a request count is given
SUMMARY_FILE = "bench.json"
REQUESTS_FILE = "requests.csv"
__all__ = ["ARRIVALS", "TRANSPORTS", "Answer", "LoadResult", "Refused", "Transport", "run_load", "run_spec_load",
           "schedule", "send_offsets", "spec_entries"]


def run_spec_load(spec: CisSpec, addresses: Mapping[str, str], rate: float, *, duration: float | None = None,
                  requests: int | None = None, seed: int = 0, arrivals: str = "poisson", **options: Any) -> LoadResult:
    """:func:`run_load` into a spec's tree: each request enters at a node with arrivals, in proportion to their
    arrival rates (:func:`spec_entries`), at ``addresses[node]``; ``targets`` are the entry nodes' ids."""
    n = requests if requests is not None else len(schedule(arrivals, rate, duration=duration, seed=seed))
    nodes, pick = spec_entries(spec, n, seed)
    missing = [nid for nid in nodes if nid not in addresses]
    if missing:
        raise CisError(f"load: no address for the entry nodes {missing}; expected one per node with arrivals")
    return run_load([addresses[nid] for nid in nodes], rate, arrivals=arrivals, requests=n, entries=pick,
                    names=nodes, seed=seed, **options)  # fmt: skip


def spec_entries(spec: CisSpec, n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Where ``n`` requests enter a spec's tree: (the nodes with arrivals, each request's index into them), in
    proportion to their arrival rates (:func:`cis.core.policy.exit_policy.assign_entries`, the offline evaluation's
    split)."""
    entries = assign_entries(spec, n, seed)
    nodes = list(entries)
    pick = np.zeros(n, dtype=np.int64)
    for k, nid in enumerate(nodes):
        pick[entries[nid]] = k
    return nodes, pick


def schedule(
    arrivals: str, rate: float, requests: int | None = None, duration: float | None = None, seed: int = 0
) -> np.ndarray:
    """Send times (seconds from the first send, which is 0) of ``requests`` requests, or of those that arrive within
    ``duration`` seconds: ``poisson`` (exponential gaps, seeded) or ``uniform`` (one every 1/rate s); all of
    :func:`send_offsets` in one array."""
    return np.fromiter(send_offsets(arrivals, rate, requests, duration, seed), dtype=float)


def send_offsets(
    arrivals: str, rate: float, requests: int | None = None, duration: float | None = None, seed: int = 0
) -> Iterator[float]:
    """:func:`schedule`'s send times one at a time, as they are due (a long ``duration`` holds none ahead);
    the arguments are checked at the call."""
    if arrivals not in ARRIVALS:
        raise CisError(f"--arrivals {arrivals}: unknown; expected one of {', '.join(ARRIVALS)}")
    if not (math.isfinite(rate) and rate > 0):
        raise CisError(f"--rate {rate:g}: expected requests per second > 0")
    if requests is not None and duration is not None:
        raise CisError("--requests and --duration: give one of the two")
    if requests is not None and requests < 1:
        raise CisError(f"--requests {requests}: expected 1 or more")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise CisError(f"--duration {duration:g}: expected seconds > 0")
    times = poisson(rate, np.random.default_rng(seed)) if arrivals == "poisson" else deterministic(rate)
    if requests is not None:
        return arrival_offsets(times, count=requests)
    return arrival_offsets(times, until=DEFAULT_DURATION if duration is None else duration)


@dataclass
class LoadResult:
    """What one load did: per request its address, scheduled and real send time, latency, error class, answer."""

    transport: str
    arrivals: str
    rate: float  # the target, requests per second
    addresses: list[str]
    targets: list[str]  # per request: the address it went to (or that address's name: run_load's ``names``)
    due: np.ndarray  # seconds from the start it was scheduled
    sent: np.ndarray  # seconds from the start it was sent
    latency: np.ndarray  # seconds from its send to its answer (NaN: none)
    errors: list[str | None]  # None: answered; else the error's class ("timeout", "overloaded", ...)
    answers: list[Answer | None]
    wall_s: float  # from the first send to the last outcome
    labels: np.ndarray | None = None  # per sample (``x``'s), for requests.csv's ``correct``
    samples: int = 1  # how many samples ``x`` had (request i sent sample i mod samples)

    def by_target(self) -> dict[str, np.ndarray]:
        """{target: the indices of its requests, in send order}."""
        out: dict[str, list[int]] = {}
        for i, t in enumerate(self.targets):
            out.setdefault(t, []).append(i)
        return {t: np.array(idx, dtype=np.int64) for t, idx in out.items()}

    def error_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.errors:
            if e is not None:
                out[e] = out.get(e, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, Any]:
        """The JSON of ``cis bench --json`` (docs/runtime.md, "Load: cis bench")."""
        n = len(self.due)
        ok = np.array([e is None for e in self.errors], bool)
        span = float(self.sent.max() - self.sent.min()) if n else 0.0  # from the first send, not the start
        sent_rate = (n - 1) / span if span > 0 else None
        lags = self.sent - self.due
        exits = [a.exit for a, good in zip(self.answers, ok) if good and a is not None and a.exit > 0]
        out = {
            "addresses": self.addresses,
            "transport": self.transport,
            "arrivals": self.arrivals,
            "rate": self.rate,
            "requests": n,
            "answered": int(ok.sum()),
            "errors": self.error_counts(),
            "sent_rate": sent_rate,
            "held_rate": None if sent_rate is None else sent_rate * float(ok.mean()),
            "duration_s": span,
            "wall_s": self.wall_s,
            "lag_p99_s": float(np.percentile(lags, 99)) if n else 0.0,
            "latency": latency_summary(self.latency[ok]),
            "p99_all_s": json_float(percentile_all(np.where(ok, self.latency, np.inf), 99)) if n else None,
            "served_share_per_exit": {str(e): exits.count(e) / len(exits) for e in sorted(set(exits))},
        }
        correct = [c for c in self.columns()["correct"] if c is not None]
        if correct:
            out["accuracy"] = sum(correct) / len(correct)
        return out

    def columns(self) -> dict[str, list]:
        """requests.csv's columns (:data:`cis.core.records.REQUEST_COLUMNS`): one row per request."""
        n = len(self.due)
        ans = [a if e is None else None for a, e in zip(self.answers, self.errors)]
        correct: list[int | None] = [None] * n
        if self.labels is not None:
            for i, a in enumerate(ans):
                if a is not None and a.cls is not None:
                    correct[i] = int(a.cls == int(self.labels[i % self.samples]))
        return {
            "id": list(range(n)),
            "entry": self.targets,
            "node": [a.node if a is not None else None for a in ans],
            "exit": [a.exit if a is not None and a.exit > 0 else None for a in ans],
            "outcome": ["served" if a is not None else "error" for a in ans],
            "correct": correct,
            "arrive_s": self.sent.tolist(),
            "latency_s": [None if a is None else float(t) for a, t in zip(ans, self.latency)],
            "flags": [a.flags if a is not None else None for a in ans],
        }

    def write(self, out: str | Path) -> dict[str, str]:
        """``out``/requests.csv and ``out``/bench.json (the summary); returns their paths."""
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        write_requests(folder / REQUESTS_FILE, self.columns())
        (folder / SUMMARY_FILE).write_text(json.dumps(self.summary(), indent=1))
        return {"requests": str(folder / REQUESTS_FILE), "summary": str(folder / SUMMARY_FILE)}


def run_load(
    address: str | Sequence[str],
    rate: float,
    *,
    arrivals: str = "poisson",
    transport: str | Transport = "zmq",
    duration: float | None = None,
    requests: int | None = None,
    x: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    entries: Sequence[int] | np.ndarray | None = None,
    names: Sequence[str] | None = None,
    input_name: str | None = None,
    timeout: float = 10.0,
    seed: int = 0,
    **options: Any,
) -> LoadResult:
    """Drive one open-loop load (see the module's docstring) and return what it did.

    ``address``: one address or several (request i goes to ``address[entries[i]]``, or round robin without
    ``entries``), called ``names`` in ``targets`` and requests.csv (default: the addresses); ``x``: the samples
    (None: made from the input the first address says its model takes, random floats or zero integers);
    ``input_name``: the input's name (None: asked of the first address; then every other address is asked too, so
    a dead one stops the load with one line before its first send); ``options`` go to the transport
    (``model``, ``binary``, ``curve``: :func:`cis.runtime.load_transports.make_transport`). Bad input raises
    :class:`cis.core.errors.CisError`."""
    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses:
        raise CisError("load: no address; expected one or more")
    if names is not None and len(names) != len(addresses):
        raise CisError(f"load: {len(names)} names for {len(addresses)} addresses; expected one per address")
    offsets = send_offsets(arrivals, rate, requests, duration, seed)  # read as they fall due: none held ahead
    sent_to = addresses  # round robin
    if entries is not None:
        ahead = list(itertools.islice(offsets, len(entries) + 1))
        if len(ahead) > len(entries):
            count = requests if requests is not None else f"more than {len(entries)}"
            raise CisError(f"load: {len(entries)} entries for {count} requests; expected one per request")
        offsets, sent_to = iter(ahead), [addresses[int(k)] for k in entries[: len(ahead)]]
    tr = make_transport(transport, timeout, **options) if isinstance(transport, str) else transport
    name = transport if isinstance(transport, str) else tr.name
    due: list[float] = []
    samples, sent, latency, errors, answers, wall = asyncio.run(
        _load(tr, addresses[0], x, input_name, sent_to, _kept(offsets, due), timeout))
    called = addresses if names is None else list(names)
    pick = range(len(due)) if entries is None else entries[: len(due)]
    targets = [called[int(k) % len(called)] for k in pick]
    return LoadResult(name, arrivals, float(rate), addresses, targets, np.array(due, dtype=float), sent, latency,
                      errors, answers, wall, labels, samples)  # fmt: skip


def _kept(values: Iterable[float], into: list[float]) -> Iterator[float]:
    """``values``, each appended to ``into`` as it is read."""
    for value in values:
        into.append(value)
        yield value


async def _load(tr: Transport, first: str, x: np.ndarray | None, input_name: str | None, targets: Sequence[str],
                offsets: Iterator[float], timeout: float) -> tuple:  # fmt: skip
    try:
        inputs = await tr.describe(first) if x is None or input_name is None else []
        if x is None or input_name is None:  # every address up front: a dead one is one line, not a run of errors
            for other in dict.fromkeys(targets):
                if other != first:
                    await tr.describe(other)
        if x is None:
            x = sample_inputs(inputs, first)
        name = input_name or (inputs[0].name if inputs else "input")
        head = list(itertools.islice(offsets, len(x)))  # a short load encodes only the samples it sends
        bodies = [tr.encode(x[j : j + 1], name) for j in range(len(head))]
        return (len(x), *(await drive(tr, bodies, targets, itertools.chain(head, offsets), timeout)))
    finally:
        await tr.close()


async def drive(
    transport: Transport, bodies: Sequence[Any], targets: Sequence[str], offsets: Iterable[float] | None,
    timeout: float,
) -> tuple[np.ndarray, np.ndarray, list[str | None], list[Answer | None], float]:
    """Send ``bodies[i mod len(bodies)]`` to ``targets[i mod len(targets)]`` at the i-th of ``offsets`` (seconds
    from the start, read as each falls due: a long load holds none ahead), each as soon as it is due, and wait for
    every answer or its timeout: (sent, latency, errors, answers, wall seconds). Without ``offsets``, one to each
    of ``targets``, one after another, each once the one before is answered (a warm-up, a probe: not a load)."""
    sent: list[float] = []
    latency: list[float] = []
    errors: list[str | None] = []
    answers: list[Answer | None] = []

    async def one(i: int, t_send: float) -> None:
        try:
            answers[i] = await asyncio.wait_for(transport.call(targets[i % len(targets)], bodies[i % len(bodies)]),
                                                timeout)  # fmt: skip
            latency[i] = time.perf_counter() - t_send
        except asyncio.TimeoutError:
            errors[i] = "timeout"
        except Refused as exc:
            errors[i] = exc.code
        except (OSError, EOFError, asyncio.IncompleteReadError):  # refused, reset or closed: no answer
            errors[i] = "connection"

    start = time.perf_counter()
    pending: set[asyncio.Future] = set()  # the requests still unanswered: an answered one is let go
    steps: Iterable[float | None] = itertools.repeat(None, len(targets)) if offsets is None else offsets
    for i, due in enumerate(steps):
        if due is not None and (wait := start + float(due) - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        now = time.perf_counter()
        sent.append(now - start)
        latency.append(math.nan)
        errors.append(None)
        answers.append(None)
        if due is None:
            await one(i, now)
            continue
        task = asyncio.ensure_future(one(i, now))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    return np.array(sent, dtype=float), np.array(latency, dtype=float), errors, answers, time.perf_counter() - start
