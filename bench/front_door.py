"""What the front doors cost (issue 33): HTTP and gRPC against the ZeroMQ client, on the same node, in one run.

One node serving every stage of the digits fixture bundle (``cis serve BUNDLE --node cloud --http-port 0
--grpc-port 0``; the node pinned to CPU 0 with taskset where there are two CPUs or more, the clients on the
others), and in every block, side by side:

(a) latency at batch 1 and batch 32, one request at a time on one connection per protocol, the protocols
    taking turns request by request: the ZeroMQ client (``cis.Client.infer``), HTTP with JSON tensors, HTTP
    with binary tensors (Triton's extension, both ways) and gRPC (``raw_input_contents``). The HTTP client
    is a raw keep-alive socket with the request's bytes made once (what a lean client pays; a client library
    adds its own cost on top), the gRPC client grpcio with the request message made once. Added latency =
    p50 (door) - p50 (ZeroMQ) in the same block; goal: at most 0.3 ms for HTTP at batch 1;
(b) requests per second with the node on one core: ``GET /v2/health/live`` (goal: at least 5,000/s; 16 pipelined
    on each of 4 connections, and one at a time on each of 8, as load balancers probe) and infer at batch 1 over
    HTTP (8 pipelined on each of 8 connections), gRPC and ZeroMQ (64 in flight each);
(c) the transport floor: bare echo servers (bench/transport_echo.py, pinned like the node) over grpcio and
    pyzmq, the request's bytes sent and returned, taking turns call by call: what grpcio costs over ZeroMQ
    before any cis code runs, so the gRPC door's added latency splits into the library's and the door's own;
(d) ``--idle`` idle HTTP connections held open (default 10,000; the node's open-files limit permitting):
    infer p50 over HTTP beside them, and the node's open files and RSS before, with them, and after.

Medians over ``--repeats`` blocks. The machine's load is recorded (the development machine is shared).

    python -m bench.front_door             # 5 blocks of 2,000 requests, 10,000 idle connections
    python -m bench.front_door --quick     # smoke run

Writes bench/results/front_door.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import machine, serve_command, write_results

ROOT = Path(__file__).resolve().parents[1]


def bundle(work: Path) -> Path:
    if not (work / "bundle" / "manifest.json").exists():
        from cis.exporter.fixture_bundle import make_demo_bundle

        make_demo_bundle(work, steps=150)
    return work / "bundle"


def start_node(bundle_dir: Path) -> tuple[subprocess.Popen, str, tuple[str, int], str]:
    """The cloud node with both doors (:func:`bench.harness.serve_command`), on core 0 while this process (the
    clients) keeps the others: (its process, ZeroMQ address, the HTTP door's (host, port), the gRPC target)."""
    prefix: list[str] = []
    if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
        prefix = ["taskset", "-c", "0"]
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))
    node = serve_command(bundle_dir, node="cloud", prefix=prefix,
                         args=["--provider", "cpu", "--http-port", "0", "--grpc-port", "0", "--max-batch", "32",
                               "--http-max-connections", "20000", "--http-timeout", "600"])  # fmt: skip
    http = re.search(r"http://([\d.]+):(\d+)", node.nodes["cloud"].get("http", ""))
    grpc_target = node.nodes["cloud"].get("grpc")
    assert http and grpc_target, node.nodes
    return node.proc, node.address("cloud"), (http.group(1), int(http.group(2))), grpc_target


# ---------------------------------------------------------------- clients


class HttpClient:
    """A keep-alive HTTP/1.1 client over one socket: requests made once as bytes, answers read by length."""

    def __init__(self, where: tuple[str, int]):
        self.sock = socket.create_connection(where)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    @staticmethod
    def infer_request(x: np.ndarray, binary: bool) -> bytes:
        inp: dict = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
        extra, tail = b"", b""
        if binary:
            inp["parameters"] = {"binary_data_size": x.nbytes}
            head = json.dumps({"inputs": [inp], "parameters": {"binary_data_output": True}}).encode()
            extra, tail = b"Inference-Header-Content-Length: %d\r\n" % len(head), x.tobytes()
        else:
            inp["data"] = x.ravel().tolist()
            head = json.dumps({"inputs": [inp]}).encode()
        body = head + tail
        return b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: b\r\n%sContent-Length: %d\r\n\r\n%s" % (
            extra, len(body), body)  # fmt: skip

    def answers(self, count: int) -> None:
        """Read ``count`` whole answers (status 200 each)."""
        for _ in range(count):
            while b"\r\n\r\n" not in self.buf:
                self.buf += self.sock.recv(1 << 20)
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(re.search(rb"content-length: (\d+)", head).group(1))
            while len(rest) < length:
                rest += self.sock.recv(1 << 20)
            self.buf = rest[length:]

    def call(self, request: bytes) -> None:
        self.sock.sendall(request)
        self.answers(1)


