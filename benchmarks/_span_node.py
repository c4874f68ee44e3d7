"""Run one ``cis serve`` node that writes its spans (queue, compute, forward, request) to a file.

    python benchmarks/_span_node.py SPANS_DIR PYTHON -m cis.cli [...] serve BUNDLE --node ID ...

A command prefix for the launcher (``node_prefix``): the node runs in this process, as it would under
``python -m cis.cli``, with a recorder on the node's own hooks, and writes ``SPANS_DIR/ID.spans.jsonl``
in the span format of issue 33 (sim/spans.py) when it stops. For benchmarks/twin_spans.py, until
the runtime's tracing (issue 33) writes these spans itself; the recorder keeps them in memory and
writes them at the end, so a span costs the node a tuple append.

What each span measures (the node's own clock, :func:`time.monotonic`, moved to unix seconds):

- ``queue``: admitted (when :meth:`Executor.admit` took it into the queue: the node reads its
  socket between batches, so a message that came during a batch is admitted after it) -> its batch
  started (the executor's ``timings.started`` hook);
- ``compute``: the batch started -> its stages, exit decision, answers and forward were done (the
  hook's ``compute.observe``);
- ``forward``: the node sent the carry to its parent -> the parent's answer (or the node's own, when
  the parent did not answer in time) filled the request (``Executor.scatter``);
- ``request``: admitted -> the answer was sent (``Node.reply``).

(The node's own latency, ``status``, counts from ``t0``, which for a message read right after a batch is
before that batch: a bound, not the admission.)

Spans of one node are not joined to the parent's (the ids differ by hop): ``trace_id`` is made from
the node and its request id.
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from pathlib import Path

TO_UNIX = time.time() - time.monotonic()


class Recorder:
    """The executor's ``timings`` hook and the node's reply/forward hooks, keeping spans as tuples."""

    def __init__(self, node: str, exit_: int):
        self.node, self.exit = node, exit_
        self.rows: list[tuple] = []  # (kind, start, end, req_id, samples, batch, stage_from)
        self.batch: tuple = ()
        self.sent: dict[int, float] = {}  # id(pending) -> when it went to the parent
        self.admitted: dict[int, float] = {}  # id(request) -> when it was admitted
        self.compute = self  # timings.compute.observe(seconds)

    # executor.timings
    def started(self, now: float, requests: list, samples: int) -> None:
        self.batch = (now, requests, samples)
        admitted = self.admitted
        for req in requests:
            self.rows.append(("queue", admitted.get(id(req), req.t0), now, req.req_id, req.n, samples, req.stage))

    def observe(self, seconds: float) -> None:
        now, requests, samples = self.batch
        for req in requests:
            self.rows.append(("compute", now, now + seconds, req.req_id, req.n, samples, req.stage))

    def forwarded(self, pending) -> None:
        self.sent[id(pending)] = time.monotonic()

    def answered(self, pending) -> None:
        sent = self.sent.pop(id(pending), None)
        if sent is None:
            return
        now = time.monotonic()
        for req, idx in pending.parts:
            self.rows.append(("forward", sent, now, req.req_id, req.n if idx is None else len(idx), 0, req.stage))

    def replied(self, req) -> None:
        start = self.admitted.pop(id(req), req.t0)
        self.rows.append(("request", start, time.monotonic(), req.req_id, req.n, 0, req.stage))

    def write(self, path: Path) -> None:
        with open(path, "w") as f:
            for n, (kind, start, end, rid, samples, batch, stage) in enumerate(self.rows):
                f.write(json.dumps({
                    "trace_id": f"{abs(hash((self.node, rid))) % 16**32:032x}", "span_id": f"{n + 1:016x}",
                    "parent_id": None, "node": self.node, "kind": kind, "start": start + TO_UNIX,
                    "end": end + TO_UNIX, "req_id": rid, "samples": samples, "batch": batch,
                    "stage_from": stage, "stage_to": self.exit,
                }, separators=(",", ":")) + "\n")


def install(out_dir: Path) -> None:
    """Hook every Node this process builds: its executor's timings, its forwards, answers and replies."""
    from cis.runtime import executor as ex_mod
    from cis.runtime import node as node_mod

    Node, Executor = node_mod.Node, ex_mod.Executor
    init, forward, reply = Node.__init__, Node.forward, Node.reply
    scatter, admit = Executor.scatter, Executor.admit

    def node_init(self, config, stages):
        init(self, config, stages)
        rec = Recorder(config.node_id, config.exit)
        self.executor.timings = rec
        self.executor.span_recorder = rec
        self.span_recorder = rec
        atexit.register(rec.write, out_dir / f"{config.node_id}.spans.jsonl")

    def node_forward(self, pending, carry):
        sent = forward(self, pending, carry)
        if sent:
            self.span_recorder.forwarded(pending)
        return sent

    def node_reply(self, req):
        self.span_recorder.replied(req)
        reply(self, req)

    def executor_scatter(self, pending, *args, **kw):
        rec = getattr(self, "span_recorder", None)
        if rec is not None:
            rec.answered(pending)
        scatter(self, pending, *args, **kw)

    def executor_admit(self, prefix, msg, t0):
        refused = admit(self, prefix, msg, t0)
        if refused is None:
            self.span_recorder.admitted[id(self.queue[-1])] = time.monotonic()
        return refused

    Node.__init__, Node.forward, Node.reply = node_init, node_forward, node_reply
    Executor.scatter, Executor.admit = executor_scatter, executor_admit


def main() -> int:
    out_dir = Path(sys.argv[1])
    cmd = sys.argv[2:]
    at = cmd.index("cis.cli")  # PYTHON -m cis.cli ARGS...
    out_dir.mkdir(parents=True, exist_ok=True)
    install(out_dir)
    from cis.cli import main as cli

    return cli(cmd[at + 1 :])


if __name__ == "__main__":
    sys.exit(main())
