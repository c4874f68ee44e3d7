"""The front door under half an hour of hostile traffic (issue 42): memory and open files flat, no good request lost.

One node (``cis serve BUNDLE --node cloud``, the digits fixture bundle, every stage) with both doors: HTTP over
TLS and gRPC, a bearer token, ``--metrics-port``; its limits small enough that the abuse meets them (``--http-timeout
5 --http-head-timeout 2 --max-message-bytes 8000000 --door-max-buffered-bytes 64000000``). Beside a steady good load
from Triton's own clients (``tritonclient.http`` over TLS and ``tritonclient.grpc``, each ``--rate`` requests/s of 4
digits with the token, every answer checked against the first), the abuse issue 42's hostile test found comes in
cycles of ``--cycle`` seconds, bounded in count, on loopback only:

- D1 bodies of 6 MB aborted mid-upload (unauthenticated: refused at their head; authenticated: held, then
  dropped) and chunked bodies past the limit;
- D2 TLS connections that never send a ClientHello, or half of one;
- D3 bodies that cannot be decoded (invalid UTF-8, ``data`` nested 10,000 deep, a 5,000-digit header length, numeric
  strings), each with a request pipelined behind it;
- D4 connections that send only CRLF, every second;
- D5 concurrent unauthenticated gRPC calls of 6 MB;
- D6 HEAD, 40 pipelined requests (the overflow 503), a JSON body over ``--http-max-json-bytes``, slow request
  heads (a header byte a second), garbage.

At the end of every cycle (its hostile connections closed, one second later) the node's RSS and open files are
read. The report: RSS and open files after the first cycle and at the end (the median of the last five cycles), each
flat within 10 % or not, and their largest value; the good load's p50/p99 per client and how many good requests were
lost (not answered, or answered wrongly): 0 expected; the doors' refusals by reason (``cis_door_refused_total``).
Not a timing benchmark (the machine is shared and not quieted for half an hour): its load is recorded.

The node is the harness's ``serve_command`` (``cis serve --node`` as a user runs it, in a child process: its RSS
and open files are the command's). The load is not the harness's load generator, on purpose: the good load is
Triton's own clients (what issue 42 asks to keep working beside the abuse), each answer checked against the
first; the abuse drives its own sockets (aborted uploads, half handshakes, malformed bodies), which no load
generator sends.

    python -m bench.door_soak                    # 30 minutes: bench/results/door_soak.{json,md}
    python -m bench.door_soak --duration 120     # a short run (same result files)
    python -m bench.door_soak --quick            # a smoke run of 60 s: bench/results/door_soak-quick.{json,md}
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from bench.harness import Served, machine, serve_command, write_results

TOKEN = "soak-token-0123456789"
INFER = b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: soak\r\n"
AUTH = b"Authorization: Bearer %s\r\n" % TOKEN.encode()
NODE_FLAGS = ["--http-timeout", "5", "--http-head-timeout", "2", "--max-message-bytes", "8000000",
              "--door-max-buffered-bytes", "64000000", "--http-max-json-bytes", "1000000"]  # fmt: skip


def bundle(work: Path) -> Path:
    if not (work / "bundle" / "manifest.json").exists():
        from cis.exporter.fixture_bundle import make_demo_bundle

        make_demo_bundle(work, steps=150)
    return work / "bundle"


def certificate(work: Path) -> tuple[Path, Path]:
    cert, key = work / "cert.pem", work / "key.pem"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)  # fmt: skip
    return cert, key


def start_node(work: Path) -> tuple[Served, dict]:
    """``cis serve BUNDLE --node cloud`` with both doors, TLS, the token and ``--metrics-port`` (the harness's
    ``serve_command``); where its doors and /metrics are."""
    cert, key = certificate(work)
    (work / "token").write_text(TOKEN + "\n")
    flags = ["--provider", "cpu", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
             "--http-tls-cert", str(cert), "--http-tls-key", str(key), "--auth-token-file", str(work / "token"),
             "--http-host", "127.0.0.1", *NODE_FLAGS]  # fmt: skip
    node = serve_command(bundle(work), node="cloud", args=flags, timeout=180)
    found = node.nodes["cloud"]
    if not {"http", "grpc", "metrics"} <= set(found):
        node.stop()
        raise SystemExit(f"the node did not say where its doors and /metrics are: {found}")
    http = urlsplit(found["http"])
    return node, {"http": (http.hostname, http.port), "grpc": found["grpc"], "metrics": found["metrics"],
                  "cert": str(cert)}  # fmt: skip


def usage(pid: int) -> dict:
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
    return {"rss_mib": rss / 1024, "open_files": len(os.listdir(f"/proc/{pid}/fd"))}


# ---------------------------------------------------------------- the good load


class GoodLoad(threading.Thread):
    """``rate`` requests/s from a tritonclient (HTTP over TLS or gRPC), each answer checked; latencies kept."""

    def __init__(self, kind: str, where: dict, x: np.ndarray, rate: float, stop: threading.Event):
        super().__init__(daemon=True)
        self.kind, self.where, self.x, self.rate, self.stop = kind, where, x, rate, stop
        self.latencies: list[float] = []
        self.lost: list[str] = []
        self.want: np.ndarray | None = None

    def _client(self):
        if self.kind == "http":
            import tritonclient.http as client

            host, port = self.where["http"]
            c = client.InferenceServerClient(
                f"{host}:{port}", ssl=True, ssl_options={"ca_certs": self.where["cert"]}, insecure=True,
                network_timeout=30,
            )  # fmt: skip
        else:
            import tritonclient.grpc as client

            c = client.InferenceServerClient(self.where["grpc"])
        given = client.InferInput("input", list(self.x.shape), "FP32")
        given.set_data_from_numpy(self.x)
        return c, given, [client.InferRequestedOutput("class")]

    def run(self) -> None:
        c, given, outputs = self._client()
        headers = {"authorization": f"Bearer {TOKEN}"}
        due = time.monotonic()
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                kw = {"client_timeout": 30} if self.kind == "grpc" else {}
                got = c.infer("cis", [given], outputs=outputs, headers=headers, **kw).as_numpy("class")
                if self.want is None:
                    self.want = got
                if not np.array_equal(got, self.want):
                    self.lost.append(f"wrong answer {got.tolist()}")
            except Exception as exc:  # a good request not answered: lost
                self.lost.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            self.latencies.append(time.monotonic() - t0)
            due += 1 / self.rate
            time.sleep(max(0.0, due - time.monotonic()))


# ---------------------------------------------------------------- the abuse (one cycle)


def _tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def _open(where: tuple[str, int], tls: bool = True) -> socket.socket:
    s = socket.create_connection(where, timeout=10)
    return _tls().wrap_socket(s) if tls else s


def _read_all(s: socket.socket, limit: float = 10) -> bytes:
    s.settimeout(limit)
    got = b""
    try:
        while chunk := s.recv(1 << 16):
            got += chunk
    except (OSError, ssl.SSLError):
        pass
    return got


def _statuses(answer: bytes) -> list[str]:
    return [m.decode() for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def aborted_uploads(where: tuple[str, int], authenticated: bool) -> Counter:
    """6 MB bodies of binary tensors (under --http-max-json-bytes: a JSON header of 100 bytes), half sent: held
    in the doors' budget when authenticated, refused at their head when not."""
    seen: Counter = Counter()
    auth = AUTH + b"Inference-Header-Content-Length: 100\r\n" if authenticated else b""
    try:
        with _open(where) as s:
            s.sendall(INFER + auth + b"Content-Length: 6000000\r\n\r\n")
            for _ in range(12):  # 3 MB of 6, then gone
                s.sendall(bytes(256 << 10))
            time.sleep(0.2)
    except (OSError, ssl.SSLError):
        seen["closed by the node"] += 1
    seen["aborted upload"] += 1
    return seen


