"""Issue 42: the front door cannot be exhausted. Each defect the hostile test found, on a real node process
(``cis serve --http-port 0 --grpc-port 0``, the digits bundle), and the door's own objects in-process:

- D1: a body aborted mid-upload, or chunked past the limit, gives its memory back at once: no reference cycle
  holds a connection (checked with the garbage collector disabled), RSS stays flat over many aborts; the token
  is checked before any body byte is read; a per-node cap bounds the bytes all unfinished requests hold;
- D2: a TLS connection that never finishes its handshake is closed after the head timeout;
- D3: every body that cannot be decoded is answered (400, with the request's ``id`` when it was read) and the
  requests pipelined behind it are answered too;
- D4: bytes that are no request (bare CRLF) do not keep a connection open; a full door makes room for a new
  connection by closing the longest idle one;
- D5: gRPC checks the token before it reads the message;
- D6: HEAD, the pipeline-overflow 503, the bearer scheme's case, a version-01 traceparent, a JSON body over
  its limit.
"""

from __future__ import annotations

import concurrent.futures
import gc
import json
import os
import re
import socket
import ssl
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("httptools")
grpc = pytest.importorskip("grpc")

from cli_process import read_until, start, stop  # noqa: E402
from test_front_door import _grpc_call, _grpc_infer, _infer_body, _self_signed  # noqa: E402

from cis.runtime.launcher import free_port  # noqa: E402

MAX_BYTES = 6_000_000  # --max-message-bytes of the node: the largest body
INFER = b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\n"


class Served:
    def __init__(self, proc, text: str):
        self.proc = proc
        http = re.search(r"http front door at (\S+)", text).group(1)
        self.tls = http.startswith("https://")
        self.host, port = http.split("://")[1].rsplit(":", 1)
        self.port = int(port)
        self.grpc = re.search(r"grpc front door at (\S+)", text).group(1)
        metrics = re.search(r"(http://[\d.]+:\d+/metrics)", text)
        self.metrics = metrics.group(1) if metrics else None


def _serve(bundle_dir, *extra) -> Served:
    zmq = f"tcp://127.0.0.1:{free_port()}"
    proc = start(
        "serve", bundle_dir, "--node", "cloud", "--bind", zmq, "--provider", "cpu", "--http-port", 0,
        "--grpc-port", 0, "--max-message-bytes", MAX_BYTES, *extra,
    )  # fmt: skip
    return Served(proc, "".join(read_until(proc.stderr, proc, "node_start")))


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("door"), steps=150)


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test.x[:8].astype(np.float32)


@pytest.fixture(scope="module")
def node(bundle_dir):
    served = _serve(bundle_dir, "--http-timeout", "1")
    yield served
    assert stop(served.proc) == 0


def _connect(node: Served, timeout: float = 10) -> socket.socket:
    return socket.create_connection((node.host, node.port), timeout=timeout)


