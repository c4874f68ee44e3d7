"""Run one ``cis serve`` node that writes its spans (queue, compute, forward, request) to a file.

    python benchmarks/_span_node.py SPANS_DIR PYTHON -m cis.cli [...] serve BUNDLE --node ID ...

A command prefix for the launcher (``node_prefix``): the node runs in this process, as it would under
``python -m cis.cli``, with a recorder on the node's own hooks, and writes ``SPANS_DIR/ID.spans.jsonl``
in the span format of issue 33 (sim/spans.py) when it stops, and appends what it has so far on SIGUSR1
(:func:`flush`). For benchmarks/twin_spans.py and twin_hard.py, until the runtime's tracing (issue 33)
writes these spans itself; the recorder keeps them in memory between writes, so a span costs the node a
tuple append.

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

``trace_id`` joins a forward to the parent's spans of it: a forward span's is made from the sending
node and the forward's id, and so are the parent's spans of that message (its route names the sender);
a client's request has one made from the entry node and the client's id. (The runtime's tracing of
issue 33 carries one trace through every node instead.)
"""

from __future__ import annotations

import atexit
import hashlib
import json
import signal
import sys
import time
from pathlib import Path

TO_UNIX = time.time() - time.monotonic()


def trace_of(sender: str, rid: int) -> str:
    """The trace id of a message: made from the node that sent it (a client's: its entry node) and its id."""
    return hashlib.md5(f"{sender}:{rid}".encode()).hexdigest()


class Recorder:
    """The executor's ``timings`` hook and the node's reply/forward hooks, keeping spans as tuples."""

    def __init__(self, node: str, exit_: int):
        self.node, self.exit = node, exit_
        self.rows: list[tuple] = []  # (kind, start, end, req_id, samples, batch, stage_from, trace key)
        self.batch: tuple = ()
        self.sent: dict[int, tuple[float, int]] = {}  # id(pending) -> (when it went to the parent, forward id)
        self.admitted: dict[int, float] = {}  # id(request) -> when it was admitted
        self.compute = self  # timings.compute.observe(seconds)
        self.written = 0

    # executor.timings
    def started(self, now: float, requests: list, samples: int) -> None:
        self.batch = (now, requests, samples)
        admitted = self.admitted
        for req in requests:
            self.rows.append(("queue", admitted.get(id(req), req.t0), now, req.req_id, req.n, samples, req.stage,
                              self.key(req)))

    def observe(self, seconds: float) -> None:
        now, requests, samples = self.batch
        for req in requests:
            self.rows.append(("compute", now, now + seconds, req.req_id, req.n, samples, req.stage, self.key(req)))

    def key(self, req) -> tuple:
        """(sender, id): the node that sent the message (the last of its route; a client: this node), its id."""
        return (req.route[-1] if req.forward and req.route else self.node, req.req_id)

    def forwarded(self, pending, fid: int) -> None:
        self.sent[id(pending)] = (time.monotonic(), fid)

    def answered(self, pending) -> None:
        sent = self.sent.pop(id(pending), None)
        if sent is None:
            return
        now = time.monotonic()
        for req, idx in pending.parts:
            self.rows.append(("forward", sent[0], now, req.req_id, req.n if idx is None else len(idx), 0, req.stage,
                              (self.node, sent[1])))

    def replied(self, req) -> None:
        start = self.admitted.pop(id(req), req.t0)
        self.rows.append(("request", start, time.monotonic(), req.req_id, req.n, 0, req.stage, self.key(req)))

    def write(self, path: Path) -> None:
        rows, self.rows = self.rows, []
        with open(path, "a") as f:
            for n, (kind, start, end, rid, samples, batch, stage, key) in enumerate(rows, start=self.written):
                f.write(json.dumps({
                    "trace_id": trace_of(*key), "span_id": f"{n + 1:016x}",
                    "parent_id": None, "node": self.node, "kind": kind, "start": start + TO_UNIX,
                    "end": end + TO_UNIX, "req_id": rid, "samples": samples, "batch": batch,
                    "stage_from": stage, "stage_to": self.exit,
                }, separators=(",", ":")) + "\n")
        self.written += len(rows)
        (path.parent / f"{self.node}.flushed").write_text(str(self.written))


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
        path = out_dir / f"{config.node_id}.spans.jsonl"
        path.write_text("")
        atexit.register(rec.write, path)
        signal.signal(signal.SIGUSR1, lambda *_: rec.write(path))

    def node_forward(self, pending, carry):
        sent = forward(self, pending, carry)
        if sent:
            self.span_recorder.forwarded(pending, next(reversed(self.pending)))  # the id it went with
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


def flush(pids: dict[str, int], spans_dir: Path, timeout: float = 5.0) -> None:
    """Have every node (its pid) append its spans so far to ``spans_dir`` (SIGUSR1), and wait until each did."""
    import os

    before = {nid: _flushed(spans_dir, nid) for nid in pids}
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_flushed(spans_dir, nid) == before[nid] for nid in pids):
        time.sleep(0.05)


def _flushed(spans_dir: Path, nid: str) -> str | None:
    try:
        return (spans_dir / f"{nid}.flushed").read_text() + str((spans_dir / f"{nid}.flushed").stat().st_mtime_ns)
    except OSError:
        return None


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
