"""Overload a leaf of a live ``cis serve --all`` cluster at 10x its measured capacity and see backpressure.

For each request size (1 and 256 samples, digits inputs) on a fresh cluster:

1. capacity: closed loop against the leaf (a window of requests in flight) for
   --measure seconds: answered requests/s;
2. burst: open loop at --factor x that rate for --seconds, one DEALER whose
   send high-water mark is --client-hwm messages (a send that would block is
   counted as pushed back and tried again on the next tick: the node's TCP
   backpressure reaching the client); a second socket asks the leaf's status
   every 0.25 s. Then the client waits up to 60 s for the last replies.

Measured: when the first ``overloaded`` reply comes (after the burst starts,
and after the client's outstanding samples first exceed the node's queue
limit), requests without a reply, the leaf's RSS (before, peak, after), and
per status snapshot the node's queue (``queue_depth`` + ``in_flight_forwarded``)
against the samples the client has sent and not had answered, and the node's
``latency.p99_s`` against the p99 of the client's last 4,096 results.

    python -m bench.runtime_overload            # 20 s bursts
    python -m bench.runtime_overload --quick    # 4 s bursts
"""

from __future__ import annotations

import argparse
import json
import time

import msgpack
import numpy as np
import zmq

from bench.harness import serve_command
from bench.runtime_live import add_live_args, live_bundle, machine, rss_mb, write_out

QUEUE_LIMIT = 1024


class Sender:
    """One DEALER with pre-packed inputs; replies parsed from the header alone."""

    def __init__(self, ctx: zmq.Context, addr: str, x: np.ndarray, hwm: int, sndbuf: int = -1):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.sndhwm = hwm
        self.sock.sndbuf = sndbuf  # SO_SNDBUF; -1: the OS default
        self.sock.rcvhwm = 0
        self.sock.connect(addr)
        self.payload = np.ascontiguousarray(x, np.float32)
        self.head = {
            "v": 1,
            "kind": "infer",
            "id": 0,
            "names": ["input"],
            "dtypes": ["float32"],
            "shapes": [list(x.shape)],
            "stage": 1,
            "deadline": 0,
            "route": [],
        }
        self.n = len(x)
        self.next_id = 1
        self.sent: dict[int, float] = {}
        self.results: list[tuple[float, float]] = []  # (reply time, latency)
        self.codes: dict[str, int] = {}
        self.first: dict[str, float] = {}

    def send(self) -> bool:
        self.head["id"] = self.next_id
        try:
            self.sock.send(msgpack.packb(self.head), zmq.SNDMORE | zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.sock.send(self.payload, copy=False)
        self.sent[self.next_id] = time.perf_counter()
        self.next_id += 1
        return True

    def receive(self, limit: int = 10_000) -> int:
        got = 0
        while got < limit:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            now = time.perf_counter()
            h = msgpack.unpackb(frames[0].bytes)
            t0 = self.sent.pop(h["id"], None)
            if t0 is None:
                continue
            code = h.get("code", "result") if h["kind"] == "error" else "result"
            self.codes[code] = self.codes.get(code, 0) + 1
            self.first.setdefault(code, now)
            if code == "result":
                self.results.append((now, now - t0))
            got += 1
        return got

    @property
    def outstanding_samples(self) -> int:
        return len(self.sent) * self.n


def status(ctx: zmq.Context, addr: str):
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(addr)
    ids = iter(range(1, 1 << 62))

    def ask() -> None:
        sock.send(msgpack.packb({"v": 1, "kind": "status", "id": next(ids)}), zmq.NOBLOCK)

    def answer() -> dict | None:
        try:
            return msgpack.unpackb(sock.recv_multipart(zmq.NOBLOCK)[0])["status"]
        except zmq.Again:
            return None

    return sock, ask, answer


def capacity(ctx, addr: str, x: np.ndarray, window: int, seconds: float) -> float:
    s = Sender(ctx, addr, x, 0)
    end = time.perf_counter() + seconds
    start, done = None, 0
    while time.perf_counter() < end:
        while len(s.sent) < window:
            s.send()
        if s.sock.poll(100):
            got = s.receive()
            if start is None:
                start, s.codes = time.perf_counter(), {}
            else:
                done += got
    elapsed = time.perf_counter() - start
    while s.sent and s.sock.poll(2000):
        s.receive()
    s.sock.close()
    return done / elapsed


def snapshot(s: Sender, got: dict, start: float) -> dict:
    """The node's view (its status reply ``got``) beside the client's, now."""
    s.receive(1 << 30)  # every reply that came before the status answer: outstanding is what the client still waits for
    recent = np.array([lat for _, lat in s.results[-4096:]]) if s.results else np.zeros(1)
    return {
        "t": time.perf_counter() - start,
        "node_queue": got["queue_depth"] + got["in_flight_forwarded"],
        "node_queue_depth": got["queue_depth"],
        "client_outstanding": s.outstanding_samples,
        "node_p99": got["latency"]["p99_s"],
        "client_p99": float(np.percentile(recent, 99)),
    }


def offer(s: Sender, ctx, addr: str, pid: int, rate: float, seconds: float) -> dict:
    """Send at ``rate`` for ``seconds`` as fast as the socket takes them (a send the socket refuses is pushed back
    to the next tick), reading replies, the node's status every 0.25 s and the leaf's RSS."""
    st_sock, ask, answer = status(ctx, addr)
    rss0 = rss_mb(pid)
    got: dict = {"snaps": [], "rss0": rss0, "rss_peak": rss0, "pushed_back": 0, "saturated_at": None}
    attempts = 0
    start = next_status = time.perf_counter()
    while (now := time.perf_counter()) < start + seconds:
        while attempts < int((now - start) * rate):
            if not s.send():
                got["pushed_back"] += 1
                break
            attempts += 1
        s.receive(2000)
        if got["saturated_at"] is None and s.outstanding_samples >= QUEUE_LIMIT:
            got["saturated_at"] = time.perf_counter()
        if now >= next_status:
            next_status = now + 0.25
            ask()
            got["rss_peak"] = max(got["rss_peak"], rss_mb(pid))
        reply = answer()
        if reply is not None:
            got["snaps"].append(snapshot(s, reply, start))
        behind = attempts < int((time.perf_counter() - start) * rate)
        s.sock.poll(1, zmq.POLLIN | (zmq.POLLOUT if behind else 0))  # wake as soon as a reply comes or a send fits
    got["sent_total"], got["start"] = s.next_id - 1, start
    end_wait = time.perf_counter() + 60
    while s.sent and time.perf_counter() < end_wait:
        if s.sock.poll(200):
            s.receive()
        got["rss_peak"] = max(got["rss_peak"], rss_mb(pid))
    time.sleep(2)
    st_sock.close()
    return got


def _rel(a, b):
    return abs(a - b) / b if b else float("nan")


def _spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)) if values else None,
            "p90": float(np.percentile(values, 90)) if values else None}  # fmt: skip