def chunked_past_the_limit(where: tuple[str, int]) -> Counter:
    with _open(where) as s:
        try:
            s.sendall(INFER + AUTH + b"Transfer-Encoding: chunked\r\n\r\n")
            for _ in range(40):
                s.sendall(b"%x\r\n%s\r\n" % (256 << 10, bytes(256 << 10)))
        except (OSError, ssl.SSLError):
            pass
        return Counter(f"chunked: {code}" for code in _statuses(_read_all(s)) or ["no answer"])


def undecodable(where: tuple[str, int]) -> Counter:
    bodies = [
        (b'{"id":"u8","inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":["\xff"]}]}', b""),
        (b'{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":' + b"[" * 10000 + b"]" * 10000
         + b"}]}", b""),
        (b"{}", b"Inference-Header-Content-Length: " + b"9" * 5000 + b"\r\n"),
        (b'{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":' + b'["1"]' + b"}]}", b""),
    ]  # fmt: skip
    seen: Counter = Counter()
    after = b"GET /v2/health/live HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"
    for body, extra in bodies:
        with _open(where) as s:
            s.sendall(INFER + AUTH + extra + b"Content-Length: %d\r\n\r\n%s" % (len(body), body) + after)
            seen["undecodable: " + "+".join(_statuses(_read_all(s))) or "none"] += 1
    return seen


