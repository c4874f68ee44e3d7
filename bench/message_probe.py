"""A node's own work on each message that reaches it while it runs a batch (the simulator's ``message_work``).

Measured in-process like the stage profile, not from a load: the light calibration load holds too few
messages that come during a batch to tell (twin_spans: 0.3-0.65 ms per message in three light loads),
and the loads the twin predicts must not calibrate it. A stage runs back to back on ``core`` as the
node's does, alone and while a thread on ``other_core`` sends it carries of one sample over ZeroMQ on
TCP loopback at ``rate`` messages/s, in alternating rounds; between calls the stage's thread reads and
decodes what came, as the node reads its socket between batches. The socket's context (and so ZeroMQ's
I/O thread) is made on ``core``, as a node pinned with taskset has it. A message's work is the calls'
extra time per message that came during them plus the reading's time per message, the median over
rounds.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from bench.twin import alternating


def message_work(bundle_dir: Path, stage: int, carry_stage: int, core: int, other_core: int, x: np.ndarray,
                 batch: int = 8, rate: float = 2000.0, rounds: int = 8, seconds: float = 0.5) -> dict:
    """Seconds of ``core`` per message: ``stage`` at a batch of ``batch`` while messages of ``carry_stage``'s
    input for one sample (what a child forwards) come at ``rate`` a second."""
    import zmq

    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import StageRunner, stage_runners
    from cis.exporter.profile import stage_inputs

    bundle = load_bundle(bundle_dir)
    chain = stage_runners(bundle, threads=1)
    feeds = stage_inputs(chain, x, batch)[stage - 1]
    carry = stage_inputs(chain, x[:1], 1)[carry_stage - 1]
    payload = b"".join(np.ascontiguousarray(a).tobytes() for a in carry.values())
    before = os.sched_getaffinity(0)
    sending, stop = threading.Event(), threading.Event()
    os.sched_setaffinity(0, {core})  # the context's I/O thread starts here: on the node's core
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")

    def sender() -> None:  # Linux: the affinity of pid 0 is the calling thread's; its context's I/O thread inherits it
        os.sched_setaffinity(0, {other_core})
        own = zmq.Context()
        push = own.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        gap = 1.0 / rate
        try:
            while not stop.is_set():
                if not sending.wait(0.05):
                    continue
                due = time.perf_counter()
                while sending.is_set():
                    push.send(payload, copy=False)
                    due += gap
                    time.sleep(max(0.0, due - time.perf_counter()))
        finally:
            push.close(linger=0)
            own.term()

    def drain() -> tuple[int, float]:
        n, t0 = 0, time.perf_counter()
        while pull.poll(0):
            np.frombuffer(pull.recv(copy=False).buffer, np.uint8).sum()  # read it, as a node decodes it
            n += 1
        return n, time.perf_counter() - t0

    def calls(runner) -> tuple[float, int, float]:
        """(mean seconds per call, messages read, seconds spent reading them) over ``seconds``."""
        times, came, reading = [], 0, 0.0
        drain()
        began = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - began < seconds:
            t0 = time.perf_counter()
            runner.run(feeds)
            times.append(time.perf_counter() - t0)
            n, t = drain()
            came, reading = came + n, reading + t
        return float(np.mean(times)), came / len(times), reading / max(1, came)

    thread = threading.Thread(target=sender, daemon=True)
    per_message, during, read = [], [], []
    try:
        runner = StageRunner(bundle, stage, threads=1)
        thread.start()
        for _ in range(3):
            runner.run(feeds)
        for (alone, _, _), (busy, per_call, reading) in alternating(lambda: calls(runner), sending, rounds):
            during.append(max(0.0, busy - alone) / max(per_call, 1e-9))
            read.append(reading)
            per_message.append(during[-1] + reading)
    finally:
        stop.set()
        sending.clear()
        thread.join()
        pull.close(linger=0)
        ctx.term()
        os.sched_setaffinity(0, before)
    return {"message_work": float(np.median(per_message)), "during_batch": [float(v) for v in during],
            "reading": [float(v) for v in read], "rate": rate, "batch": batch}