def latencies(call, n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        call()
        out[i] = time.perf_counter() - t
    return out


def grpc_call(target: str, x: np.ndarray):
    import grpc

    from cis.runtime.oip import grpc_messages as pb

    channel = grpc.insecure_channel(target)
    stub = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)  # fmt: skip
    req = pb.ModelInferRequest(model_name="cis")
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return channel, stub, req


def start_echo(kind: str) -> tuple[subprocess.Popen, int]:
    from cis.runtime.launcher import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "bench.transport_echo", kind, str(port)]
    if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    return subprocess.Popen(cmd, stderr=subprocess.DEVNULL), port


def floor_block(payload: bytes, n: int) -> dict:
    """p50 and p99 of a bare grpcio echo and a bare pyzmq echo of ``payload``, taking turns call by call."""
    import grpc
    import zmq

    from bench.transport_echo import METHOD

    (gproc, gport), (zproc, zport) = start_echo("grpc"), start_echo("zeromq")
    channel = grpc.insecure_channel(f"127.0.0.1:{gport}")
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
        echo = channel.unary_unary(METHOD)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{zport}")
        calls = {"grpc_echo": lambda: echo(payload), "zeromq_echo": lambda: (sock.send(payload), sock.recv())}
        for _ in range(50):
            for call in calls.values():
                call()
        out = taking_turns(calls, n)
        sock.close(0)
    finally:
        channel.close()
        for p in (gproc, zproc):
            p.kill()
            p.wait(10)
    return out


def taking_turns(calls: dict, n: int) -> dict:
    """p50 and p99 (ms) of each call, the calls taking turns ``n`` times (a shared machine's load falls on all)."""
    out = {name: np.empty(n) for name in calls}
    for i in range(n):
        for name, call in calls.items():
            t = time.perf_counter()
            call()
            out[name][i] = time.perf_counter() - t
    return {k: {"p50_ms": float(np.percentile(v, 50) * 1e3), "p99_ms": float(np.percentile(v, 99) * 1e3)}
            for k, v in out.items()}  # fmt: skip


def latency_block(zmq: str, http: tuple[str, int], target: str, x: np.ndarray, n: int) -> dict:
    """p50 and p99 per protocol, the protocols taking turns request by request (so a shared machine's load
    falls on all of them alike)."""
    from cis.runtime.client import Client

    c = Client(zmq)
    calls = {"zeromq": lambda: c.infer(x)}
    clients = []
    for name, binary in (("http_json", False), ("http_binary", True)):
        h = HttpClient(http)
        req = h.infer_request(x, binary)
        clients.append(h)
        calls[name] = lambda h=h, req=req: h.call(req)
    channel, stub, greq = grpc_call(target, x)
    calls["grpc"] = lambda: stub(greq)
    for call in calls.values():
        call()
    out = taking_turns(calls, n)
    c.close()
    for h in clients:
        h.sock.close()
    channel.close()
    return out