def d6(where: tuple[str, int]) -> Counter:
    seen: Counter = Counter()
    with _open(where) as s:
        s.sendall(b"HEAD /v2/health/ready HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
        seen["HEAD: " + "+".join(_statuses(_read_all(s)))] += 1
    with _open(where) as s:
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: soak\r\n\r\n" * 40)
        seen["pipelined 40: " + str(Counter(_statuses(_read_all(s))))] += 1
    body = json.dumps({"inputs": [{"name": "input", "shape": [4096, 1, 8, 8], "datatype": "FP32",
                                   "data": [0.5] * (4096 * 64)}]}).encode()  # fmt: skip
    with _open(where) as s:
        try:
            s.sendall(INFER + AUTH + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except (OSError, ssl.SSLError):
            pass
        seen["JSON over the limit: " + "+".join(_statuses(_read_all(s)))] += 1
    with _open(where, tls=False) as s:
        s.sendall(b"GARBAGE\x00\x01 / HTTP/9.9\r\n\r\n")
        _read_all(s, 5)
        seen["garbage"] += 1
    return seen


def held_connections(where: tuple[str, int], seconds: float) -> Counter:
    """D2 (no handshake, half a ClientHello), D4 (CRLF every second) and slow heads (a header byte a second), all
    held together for ``seconds``: how many the node closed."""
    groups: dict[str, list[socket.socket]] = {"no handshake": [], "half ClientHello": [], "CRLF": [], "slow head": []}
    for _ in range(150):
        groups["no handshake"].append(_open(where, tls=False))
    for _ in range(50):
        s = _open(where, tls=False)
        s.sendall(b"\x16\x03\x01\x00")
        groups["half ClientHello"].append(s)
    for _ in range(150):
        groups["CRLF"].append(_open(where))
    for _ in range(50):
        s = _open(where)
        s.sendall(b"POST /v2/models/cis/infer HTTP/1.1\r\nX-Slow: ")
        groups["slow head"].append(s)
    closed: Counter = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, socks in groups.items():
            for s in list(socks):
                if _closed_by_node(s, name):
                    closed[f"{name}: closed by the node"] += 1
                    socks.remove(s)
                    s.close()
        time.sleep(1.0)
    for name, socks in groups.items():
        closed[f"{name}: still open at the end"] += len(socks)
        for s in socks:
            s.close()
    return closed


def _closed_by_node(s: socket.socket, name: str) -> bool:
    try:
        if name == "CRLF":
            s.sendall(b"\r\n")
        elif name == "slow head":
            s.sendall(b"x")
        s.setblocking(False)
        try:
            s.recv(1 << 16)  # EOF, or the 408 before the close
        finally:
            s.setblocking(True)
        return True
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except (OSError, ssl.SSLError):
        return True


def grpc_unauthenticated(target: str, calls: int) -> Counter:
    import grpc

    from cis.runtime.oip import grpc_messages as pb

    req = pb.ModelInferRequest(model_name="cis")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 1, 8, 8])
    req.raw_input_contents.append(bytes(6_000_000))
    payload = req.SerializeToString()

    def one(_):
        with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 16 << 20)]) as ch:
            call = ch.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)  # fmt: skip
            try:
                call(payload, timeout=20)
                return "answered"
            except grpc.RpcError as exc:
                return exc.code().name

    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        return Counter(f"gRPC unauthenticated: {code}" for code in pool.map(one, range(calls)))


def cycle(where: dict, hold: float) -> Counter:
    http = where["http"]
    jobs = [lambda: held_connections(http, hold), lambda: grpc_unauthenticated(where["grpc"], 6)]
    jobs += [lambda a=a: aborted_uploads(http, a) for a in (False, False, True, True)]
    jobs += [lambda: chunked_past_the_limit(http), lambda: undecodable(http), lambda: d6(http)]
    seen: Counter = Counter()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for done in pool.map(lambda job: _safe(job), jobs):
            seen.update(done)
    return seen


def _safe(job) -> Counter:
    try:
        return job()
    except Exception as exc:  # an attack that failed on the client's side is noted, not fatal
        return Counter({f"attack error: {type(exc).__name__}": 1})


# ---------------------------------------------------------------- the run


def door_metrics(url: str) -> dict:
    import urllib.request

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict = {}
    for name, labels, value in re.findall(r"^(cis_door_\w+?)(\{[^}]*\})? (\S+)$", text, re.M):
        out[name + labels] = float(value)
    return out


def summarize(samples: list[dict], loads: list[GoodLoad]) -> dict:
    start = samples[0]
    tail = samples[-5:]
    out: dict = {}
    for key in ("rss_mib", "open_files"):
        end = float(np.median([s[key] for s in tail]))
        change = (end - start[key]) / start[key]
        out[key] = {"start": start[key], "end": end, "max": max(s[key] for s in samples), "change": change,
                    "flat_within_10pct": abs(change) <= 0.1}  # fmt: skip
    for load in loads:
        ms = np.array(load.latencies) * 1e3
        out[f"good_{load.kind}"] = {
            "requests": len(load.latencies), "lost": len(load.lost), "lost_examples": load.lost[:5],
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
        }  # fmt: skip
    return out