def _answers(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    got = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _statuses(answer: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def _rss_kib(pid: int) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _good(node: Served, x: np.ndarray) -> None:
    with _connect(node) as s:
        body = _infer_body(x[:2])
        s.sendall(INFER + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert _statuses(_answers(s)) == [200]


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (what it sends before is read and dropped)."""
    sock.settimeout(within)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# ---------------------------------------------------------------- D1: memory of unfinished bodies


def test_aborted_uploads_give_their_memory_back(node, digits):
    """Six uploads of 5 MB aborted mid-body and six chunked bodies over the limit: the node's RSS after them
    is where it was after the first (each round frees what it held; before the fix each held its bytes)."""
    chunk = bytes(1 << 20)

    def aborted() -> None:
        with _connect(node) as s:
            s.sendall(INFER + b"Content-Length: %d\r\n\r\n" % (MAX_BYTES - 1000))
            for _ in range(5):
                s.sendall(chunk)
            time.sleep(0.3)  # the node reads it all; then the client goes

    def chunked_over() -> None:
        with _connect(node) as s:
            s.sendall(INFER + b"Transfer-Encoding: chunked\r\n\r\n")
            try:
                for _ in range(7):
                    s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert 413 in _statuses(_answers(s))

    aborted(), chunked_over()
    _good(node, digits)
    rss0 = _rss_kib(node.proc.pid)
    for _ in range(6):
        aborted()
        chunked_over()
    _good(node, digits)
    grown = _rss_kib(node.proc.pid) - rss0
    assert grown < 12_000, f"RSS grew {grown} KiB over 12 aborted bodies of ~5 MB each"


def test_the_token_is_checked_before_any_body_byte(bundle_dir, tmp_path, digits):
    (tmp_path / "token").write_text("s3cret\n")
    served = _serve(bundle_dir, "--auth-token-file", tmp_path / "token", "--http-timeout", "5")
    try:
        with _connect(served) as s:  # the head only: the 401 comes before the body is sent, and the door closes
            s.sendall(INFER + b"Content-Length: 5000000\r\n\r\n")
            s.settimeout(3)
            answer = s.recv(1 << 16)
            assert _statuses(answer) == [401] and b"connection: close" in answer.lower()
        with _connect(served) as s:  # a lower-case scheme is the same scheme (RFC 7235)
            body = _infer_body(digits[:1])
            s.sendall(INFER + b"Authorization: bearer s3cret\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(body), body))  # fmt: skip
            assert _statuses(_answers(s)) == [200]
        metadata = [("authorization", "bearer s3cret")]
        assert _grpc_call(served, "ModelInfer", _grpc_infer(digits[:1]), metadata).outputs[0].shape == [1]
    finally:
        assert stop(served.proc) == 0


def test_the_nodes_cap_on_unfinished_bodies(bundle_dir, digits):
    """--door-max-buffered-bytes 5000000: two half-sent bodies of 2 MB hold their 4 MB; a third whose body would
    pass the cap is refused at its head (503, closed), and the first two still complete; the metrics say so."""
    served = _serve(bundle_dir, "--door-max-buffered-bytes", "5000000", "--metrics-port", "0")
    x = np.zeros((2048, 1, 8, 8), np.float32)  # 512 KiB of binary tensor data
    head = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()  # fmt: skip
    body = head + x.tobytes() * 4
    request = INFER + b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(head), len(body))
    try:
        held = [_connect(served) for _ in range(2)]
        for s in held:
            s.sendall(request + body[: 1_400_000])
        end = time.monotonic() + 10
        while _metric(_scrape(served), "cis_door_buffered_bytes") < 2 * len(body) and time.monotonic() < end:
            time.sleep(0.05)  # until the node has read both heads
        with _connect(served) as third:
            third.sendall(request + body[:400_000])
            answer = _answers(third)
            assert _statuses(answer) == [503] and b"--door-max-buffered-bytes" in answer
        metrics = _scrape(served)
        assert _metric(metrics, 'cis_door_buffered_bytes') == 2 * len(body)  # reserved at their heads
        assert _metric(metrics, 'cis_door_refused_total{door="http",reason="max_buffered_bytes"}') == 1
        for s in held:  # their bodies stay theirs: each completes (400: the body has 4x the input's bytes)
            s.sendall(body[1_400_000:])
            s.settimeout(10)
            assert _statuses(s.recv(1 << 16)) == [400]
            s.close()
        _good(served, digits)
        assert _metric(_scrape(served), "cis_door_buffered_bytes") == 0  # given back
    finally:
        assert stop(served.proc) == 0


def test_no_reference_cycle_holds_a_connection(tmp_path):
    """With the garbage collector off, every connection's objects are gone once it ends: aborted bodies, bodies
    over the limit (Content-Length and chunked), malformed requests, answered requests."""
    from cis.runtime.oip.http_connection import Connection

    node, running = _inprocess_node(tmp_path)
    door = node.doors[0]
    port = int(door.url.rsplit(":", 1)[1])
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    good = INFER + b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
    clients = [
        INFER + b"Content-Length: 900000\r\n\r\n" + bytes(300_000),  # aborted
        INFER + b"Content-Length: 2000000\r\n\r\n",  # over the limit
        INFER + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 1_100_000 + bytes(1_100_000),  # chunked over
        b"GARBAGE / HTTP/9.9\r\n\r\n",
        good + good.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"),
        INFER + b"Content-Length: 7\r\n\r\n{\"id\":",  # not JSON
    ]
    gc.collect()
    gc.disable()
    try:
        for data in clients * 3:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                try:
                    s.sendall(data)
                    s.settimeout(0.5)
                    while s.recv(1 << 16):
                        pass
                except (TimeoutError, ConnectionResetError, BrokenPipeError):
                    pass
        end = time.monotonic() + 10
        while door.conns and time.monotonic() < end:
            time.sleep(0.05)
        assert not door.conns
        time.sleep(0.2)
        left = [o for o in gc.get_objects() if type(o) is Connection or type(o).__name__ == "HttpRequestParser"]
        assert not left, f"{len(left)} objects of ended connections are held (only a cycle collection frees them)"
    finally:
        gc.enable()
        running.close()


def _inprocess_node(tmp_path, grpc_door: bool = False):
    """A node in a thread of this process (numpy stages) with an HTTP door (and a gRPC door), for looking at its
    objects."""
    from collections import namedtuple

    from cis.runtime.node import Node, NodeConfig
    from cis.runtime.oip import codec
    from cis.runtime.oip.door import DoorConfig
    from cis.runtime.oip.http_door import HttpDoor

    T = namedtuple("T", "name shape dtype")

    class Stage:
        inputs = (T("input", (None, 4), "float32"),)
        outputs = (T("logits", (None, 3), "float32"),)

        def run(self, feeds):
            return {"logits": feeds["input"][:, :3] * 10}

    cfg = NodeConfig(node_id="root", exit=1, bind=f"tcp://127.0.0.1:{free_port()}", max_message_bytes=1_000_000)
    node = Node(cfg, {1: Stage()})
    model = codec.Model.of_stage("cis", "root", Stage.inputs, Stage.outputs)
    node.doors.append(HttpDoor(model, DoorConfig(0, timeout=1.0, max_body=1_000_000)))
    if grpc_door:
        from cis.runtime.oip.grpc_door import GrpcDoor

        node.doors.append(GrpcDoor(model, DoorConfig(0)))
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=node.run, kwargs=dict(install_signals=False, ready=ready.set, stop=stop.is_set), daemon=True
    )
    thread.start()
    assert ready.wait(10)

    class Running:
        def close(self):
            stop.set()
            thread.join(15)

    return node, Running()


def test_the_grpc_health_service_follows_the_node(tmp_path):
    """grpc.health.v1 says SERVING while the node serves and NOT_SERVING once a stage has failed (as ServerReady)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    node, running = _inprocess_node(tmp_path, grpc_door=True)
    try:
        with grpc.insecure_channel(node.doors[1].url) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def status():
                return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status

            assert status() == health_pb2.HealthCheckResponse.SERVING
            node.executor.stage_ok = False  # what a stage failure leaves
            end = time.monotonic() + 10
            while status() != health_pb2.HealthCheckResponse.NOT_SERVING and time.monotonic() < end:
                time.sleep(0.1)
            assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        running.close()


# ---------------------------------------------------------------- D2: TLS handshakes that never finish


def test_a_tls_handshake_that_never_finishes_is_closed(bundle_dir, tmp_path, digits):
    cert, key = _self_signed(tmp_path)
    served = _serve(bundle_dir, "--http-tls-cert", cert, "--http-tls-key", key, "--http-timeout", "2")
    try:
        pid = served.proc.pid
        fds0 = _fds(pid)
        silent = [_connect(served) for _ in range(40)]  # TCP only: no ClientHello ever comes
        half = [_connect(served) for _ in range(10)]
        for s in half:
            s.sendall(b"\x16\x03\x01\x00")  # the start of a ClientHello, never finished
        end = time.monotonic() + 10
        while _fds(pid) < fds0 + 50 and time.monotonic() < end:
            time.sleep(0.05)  # until the node has accepted all 50
        assert _fds(pid) >= fds0 + 50
        assert all(_closed_by_server(s, 8) for s in silent + half)
        for s in silent + half:
            s.close()
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        with context.wrap_socket(_connect(served)) as s:
            body = _infer_body(digits[:1])
            s.sendall(INFER + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            assert _statuses(_answers(s)) == [200]
        end = time.monotonic() + 5
        while _fds(pid) > fds0 and time.monotonic() < end:
            time.sleep(0.1)
        assert _fds(pid) <= fds0
    finally:
        assert stop(served.proc) == 0


# ---------------------------------------------------------------- D3: every bad body answered


@pytest.mark.parametrize(
    "body, headers, code, words, req_id",
    [
        (b'{"id": "u8", "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": ["\xff"]}]}',
         b"", "bad_tensor", "list of FP32", "u8"),
        (b'{"id": "deep", "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": '
         + b"[" * 10_000 + b"]" * 10_000 + b"}]}", b"", "bad_message", "nested too deeply", "deep"),
        (b"{}", b"Inference-Header-Content-Length: " + b"9" * 5000 + b"\r\n", "bad_message",
         "Inference-Header-Content-Length", None),
        (b'{"id": "\xff\xfe", "inputs": []}', b"", "bad_message", "not UTF-8", None),
    ],
)  # fmt: skip
def test_every_body_that_cannot_be_decoded_is_answered_and_so_is_the_next(node, body, headers, code, words, req_id):
    """Invalid UTF-8, ``data`` nested 10,000 deep, a header length of 5,000 digits: each a 400 (with the request's
    ``id`` where it could be read), and the request pipelined behind it is answered too."""
    bad = INFER + headers + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    after = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with _connect(node) as s:
        s.sendall(bad + after)
        answer = _answers(s)
    assert _statuses(answer) == [400, 200], answer[:300]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1", 1)[0])
    assert error["code"] == code and words in error["error"], error
    assert error.get("id") == req_id


def test_a_decode_error_echoes_the_id(node):
    body = json.dumps({"id": "r9", "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                "data": [0] * 64}]}).encode()  # fmt: skip
    with _connect(node) as s:
        s.sendall(INFER + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        answer = _answers(s)
    assert _statuses(answer) == [400]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["id"] == "r9"


def test_a_header_that_never_ends_is_refused_at_its_limit(node, digits):
    """A header value sent on and on without its line end: the parser keeps it, so the door counts what it is fed
    as head bytes and refuses the request past 64 KiB, rather than buffering until the timeout."""
    with _connect(node) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Long: ")
        try:
            for _ in range(20):
                s.sendall(b"a" * 8192)
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(0.8)  # well before --http-timeout (1 s) would give 408
        answer = s.recv(1 << 16)
    assert _statuses(answer) == [400] and b"request line and headers over 65536 bytes" in answer
    _good(node, digits)


# ---------------------------------------------------------------- D4: bytes that are no request


def test_bare_crlf_does_not_keep_a_connection_open(node, digits):
    with _connect(node) as s:
        end = time.monotonic() + 4
        closed = False
        while time.monotonic() < end and not closed:
            try:
                s.sendall(b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = _closed_by_server(s, 0.3)
        assert closed, "a connection sending only CRLF stayed open past --http-timeout (1 s)"
    _good(node, digits)


def test_a_full_door_closes_its_longest_idle_connection_for_a_new_one(bundle_dir, digits):
    served = _serve(bundle_dir, "--http-max-connections", "4", "--http-timeout", "30")
    try:
        idle = [_connect(served) for _ in range(4)]
        for s in idle:
            s.sendall(b"\r\n")
        time.sleep(0.3)
        _good(served, digits)  # the door is full: the oldest idle connection makes room
        assert _closed_by_server(idle[0], 5)
        for s in idle:
            s.close()
    finally:
        assert stop(served.proc) == 0


# ---------------------------------------------------------------- D5: gRPC reads nothing before the token


def test_grpc_checks_the_token_before_reading_the_message(bundle_dir, tmp_path, digits):
    (tmp_path / "token").write_text("s3cret\n")
    served = _serve(bundle_dir, "--auth-token-file", tmp_path / "token", "--max-message-bytes", "40000000")
    try:
        pid = served.proc.pid
        _grpc_call(served, "ModelInfer", _grpc_infer(digits[:1]), [("authorization", "Bearer s3cret")])
        hwm0 = _hwm_kib(pid)
        big = _grpc_infer(np.zeros((1, 1, 8, 8), np.float32), raw=b"\0" * 30_000_000)

        def call(_):
            try:
                _grpc_call(served, "ModelInfer", big)
            except grpc.RpcError as exc:
                return exc.code()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(call, range(8)))
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
        peak = _hwm_kib(pid) - hwm0
        # read whole, the 8 messages would take 240 MB; refused first, grpcio still holds what HTTP/2 flow control
        # let in before the answer (its window, a few MB a stream: 67 MB for the 8 on a loaded CI machine)
        assert peak < 120_000, f"the node's peak RSS grew {peak} KiB for 8 unauthenticated calls of 30 MB"
    finally:
        assert stop(served.proc) == 0


def _hwm_kib(pid: int) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM:"))


# ---------------------------------------------------------------- D6


def test_head_is_answered_without_a_body(node):
    with _connect(node) as s:
        s.sendall(b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\nHEAD /v2/models/cis/infer HTTP/1.1\r\n"
                  b"Host: x\r\nConnection: close\r\n\r\n")  # fmt: skip
        answer = _answers(s)
    assert _statuses(answer) == [200, 405]
    first, second = answer.split(b"HTTP/1.1 405", 1)
    assert first.endswith(b"\r\n\r\n") and second.endswith(b"\r\n\r\n")  # heads only
    assert b"content-length: 14" in first  # what GET would send


def test_the_pipeline_overflow_answer_says_it_closes(node):
    live = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(node) as s:
        s.sendall(live * 40)
        answer = _answers(s)
    heads = answer.split(b"HTTP/1.1 ")
    refusal = next(h for h in heads if h.startswith(b"503"))
    assert b"connection: close" in refusal


def test_a_json_body_over_its_limit_is_413_and_binary_is_not(bundle_dir, digits):
    served = _serve(bundle_dir, "--http-max-json-bytes", "100000")
    try:
        x = np.zeros((400, 1, 8, 8), np.float32)  # 100 KiB as binary, far more as JSON
        body = _infer_body(x)
        with _connect(served) as s:
            s.sendall(INFER + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            answer = _answers(s)
        assert _statuses(answer) == [413] and b"binary" in answer
        head = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                       "parameters": {"binary_data_size": x.nbytes}}]}).encode()  # fmt: skip
        with _connect(served) as s:
            s.sendall(INFER + b"Connection: close\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                      % (len(head), len(head) + x.nbytes) + head + x.tobytes())  # fmt: skip
            assert _statuses(_answers(s)) == [200]
    finally:
        assert stop(served.proc) == 0


def test_a_version_01_traceparent_with_more_fields_is_joined(bundle_dir, tmp_path, digits):
    from cis.runtime.spans import read_spans

    spans = tmp_path / "spans.jsonl"
    served = _serve(bundle_dir, "--spans-file", spans)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        body = _infer_body(digits[:1])
        with _connect(served) as s:
            s.sendall(INFER + b"Connection: close\r\ntraceparent: 01-%s-00f067aa0ba902b7-01-what-comes-later\r\n"
                      b"tracestate: vendor=abc\r\nContent-Length: %d\r\n\r\n%s"
                      % (trace.encode(), len(body), body))  # fmt: skip
            assert _statuses(_answers(s)) == [200]
        end = time.monotonic() + 10
        found = []
        while not found and time.monotonic() < end:
            time.sleep(0.2)
            found = [r for r in read_spans(spans) if r.kind == "request"] if spans.exists() else []
        assert found and found[0].trace_id == trace and found[0].parent_id == "00f067aa0ba902b7"
    finally:
        assert stop(served.proc) == 0


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)} (\S+)$", text, re.M))


def _scrape(served: Served) -> str:
    import urllib.request

    return urllib.request.urlopen(served.metrics, timeout=10).read().decode()


def test_the_limits_table_names_each_limits_flag_and_metric():
    """Documented limits: the 'Limits of the front door' table names each one's flag and metric."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    section = text[text.index("### Limits of the front door") :]
    for flag in ("--http-timeout", "--http-head-timeout", "--http-max-connections", "--door-max-request-bytes",
                 "--door-max-buffered-bytes", "--http-max-json-bytes"):  # fmt: skip
        assert flag in section
    assert "cis_door_refused_total" in section and "cis_door_buffered_bytes" in section