def http_rate(http: tuple[str, int], request: bytes, n: int, conns: int = 4, depth: int = 16) -> float:
    """Requests per second with ``conns`` connections, each keeping ``depth`` requests pipelined."""
    clients = [HttpClient(http) for _ in range(conns)]
    per = max(depth, n // conns // depth * depth)
    t = time.perf_counter()
    for _ in range(per // depth):
        for c in clients:
            c.sock.sendall(request * depth)
        for c in clients:
            c.answers(depth)
    rate = per * conns / (time.perf_counter() - t)
    for c in clients:
        c.sock.close()
    return rate


def grpc_rate(target: str, x: np.ndarray, n: int, window: int = 64) -> float:
    channel, stub, req = grpc_call(target, x)
    stub(req)
    t = time.perf_counter()
    futures = [stub.future(req) for _ in range(window)]
    done = 0
    while done < n:
        futures.pop(0).result()
        done += 1
        if done + len(futures) < n:
            futures.append(stub.future(req))
    channel.close()
    return n / (time.perf_counter() - t)


def zmq_rate(zmq: str, x: np.ndarray, n: int) -> float:
    from cis.runtime.client import Client

    with Client(zmq) as c:
        t = time.perf_counter()
        c.infer_many(np.repeat(x, n, axis=0), batch_size=len(x), window=64)
        return n / (time.perf_counter() - t)


def usage(pid: int) -> dict:
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
    return {"open_files": len(os.listdir(f"/proc/{pid}/fd")), "rss_mib": rss / 1024}


def idle_connections(proc: subprocess.Popen, http: tuple[str, int], x: np.ndarray, count: int, n: int) -> dict:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
    before = usage(proc.pid)
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(http, timeout=5))
        except OSError:
            break
    time.sleep(1.0)
    held = usage(proc.pid)
    h = HttpClient(http)
    req = h.infer_request(x, False)
    p50 = float(np.percentile(latencies(lambda: h.call(req), n), 50) * 1e3)
    h.sock.close()
    for s in socks:
        s.close()
    time.sleep(2.0)
    return {"opened": len(socks), "infer_p50_ms_beside_them": p50, "before": before, "with_them": held,
            "after": usage(proc.pid)}  # fmt: skip


# ---------------------------------------------------------------- the run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="blocks (medians over them)")
    ap.add_argument("--n", type=int, default=2000, help="requests per latency measurement")
    ap.add_argument("--rate-n", type=int, default=20000, help="requests per throughput measurement")
    ap.add_argument("--idle", type=int, default=10000, help="idle HTTP connections to hold open")
    ap.add_argument("--work", default="/tmp/cis-bench/front_door", help="where the fixture bundle is cached")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 block, few requests, 500 idle connections")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.n, args.rate_n, args.idle = 1, 200, 2000, 500
    from cis.training.data.loading import load_dataset

    x_all = load_dataset("digits", seed=0).test.x.astype(np.float32)
    inputs = {1: x_all[:1], 32: x_all[:32]}
    proc, zmq, http, target = start_node(bundle(Path(args.work)))
    blocks: list[dict] = []
    try:
        for _ in range(args.repeats):
            block: dict = {"latency": {}, "rate": {}, "floor": {}}
            for batch, x in inputs.items():
                block["latency"][str(batch)] = latency_block(zmq, http, target, x, args.n)
                block["floor"][str(batch)] = floor_block(x.tobytes(), args.n)
            health = b"GET /v2/health/live HTTP/1.1\r\nHost: b\r\n\r\n"
            block["rate"]["http_health"] = http_rate(http, health, args.rate_n)
            block["rate"]["http_health_one_in_flight_per_conn"] = http_rate(http, health, args.rate_n // 4, 8, 1)
            one = HttpClient.infer_request(inputs[1], False)
            block["rate"]["http_infer"] = http_rate(http, one, args.rate_n // 4, conns=8, depth=8)  # 64 in flight
            block["rate"]["grpc_infer"] = grpc_rate(target, inputs[1], args.rate_n // 4)
            block["rate"]["zeromq_infer"] = zmq_rate(zmq, inputs[1], args.rate_n // 4)
            blocks.append(block)
            print(json.dumps(block["rate"]), file=sys.stderr)
        idle = idle_connections(proc, http, inputs[1], args.idle, args.n)
    finally:
        proc.terminate()
        proc.wait(30)
    summary = summarize(blocks)
    data = {"machine": machine(), "node_pinned": "taskset -c 0" if (os.cpu_count() or 1) >= 2 else None,
            "args": vars(args), "summary": summary, "idle": idle, "blocks": blocks}  # fmt: skip
    write_results("front_door", data, markdown(summary, idle, data))
    return 0


def summarize(blocks: list[dict]) -> dict:
    med = lambda vals: float(np.median(vals))  # noqa: E731
    out: dict = {"latency": {}, "rate": {}}
    for batch in blocks[0]["latency"]:
        rows = {}
        for proto in blocks[0]["latency"][batch]:
            p50 = [b["latency"][batch][proto]["p50_ms"] for b in blocks]
            p99 = [b["latency"][batch][proto]["p99_ms"] for b in blocks]
            zp50 = [b["latency"][batch]["zeromq"]["p50_ms"] for b in blocks]
            zp99 = [b["latency"][batch]["zeromq"]["p99_ms"] for b in blocks]
            rows[proto] = {"p50_ms": med(p50), "p99_ms": med(p99),
                           "added_p50_ms": med([a - z for a, z in zip(p50, zp50)]),
                           "added_p99_ms": med([a - z for a, z in zip(p99, zp99)])}  # fmt: skip
        out["latency"][batch] = rows
    for key in blocks[0]["rate"]:
        out["rate"][key] = med([b["rate"][key] for b in blocks])
    out["floor"] = {}
    for batch in blocks[0]["floor"]:
        g = [b["floor"][batch]["grpc_echo"]["p50_ms"] for b in blocks]
        z = [b["floor"][batch]["zeromq_echo"]["p50_ms"] for b in blocks]
        grpc_over = med([a - c for a, c in zip(g, z)])
        door = out["latency"][batch]["grpc"]["added_p50_ms"]
        out["floor"][batch] = {"grpc_echo_p50_ms": med(g), "zeromq_echo_p50_ms": med(z),
                               "grpcio_over_zeromq_p50_ms": grpc_over,
                               "grpc_door_own_p50_ms": door - grpc_over}  # fmt: skip
    return out


def markdown(summary: dict, idle: dict, data: dict) -> list[str]:
    m = data["machine"]
    lines = [
        "# Front doors: HTTP and gRPC (Open Inference Protocol) against the ZeroMQ client",
        "",
        f"`python -m bench.front_door{' --quick' if data['args']['quick'] else ''}`; {m['cpus']} CPUs, load "
        f"average {m['load_avg'][0]:.2f} at the end; node pinned: {data['node_pinned']}; medians over "
        f"{data['args']['repeats']} blocks of {data['args']['n']} requests. One node (digits bundle, all stages).",
        "",
        "| batch | protocol | p50 ms | p99 ms | added p50 ms | added p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for batch, rows in summary["latency"].items():
        for proto, r in rows.items():
            lines.append(f"| {batch} | {proto} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['added_p50_ms']:+.3f} | "
                         f"{r['added_p99_ms']:+.3f} |")  # fmt: skip
    lines += ["", "| requests per second (node on one core) | |", "|---|---|"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in summary["rate"].items()]
    lines += ["", "Transport floor (bare echo servers of the request's bytes, no cis code; "
              "bench/transport_echo.py):", "",
              "| batch | grpcio echo p50 ms | pyzmq echo p50 ms | grpcio over pyzmq | gRPC door's own (added - that) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for batch, f in summary.get("floor", {}).items():
        lines.append(f"| {batch} | {f['grpc_echo_p50_ms']:.3f} | {f['zeromq_echo_p50_ms']:.3f} | "
                     f"{f['grpcio_over_zeromq_p50_ms']:+.3f} | {f['grpc_door_own_p50_ms']:+.3f} |")  # fmt: skip
    b, w, a = idle["before"], idle["with_them"], idle["after"]
    lines += [
        "",
        f"Idle connections: {idle['opened']:,} held open; HTTP infer p50 beside them "
        f"{idle['infer_p50_ms_beside_them']:.3f} ms; node open files {b['open_files']} -> {w['open_files']} -> "
        f"{a['open_files']}, RSS {b['rss_mib']:.0f} -> {w['rss_mib']:.0f} -> {a['rss_mib']:.0f} MiB "
        "(before, with them, after).",
        "",
        "Goals (issue 33): HTTP adds at most 0.3 ms at p50 for batch 1; the health endpoint serves at least "
        "5,000 requests/s on one core.",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