def markdown(summary: dict, data: dict) -> list[str]:
    lines = [
        "# The front door under hostile traffic (issue 42)", "",
        f"{'QUICK SMOKE RUN, not a result. ' if data['args']['quick'] else ''}"
        f"`{data['command']}`: {data['cycles']} cycles of "
        f"{data['args']['cycle']:g} s of abuse beside a steady good load (tritonclient over HTTP/TLS and gRPC, "
        f"{data['args']['rate']:g} requests/s each). Node flags: `{' '.join(NODE_FLAGS)}`, TLS, a bearer token. "
        f"Machine: {data['machine']['cpus']} CPUs, load average at the end {data['machine']['load_avg'][0]:.2f} "
        "(shared, not quieted: latencies are the shared machine's).", "",
        "| the node | after cycle 1 | at the end (median of the last 5) | largest | change | flat within 10 % |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for key, label in (("rss_mib", "RSS (MiB)"), ("open_files", "open files")):
        s = summary[key]
        lines.append(f"| {label} | {s['start']:.1f} | {s['end']:.1f} | {s['max']:.1f} | {s['change']:+.1%} | "
                     f"{'yes' if s['flat_within_10pct'] else 'no'} |")  # fmt: skip
    lines += ["", "| good load | requests | lost | p50 (ms) | p99 (ms) | max (ms) |", "|---|---|---|---|---|---|"]
    for kind in ("http", "grpc"):
        g = summary[f"good_{kind}"]
        lines.append(f"| tritonclient {kind} | {g['requests']} | {g['lost']} | {g['p50_ms']:.1f} | {g['p99_ms']:.1f} "
                     f"| {g['max_ms']:.1f} |")  # fmt: skip
    lines += ["", "What the abuse met (all cycles):", "", "| attack: outcome | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(data["abuse"].items())]
    lines += ["", "The doors' refusals at the end (`/metrics`):", "", "| metric | value |", "|---|---|"]
    lines += [f"| `{k}` | {v:g} |" for k, v in sorted(data["door_metrics"].items())]
    return lines


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of abuse (default 30 minutes)")
    ap.add_argument("--cycle", type=float, default=20.0, help="seconds per abuse cycle")
    ap.add_argument("--rate", type=float, default=20.0, help="good requests per second per client")
    ap.add_argument("--work", default="/tmp/cis-bench/door_soak", help="where the bundle and certificate are kept")
    ap.add_argument("--quick", action="store_true", help="smoke run: 60 s; results in door_soak-quick.{json,md}")
    args = ap.parse_args()
    if args.quick:
        args.duration = 60.0
    return args


def soak(node: Served, where: dict, x: np.ndarray, args: argparse.Namespace) -> dict:
    """The good load beside ``args.duration`` seconds of abuse cycles; the node's use after each cycle."""
    stop = threading.Event()
    loads = [GoodLoad(kind, where, x, args.rate, stop) for kind in ("http", "grpc")]
    abuse: Counter = Counter()
    samples: list[dict] = []
    try:
        for load in loads:
            load.start()
        end = time.monotonic() + args.duration
        while time.monotonic() < end and node.proc.poll() is None:
            began = time.monotonic()
            abuse.update(cycle(where, hold=max(1.0, args.cycle - 8)))
            time.sleep(max(1.0, args.cycle - (time.monotonic() - began)))
            samples.append({"t": round(time.monotonic() - end + args.duration, 1), **usage(node.proc.pid)})
            print(json.dumps(samples[-1]), file=sys.stderr)
    finally:
        stop.set()
        for load in loads:
            load.join(60)
    return {"loads": loads, "abuse": abuse, "samples": samples}


def main() -> int:
    args = parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    from cis.training.data.loading import load_dataset

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    x = load_dataset("digits", seed=0).test.x[:4].astype(np.float32)
    node, where = start_node(work)
    with node:  # stopped on the way out (SIGTERM: the node drains)
        got = soak(node, where, x, args)
        metrics = door_metrics(where["metrics"])
        alive = node.proc.poll() is None
    summary = summarize(got["samples"], got["loads"])
    data = {"machine": machine(), "command": " ".join(["python", "-m", "bench.door_soak", *sys.argv[1:]]),
            "args": vars(args), "node_flags": NODE_FLAGS, "node_alive_at_end": alive,
            "cycles": len(got["samples"]), "summary": summary, "abuse": dict(got["abuse"]), "door_metrics": metrics,
            "samples": got["samples"]}  # fmt: skip
    write_results("door_soak-quick" if args.quick else "door_soak", data, markdown(summary, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