def burst(ctx, addr: str, pid: int, x: np.ndarray, rate: float, seconds: float, hwm: int, sndbuf: int) -> dict:
    """``rate`` requests/s of ``x`` to the leaf for ``seconds``; what came back, when ``overloaded`` began, the
    node's queue and p99 against the client's, Little's law, the leaf's RSS."""
    s = Sender(ctx, addr, x, hwm, sndbuf)
    got = offer(s, ctx, addr, pid, rate, seconds)
    s.sock.close()
    start, snaps, saturated_at = got["start"], got["snaps"], got["saturated_at"]
    first_over = s.first.get("overloaded")
    steady = [p for p in snaps if p["t"] >= 1.0 and p["client_outstanding"] > 0 and p["node_p99"]]
    # Little's law over the steady part: the client's mean number of samples in the system = result rate x mean latency
    t_lo, t_hi = start + 1.0, start + seconds
    window = [lat for t, lat in s.results if t_lo <= t <= t_hi]
    little = len(window) * s.n / (t_hi - t_lo) * float(np.mean(window)) if window else None
    node_mean = float(np.mean([p["node_queue"] for p in steady])) if steady else None
    after_saturation = None if first_over is None or saturated_at is None else (first_over - saturated_at) * 1000
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "sent": got["sent_total"],
        "achieved_rate": got["sent_total"] / seconds,
        "pushed_back_ticks": got["pushed_back"],
        "replies": dict(s.codes),
        "without_reply": len(s.sent),
        "first_overloaded_after_start_ms": None if first_over is None else (first_over - start) * 1000,
        "first_overloaded_after_saturation_ms": after_saturation,
        "rss_mb": {"before": got["rss0"], "peak": got["rss_peak"], "after": rss_mb(pid),
                   "growth_peak": got["rss_peak"] - got["rss0"]},  # fmt: skip
        "little_client_samples_in_system": little,
        "node_mean_queue": node_mean,
        "little_rel_diff": _rel(node_mean, little) if little and node_mean is not None else None,
        "queue_rel_diff": _spread([_rel(p["node_queue"], p["client_outstanding"]) for p in steady]),
        "p99_rel_diff": _spread([_rel(p["node_p99"], p["client_p99"]) for p in steady]),
        "client_latency_ms": {q: float(np.percentile([lat for _, lat in s.results], q)) * 1000 for q in (50, 99)}
        if s.results
        else None,
        "snapshots": snaps,
    }


BRIEF = ("achieved_rate", "pushed_back_ticks", "without_reply", "little_rel_diff", "first_overloaded_after_start_ms",
         "first_overloaded_after_saturation_ms", "queue_rel_diff", "p99_rel_diff", "replies")  # fmt: skip


