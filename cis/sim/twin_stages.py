"""The twin's calibration in-process, on the cores that run each node (docs/simulator.md, *The hard regime*).

What a light load on the live cluster cannot tell, timed here the way a node runs it: the bundle's onnxruntime
stages, one thread each, pinned to the core of the node that runs them, on the carries of the samples the loads
send (a stage's time depends on its values: a later stage ran 1.3-1.6 times slower on real carries than on random
ones at batch 2 and more).

- :func:`profile_stages`: each stage's mean seconds per call by batch size (the simulator's latency profile);
- :func:`spread`: how one stage's calls spread around their mean (``SimConfig.service_spread``);
- :func:`beside_busy_core`: how much a busy core slows another (``SimConfig.interference``);
- :func:`message_work`: a node's own work on each message that reaches it during a batch
  (``SimConfig.message_work``).

Linux only (``os.sched_setaffinity``); each function puts the caller's affinity back.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.bundle import load_bundle
from cis.core.stages.runner import StageRunner, stage_inputs, stage_runners


def mean_call(run: Callable[[], Any], calls: int, seconds: float) -> float:
    """Mean seconds of ``run()`` over ``calls`` calls and ``seconds`` at least."""
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < calls or time.perf_counter() - began < seconds:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.mean(times))


def profile_stages(bundle_dir: str | Path, cores: dict[int, int], x: np.ndarray,
                   batches: Sequence[int] = (1, 2, 4, 8, 16, 32), repeats: int = 30,
                   min_seconds: float = 1.0) -> dict[int, dict[int, float]]:  # fmt: skip
    """{stage: {batch: mean seconds per call}}: each stage alone on ``cores[stage]``, the core its node runs on,
    on the carries of the samples ``x``. The mean, not the median: a queue sees every slow call; over
    ``min_seconds`` at least (5 calls of a batch of 32 were 0.5 s, and the capacity they set moved 282 / 310 /
    353 requests/s between three runs)."""
    bundle = load_bundle(bundle_dir)
    before = os.sched_getaffinity(0)
    chain = stage_runners(bundle, threads=1)
    real = {b: stage_inputs(chain, x, b) for b in batches}
    out: dict[int, dict[int, float]] = {}
    try:
        for k in range(1, bundle.num_exits + 1):
            os.sched_setaffinity(0, {cores[k]})
            runner = StageRunner(bundle, k, threads=1)
            out[k] = {}
            for b in batches:
                feeds = real[b][k - 1]
                for _ in range(3):
                    runner.run(feeds)
                out[k][b] = mean_call(partial(runner.run, feeds), max(5, repeats * 4 // b), min_seconds)
    finally:
        os.sched_setaffinity(0, before)
    return out


def spread(bundle_dir: str | Path, stage: int, core: int, x: np.ndarray, calls: int = 200) -> tuple[float, ...]:
    """Each call's time over the mean, ``calls`` batch-1 calls of ``stage`` back to back on ``core`` (on the
    carry of the first sample of ``x``): how a stage's time spreads (the simulator's ``service_spread``)."""
    bundle = load_bundle(bundle_dir)
    feeds = stage_inputs(stage_runners(bundle, stage, threads=1), x[:1], 1)[stage - 1]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        runner = StageRunner(bundle, stage, threads=1)
        for _ in range(5):
            runner.run(feeds)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            runner.run(feeds)
            times.append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, before)
    return tuple(float(t) for t in np.asarray(times) / np.mean(times))


def alternating(measure: Callable[[], Any], beside: threading.Event, rounds: int) -> list[tuple[Any, Any]]:
    """``rounds`` pairs (``measure()`` with the event ``beside`` clear, then with it set), alternating so that
    the machine's slow drifts fall on both alike."""
    pairs = []
    for _ in range(rounds):
        beside.clear()
        time.sleep(0.01)  # what the other thread had under way finishes
        alone = measure()
        beside.set()
        pairs.append((alone, measure()))
    return pairs


def beside_busy_core(bundle_dir: str | Path, stage: int, core: int, other: int, other_core: int, x: np.ndarray,
                     batch: int = 8, rounds: int = 8, seconds: float = 0.5) -> dict:  # fmt: skip
    """How much a busy core slows another (``SimConfig.interference``): ``stage`` at a batch of ``batch`` on
    ``core``, alone and while ``other`` (a batch of 1) runs back to back on ``other_core`` in a second thread,
    alternating for ``rounds`` rounds of ``seconds`` each; the median over rounds of (time beside / time alone
    - 1), never below 0."""
    bundle = load_bundle(bundle_dir)
    chain = stage_runners(bundle, threads=1)
    feeds = stage_inputs(chain, x, batch)[stage - 1]
    other_feeds = stage_inputs(chain, x[:1], 1)[other - 1]
    before = os.sched_getaffinity(0)
    busy, stop = threading.Event(), threading.Event()

    def neighbour() -> None:  # Linux: the affinity of pid 0 is the calling thread's
        os.sched_setaffinity(0, {other_core})
        runner = StageRunner(bundle, other, threads=1)
        while not stop.is_set():
            if busy.wait(0.05):
                runner.run(other_feeds)

    thread = threading.Thread(target=neighbour, daemon=True)
    ratios: list[float] = []
    try:
        os.sched_setaffinity(0, {core})
        runner = StageRunner(bundle, stage, threads=1)
        thread.start()
        for _ in range(3):
            runner.run(feeds)
        pairs = alternating(lambda: mean_call(lambda: runner.run(feeds), 3, seconds), busy, rounds)
        ratios = [beside / alone for alone, beside in pairs]
    finally:
        stop.set()
        busy.set()
        thread.join()
        os.sched_setaffinity(0, before)
    return {"interference": max(0.0, float(np.median(ratios)) - 1.0), "ratios": [float(r) for r in ratios]}