def one_size(args: argparse.Namespace, bundle, work, size: int, test: np.ndarray, ctx) -> dict:
    """Requests of ``size`` samples: the leaf's capacity, then a burst at --factor times it."""
    x = np.resize(test, (size, *test.shape[1:]))
    node_args = ["--queue-limit", str(QUEUE_LIMIT), "--rcv-buf", str(args.rcv_buf)]
    with serve_command(bundle, logs=work / f"overload-logs-{size}", args=node_args) as cluster:
        leaf = next(k for k, v in cluster.nodes.items() if v["exit"] == 1)
        addr, pid = cluster.address(leaf), cluster.pid(leaf)
        window = max(1, min(256, QUEUE_LIMIT // (2 * size)))
        cap = capacity(ctx, addr, x, window, args.measure)
        print(f"runtime_overload: size {size}: capacity {cap:.0f} requests/s ({cap * size:.0f} samples/s), "
              f"window {window}", flush=True)  # fmt: skip
        res = burst(ctx, addr, pid, x, args.factor * cap, args.seconds, max(1, args.client_hwm // size),
                    args.client_sndbuf)  # fmt: skip
        res.update({"capacity_requests_per_s": cap, "capacity_samples_per_s": cap * size, "leaf": leaf,
                    "restarts": {k: v["restarts"] for k, v in cluster.state().items()}})  # fmt: skip
    brief = {k: res[k] for k in BRIEF}
    print(f"runtime_overload: size {size}: {json.dumps(brief, default=str)}; RSS {res['rss_mb']}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 256], help="samples per request")
    ap.add_argument("--factor", type=float, default=10.0, help="offered load as a multiple of the measured capacity")
    ap.add_argument("--seconds", type=float, default=20.0, help="burst length")
    ap.add_argument("--measure", type=float, default=5.0, help="seconds of the capacity measurement")
    ap.add_argument(
        "--client-hwm",
        type=int,
        default=128,
        help="the sending DEALER's send high-water mark in samples (messages x size)",
    )
    ap.add_argument(
        "--client-sndbuf", type=int, default=65536, help="the sending DEALER's SO_SNDBUF in bytes (-1: OS default)"
    )
    ap.add_argument("--rcv-buf", type=int, default=65536, help="the nodes' --rcv-buf (SO_RCVBUF bytes; -1: OS default)")
    add_live_args(ap, "runtime_overload", "4 s bursts, 2 s capacity runs")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.measure = 4.0, 2.0
    work, bundle = live_bundle(args)
    from cis.training.data.loading import load_dataset

    test = load_dataset("digits", seed=0).test.x
    ctx = zmq.Context()
    out = {"machine_before": machine(), "queue_limit": QUEUE_LIMIT, "factor": args.factor, "sizes": {}}
    for size in args.sizes:
        out["sizes"][str(size)] = one_size(args, bundle, work, size, test, ctx)
    out["machine_after"] = machine()
    out["command"] = "python -m bench.runtime_overload" + (" --quick" if args.quick else "")
    out["settings"] = {
        "rcv_buf": args.rcv_buf,
        "client_hwm_samples": args.client_hwm,
        "client_sndbuf": args.client_sndbuf,
    }
    write_out(args.out, out, report(out))
    return 0


def report(out: dict) -> str:
    def f(v, fmt=".0f"):
        return "-" if v is None else format(v, fmt)

    rows = [
        "| samples per request | capacity req/s | offered req/s | sent req/s | first `overloaded` after start / "
        "after saturation (ms) "
        "| without reply | leaf RSS before -> peak (MB) | queue: node vs client, median rel. diff | Little's "
        "law rel. diff | p99: node vs client, median rel. diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in out["sizes"].items():
        rows.append(
            f"| {size} | {f(r['capacity_requests_per_s'])} | {f(r['offered_rate'])} | {f(r['achieved_rate'])} "
            f"| {f(r['first_overloaded_after_start_ms'])} / {f(r['first_overloaded_after_saturation_ms'])} | "
            f"{r['without_reply']} "
            f"| {f(r['rss_mb']['before'], '.1f')} -> {f(r['rss_mb']['peak'], '.1f')} | "
            f"{f(r['queue_rel_diff']['median'], '.2f')} "
            f"| {f(r['little_rel_diff'], '.2f')} | {f(r['p99_rel_diff']['median'], '.2f')} |"
        )
    m0, m1 = out["machine_before"], out["machine_after"]
    return "\n".join(
        [
            "# Runtime overload: a leaf of `cis serve --all` (digits bundle) at 10x its capacity",
            "",
            f"Command: `{out['command']}`; settings {out['settings']}; queue limit {out['queue_limit']} samples.",
            f"Machine: {m0['cpus']} CPUs, load average before {m0['loadavg_1_5_15']}, after "
            f"{m1['loadavg_1_5_15']} (shared and noisy).",
            "",
            *rows,
            "",
            "Queue: the node's `queue_depth + in_flight_forwarded` against the samples the client has sent and "
            "not had answered, "
            "per status snapshot (what the client counts includes its own send queue and the TCP buffers in between). "
            "Little's law: the client's mean samples in the system (result rate x mean latency) against the "
            "node's mean queue. "
            "p99: the node's `latency.p99_s` against the p99 of the client's last 4,096 results at the same moment.",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