class _Sender:
    """A thread on ``core`` that pushes ``payload`` to ``port`` at ``rate`` messages/s while ``sending`` is set
    (its own ZeroMQ context, whose I/O thread inherits the core)."""

    def __init__(self, payload: bytes, port: int, core: int, rate: float) -> None:
        self.payload, self.port, self.core, self.gap = payload, port, core, 1.0 / rate
        self.sending, self.stopping = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import zmq

        os.sched_setaffinity(0, {self.core})  # Linux: the calling thread's affinity
        own = zmq.Context()
        push = own.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{self.port}")
        try:
            while not self.stopping.is_set():
                if not self.sending.wait(0.05):
                    continue
                due = time.perf_counter()
                while self.sending.is_set():
                    push.send(self.payload, copy=False)
                    due += self.gap
                    time.sleep(max(0.0, due - time.perf_counter()))
        finally:
            push.close(linger=0)
            own.term()

    def stop(self) -> None:
        self.stopping.set()
        self.sending.clear()
        self.thread.join()


def _drain(pull: Any) -> tuple[int, float]:
    """Read every message waiting, as a node decodes it: (how many, seconds spent)."""
    n, t0 = 0, time.perf_counter()
    while pull.poll(0):
        np.frombuffer(pull.recv(copy=False).buffer, np.uint8).sum()
        n += 1
    return n, time.perf_counter() - t0


def _calls_reading(run: Callable[[], Any], pull: Any, seconds: float) -> tuple[float, float, float]:
    """(mean seconds per call, messages read per call, seconds per message read) over ``seconds``, reading the
    socket between calls as a node reads it between batches."""
    times: list[float] = []
    came, reading = 0, 0.0
    _drain(pull)
    began = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - began < seconds:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        n, t = _drain(pull)
        came, reading = came + n, reading + t
    return float(np.mean(times)), came / len(times), reading / max(1, came)


def message_work(bundle_dir: str | Path, stage: int, carry_stage: int, core: int, other_core: int, x: np.ndarray,
                 batch: int = 8, rate: float = 2000.0, rounds: int = 8, seconds: float = 0.5) -> dict:  # fmt: skip
    """Seconds of ``core`` per message (``SimConfig.message_work``): ``stage`` at a batch of ``batch`` runs back to
    back on ``core``, alone and while a thread on ``other_core`` sends it ``carry_stage``'s input for one sample
    (what a child forwards) over ZeroMQ on TCP loopback at ``rate`` messages/s, in alternating rounds. A message's
    work is the calls' extra time per message that came during them plus the reading's time per message, the
    median over rounds. The socket's context (and so ZeroMQ's I/O thread) is made on ``core``, as a node pinned
    with taskset has it. Measured in-process, not from a load: a light load holds too few messages that come
    during a batch to tell (0.3-0.65 ms per message in three light loads), and the loads the twin predicts must
    not calibrate it."""
    import zmq

    bundle = load_bundle(bundle_dir)
    chain = stage_runners(bundle, threads=1)
    feeds = stage_inputs(chain, x, batch)[stage - 1]
    carry = stage_inputs(chain, x[:1], 1)[carry_stage - 1]
    payload = b"".join(np.ascontiguousarray(a).tobytes() for a in carry.values())
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})  # the context's I/O thread starts here: on the node's core
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    sender = _Sender(payload, pull.bind_to_random_port("tcp://127.0.0.1"), other_core, rate)
    per_message, during, read = [], [], []
    try:
        runner = StageRunner(bundle, stage, threads=1)
        sender.thread.start()
        for _ in range(3):
            runner.run(feeds)
        measure = lambda: _calls_reading(lambda: runner.run(feeds), pull, seconds)  # noqa: E731
        for (alone, _, _), (busy, per_call, reading) in alternating(measure, sender.sending, rounds):
            during.append(max(0.0, busy - alone) / max(per_call, 1e-9))
            read.append(reading)
            per_message.append(during[-1] + reading)
    finally:
        sender.stop()
        pull.close(linger=0)
        ctx.term()
        os.sched_setaffinity(0, before)
    return {"message_work": float(np.median(per_message)), "during_batch": [float(v) for v in during],
            "reading": [float(v) for v in read], "rate": rate, "batch": batch}  # fmt: skip
