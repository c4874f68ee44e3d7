"""The front doors on a real node process (``cis serve --http-port 0 --grpc-port 0``), with a digits bundle:

- every bad input of issue 33 gets the protocol's error (or its connection dropped) while the node keeps
  serving other clients: malformed JSON, wrong datatype or shape, ``data`` disagreeing with the shape, a binary
  header length past the body, a body over the size limit, a slow or half-sent body (408 after --http-timeout,
  while others are served), an unknown model or version, hundreds of idle connections (dropped after the
  timeout; open files and RSS back where they were);
- a door request is counted by the node as any ZeroMQ INFER (its status counters and error codes);
- deadlines (504), overload (503), TLS and the bearer token on both doors; the default loopback bind is said;
- the curl examples of docs/runtime.md run as written (with this node's port).

tritonclient against a whole tree: tests/test_front_door_triton.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("httptools")
grpc = pytest.importorskip("grpc")

from cli_process import read_until, start, stop  # noqa: E402

from cis.runtime.client import Client  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402
from cis.runtime.oip import grpc_messages as pb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 200_000  # the node's --max-message-bytes: also the largest body the doors take


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("door"), steps=150)


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test.x[:8].astype(np.float32)


class Served:
    """A node process and where its doors are."""

    def __init__(self, proc, zmq: str, http: str, grpc_target: str, lines: list[str]):
        self.proc, self.zmq, self.grpc, self.lines = proc, zmq, grpc_target, lines
        self.http = http
        self.spans: Path | None = None
        self.host, port = http.split("://")[1].rsplit(":", 1)
        self.port = int(port)


def _serve(bundle_dir, *extra) -> Served:
    zmq = f"tcp://127.0.0.1:{free_port()}"
    proc = start(
        "serve", bundle_dir, "--node", "cloud", "--bind", zmq, "--provider", "cpu", "--http-port", 0,
        "--grpc-port", 0, "--max-message-bytes", MAX_BYTES, *extra,
    )  # fmt: skip
    lines = read_until(proc.stderr, proc, "node_start")
    text = "".join(lines)
    http = re.search(r"http front door at (\S+)", text).group(1)
    target = re.search(r"grpc front door at (\S+)", text).group(1)
    return Served(proc, zmq, http, target, lines)


@pytest.fixture(scope="module")
def node(bundle_dir, tmp_path_factory):
    spans = tmp_path_factory.mktemp("spans") / "{node}.spans.jsonl"
    served = _serve(bundle_dir, "--http-timeout", "1", "--spans-file", spans)
    served.spans = Path(str(spans).replace("{node}", "cloud"))
    yield served
    assert stop(served.proc) == 0


def _request(node: Served, method: str, path: str, body=None, headers=None, context=None):
    if context is not None:
        conn = http.client.HTTPSConnection(node.host, node.port, timeout=10, context=context)
    else:
        conn = http.client.HTTPConnection(node.host, node.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        res = conn.getresponse()
        return res.status, res.read(), res
    finally:
        conn.close()


def _infer_body(x: np.ndarray, **extra) -> bytes:
    inp = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return json.dumps({"inputs": [inp], **extra}).encode()


def _serving(node: Served, x: np.ndarray) -> None:
    """The node still answers a good request, over HTTP and over ZeroMQ."""
    status, body, _ = _request(node, "POST", "/v2/models/cis/infer", _infer_body(x[:2]))
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["shape"] == [2]
    with Client(node.zmq, timeout=10) as c:
        assert len(c.infer(x[:2]).cls) == 2
    assert node.proc.poll() is None


def _raw(node: Served, data: bytes, timeout: float = 10) -> bytes:
    """Send bytes on a fresh connection; what comes back until the server closes it."""
    with socket.create_connection((node.host, node.port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk


def _status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _proc_usage(pid: int) -> tuple[int, int]:
    """(open descriptors, resident KiB) of a process."""
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
    return len(os.listdir(f"/proc/{pid}/fd")), rss


# ---------------------------------------------------------------- the endpoints and the normal path


def test_health_metadata_and_an_inference_enter_the_nodes_normal_path(node, digits):
    assert "binds 127.0.0.1 only" in "".join(node.lines)  # said at start: no TLS, no token, no --http-host
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/cis/ready", "/v2/models/cis/versions/1/ready"):
        status, body, _ = _request(node, "GET", path)
        assert status == 200, (path, body)
    status, body, _ = _request(node, "GET", "/v2")
    assert status == 200 and json.loads(body)["extensions"] == ["binary_tensor_data"]
    status, body, _ = _request(node, "GET", "/v2/models/cis")
    assert json.loads(body)["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    with Client(node.zmq) as c:
        before = c.status()
        want = c.infer(digits)
    status, body, _ = _request(node, "POST", "/v2/models/cis/infer", _infer_body(digits, id="abc"))
    answer = json.loads(body)
    assert status == 200 and answer["id"] == "abc"
    got = {o["name"]: o["data"] for o in answer["outputs"]}
    assert got["class"] == want.cls.tolist() and got["node"] == ["cloud"] * len(digits)
    np.testing.assert_allclose(got["confidence"], want.confidence, rtol=1e-6)
    assert answer["parameters"] == {"node": "cloud", "degraded": 0, "capped": 0}
    with Client(node.zmq) as c:
        after = c.status()
    assert after["requests"] - before["requests"] == 2  # the ZeroMQ one and the door's: counted alike
    assert after["samples"] - before["samples"] == 2 * len(digits)


def test_a_traceparent_joins_the_callers_trace_on_both_doors(node, digits):
    from cis.runtime.spans import read_spans

    parent = "00f067aa0ba902b7"
    traces = {"http": "4bf92f3577b34da6a3ce929d0e0e4736", "grpc": "5cf92f3577b34da6a3ce929d0e0e4737"}
    header = {"traceparent": f"00-{traces['http']}-{parent}-01"}
    assert _request(node, "POST", "/v2/models/cis/infer", _infer_body(digits[:2]), header)[0] == 200
    metadata = [("traceparent", f"00-{traces['grpc']}-{parent}-01")]
    _grpc_call(node, "ModelInfer", _grpc_infer(digits[:1]), metadata)
    end = time.monotonic() + 10
    while time.monotonic() < end:  # the node flushes its spans file at least every 0.5 s
        spans = read_spans(node.spans) if node.spans.exists() else []
        requests = {s.trace_id: s for s in spans if s.kind == "request" and s.trace_id in traces.values()}
        if len(requests) == 2:
            break
        time.sleep(0.2)
    assert set(requests) == set(traces.values())
    assert {s.parent_id for s in requests.values()} == {parent}  # under the caller's span
    kinds = {(s.trace_id, s.kind) for s in spans}
    assert {(t, k) for t in traces.values() for k in ("queue", "compute")} <= kinds


# ---------------------------------------------------------------- bad input: HTTP


@pytest.mark.parametrize(
    "body, headers, status, words",
    [
        (b'{"inputs": [', {}, 400, "not valid JSON"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "INT32", "data": [0] * 64}]}),
         {}, 400, "datatype 'INT32'; expected FP32"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]}),
         {}, 400, "shape [1, 64]"),
        (json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]}),
         {}, 400, "64 values in data; shape [2, 1, 8, 8] holds 128"),
        (b"{}", {"Inference-Header-Content-Length": "999"}, 400, "Inference-Header-Content-Length is 999"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [1e39] * 64}]}),
         {}, 400, "NaN or infinity"),
    ],
)  # fmt: skip
def test_bad_bodies_get_400_and_the_node_keeps_serving(node, digits, body, headers, status, words):
    with Client(node.zmq) as c:
        before = c.status()["errors_by_code"]
    got, answer, _ = _request(node, "POST", "/v2/models/cis/infer", body, headers)
    assert got == status, answer
    assert words in json.loads(answer)["error"]
    with Client(node.zmq) as c:
        after = c.status()["errors_by_code"]
    assert sum(after.values()) == sum(before.values()) + 1  # counted by the node, as a ZeroMQ refusal is
    _serving(node, digits)


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("POST", "/v2/models/other/infer", 404),
        ("POST", "/v2/models/cis/versions/2/infer", 404),
        ("GET", "/v2/models/other", 404),
        ("GET", "/v2/models/cis/versions/9/ready", 404),
        ("GET", "/v2/nothing", 404),
        ("GET", "/v2/models/cis/infer", 405),
        ("POST", "/v2/health/live", 405),
    ],
)
def test_unknown_models_versions_paths_and_methods(node, digits, method, path, status):
    got, body, _ = _request(node, method, path, b"{}" if method == "POST" else None)
    assert got == status and "error" in json.loads(body)
    _serving(node, digits)


def test_a_body_over_the_limit_gets_413_and_is_not_read(node, digits):
    head = b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BYTES + 1)
    answer = _raw(node, head + b"{")  # the body never comes: the size alone refuses it, and the door closes
    assert _status_of(answer) == 413 and b"connection: close" in answer
    chunked = b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    big = b"%x\r\n" % (MAX_BYTES + 10) + bytes(MAX_BYTES + 10) + b"\r\n0\r\n\r\n"
    assert _status_of(_raw(node, chunked + big)) == 413  # no Content-Length: its running size refuses it
    _serving(node, digits)


def test_malformed_http_is_400_and_closed(node, digits):
    answer = _raw(node, b"GARBAGE / HTTP/9.9\r\n\r\n")
    assert _status_of(answer) == 400
    _serving(node, digits)


def test_a_slow_body_times_out_with_408_while_others_are_served(node, digits):
    with socket.create_connection((node.host, node.port), timeout=10) as slow:
        slow.sendall(b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"inp")
        _serving(node, digits)  # the half-sent body holds no worker
        answer = slow.recv(65536)
        assert _status_of(answer) == 408, answer
        assert slow.recv(65536) == b""  # closed after it
    _serving(node, digits)


def test_many_idle_connections_are_dropped_and_nothing_leaks(node, digits):
    pid = node.proc.pid
    _serving(node, digits)
    fds0, rss0 = _proc_usage(pid)
    socks = [socket.create_connection((node.host, node.port), timeout=10) for _ in range(500)]
    try:
        _serving(node, digits)  # beside 500 idle connections
        for s in socks[:5]:
            assert s.recv(1) == b""  # idle past --http-timeout (1 s): dropped by the node
    finally:
        for s in socks:
            s.close()
    end = time.monotonic() + 10
    while _proc_usage(pid)[0] > fds0 and time.monotonic() < end:
        time.sleep(0.1)
    fds1, rss1 = _proc_usage(pid)
    assert fds1 <= fds0, (fds0, fds1)
    assert rss1 - rss0 < 30_000, (rss0, rss1)  # KiB: buffers of 500 connections are gone
    _serving(node, digits)


def test_a_request_timeout_that_passes_is_504(node, digits):
    body = _infer_body(digits[:1], parameters={"timeout": 1})  # one microsecond
    status, answer, _ = _request(node, "POST", "/v2/models/cis/infer", body)
    assert status == 504 and json.loads(answer)["code"] == "deadline_exceeded"


def test_pipelined_requests_are_answered_in_order(node, digits):
    one = _infer_body(digits[:1], id="first")
    two = _infer_body(digits[:3], id="second")
    req = b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    last = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = _raw(node, req % len(one) + one + req % len(two) + two + last)
    assert answer.index(b'"first"') < answer.index(b'"second"') < answer.index(b'{"live":true}')


# ---------------------------------------------------------------- bad input: gRPC


def _grpc_call(node: Served, method: str, request, metadata=None, credentials=None):
    channel = (
        grpc.secure_channel(node.grpc, credentials, options=[("grpc.ssl_target_name_override", "localhost")])
        if credentials is not None
        else grpc.insecure_channel(node.grpc)
    )
    with channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=getattr(pb, method + "Response").FromString,
        )
        return call(request, timeout=10, metadata=metadata)


def _grpc_infer(x: np.ndarray, datatype: str = "FP32", raw: bytes | None = None, **fields):
    req = pb.ModelInferRequest(model_name="cis", **fields)
    req.inputs.add(name="input", datatype=datatype, shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes() if raw is None else raw)
    return req


def test_grpc_infer_and_its_bad_inputs(node, digits):
    answer = _grpc_call(node, "ModelInfer", _grpc_infer(digits, id="g1"))
    assert answer.id == "g1" and [o.name for o in answer.outputs] == ["class", "confidence", "exit", "flags", "node"]
    with Client(node.zmq) as c:
        want = c.infer(digits).cls
    np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<i8"), want)
    bad = [
        (_grpc_infer(digits, "FP64"), grpc.StatusCode.INVALID_ARGUMENT),
        (_grpc_infer(digits, raw=b"\0" * 10), grpc.StatusCode.INVALID_ARGUMENT),
        (_grpc_infer(digits, model_version="3"), grpc.StatusCode.NOT_FOUND),
        (pb.ModelInferRequest(model_name="other"), grpc.StatusCode.NOT_FOUND),
        (pb.ModelInferRequest(model_name="cis"), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for request, code in bad:
        with pytest.raises(grpc.RpcError) as err:
            _grpc_call(node, "ModelInfer", request)
        assert err.value.code() == code, err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        _grpc_call(node, "ModelInfer", _grpc_infer(digits[:1], raw=np.full((1, 1, 8, 8), np.inf, np.float32).tobytes()))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bad_input" in err.value.details()
    assert _grpc_call(node, "ServerLive", pb.ServerLiveRequest()).live
    _serving(node, digits)


# ---------------------------------------------------------------- TLS, token, overload


def _self_signed(folder: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


def test_tls_and_a_bearer_token_on_both_doors_and_overload_is_503(bundle_dir, digits, tmp_path):
    cert, key = _self_signed(tmp_path)
    (tmp_path / "token").write_text("s3cret-token\n")
    served = _serve(
        bundle_dir, "--http-tls-cert", cert, "--http-tls-key", key, "--grpc-tls-cert", cert, "--grpc-tls-key", key,
        "--auth-token-file", tmp_path / "token", "--http-host", "127.0.0.1", "--queue-limit", "2",
        "--max-batch", "64", "--max-wait", "0.5", "--http-max-connections", "3",
    )  # fmt: skip
    try:
        assert served.http.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        token = {"Authorization": "Bearer s3cret-token"}
        assert _request(served, "GET", "/v2/health/ready", context=context)[0] == 200  # no token needed
        status, body, res = _request(served, "GET", "/v2/models/cis", context=context)
        assert status == 401 and res.getheader("www-authenticate") == "Bearer"
        wrong = {"Authorization": "Bearer wrong"}
        assert _request(served, "GET", "/v2/models/cis", headers=wrong, context=context)[0] == 401
        assert _request(served, "GET", "/v2/models/cis", headers=token, context=context)[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            _request(served, "GET", "/v2/health/live")  # plain HTTP on a TLS door
        # overload: two samples wait up to 0.5 s for company; a third sample does not fit the queue of 2
        with socket.create_connection((served.host, served.port)) as raw:
            tls = context.wrap_socket(raw)
            body = _infer_body(digits[:2])
            tls.sendall(b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            with Client(served.zmq, timeout=10) as watcher:  # until the two wait in the queue (not a fixed sleep)
                end = time.monotonic() + 10
                while watcher.status()["queue_depth"] < 2 and time.monotonic() < end:
                    pass
            one = _infer_body(digits[:1])
            status, answer, _ = _request(served, "POST", "/v2/models/cis/infer", one, token, context)
            assert status == 503 and json.loads(answer)["code"] == "overloaded"
            assert b" 200 OK" in tls.recv(65536)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with pytest.raises(grpc.RpcError) as err:
            _grpc_call(served, "ModelInfer", _grpc_infer(digits), credentials=credentials)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metadata = [("authorization", "Bearer s3cret-token")]
        answer = _grpc_call(served, "ModelInfer", _grpc_infer(digits[:2]), metadata, credentials)
        assert answer.outputs[0].shape == [2]
        assert _grpc_call(served, "ServerReady", pb.ServerReadyRequest(), credentials=credentials).ready
        held = [socket.create_connection((served.host, served.port), timeout=10) for _ in range(3)]
        try:  # --http-max-connections 3: a fourth makes room; the longest idle of the three (no handshake) is closed
            time.sleep(0.2)
            with context.wrap_socket(socket.create_connection((served.host, served.port), timeout=10)) as extra:
                assert held[0].recv(1) == b""
                extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert b" 200 OK" in extra.recv(65536)
        finally:
            for s in held:
                s.close()
        end = time.monotonic() + 10
        while time.monotonic() < end:  # the node sees the three go, and has room again
            try:
                if _request(served, "GET", "/v2/health/live", context=context)[0] == 200:
                    break
            except (ConnectionError, ssl.SSLError, OSError):
                time.sleep(0.1)
        assert _request(served, "GET", "/v2/health/live", context=context)[0] == 200
    finally:
        assert stop(served.proc) == 0


def test_mismatched_tls_flags_and_a_missing_token_file_are_one_line(bundle_dir, tmp_path):
    from cli_process import cis_argv

    for extra, words in (
        (["--http-tls-cert", tmp_path / "c.pem"], "--http-tls-cert and --http-tls-key go together"),
        (["--auth-token-file", tmp_path / "none"], "--auth-token-file"),
        (["--http-tls-cert", tmp_path / "c.pem", "--http-tls-key", tmp_path / "k.pem"], "no such file"),
    ):
        argv = cis_argv("serve", bundle_dir, "--node", "cloud", "--http-port", "0", *extra)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], res.stderr


# ---------------------------------------------------------------- the docs' curl examples


def _curl_examples() -> list[str]:
    text = (ROOT / "docs" / "runtime.md").read_text()
    section = text[text.index("## Open Inference Protocol (HTTP and gRPC)") :]
    section = section[: section.index("\n## ", 5)]
    return [b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "curl " in b]


def test_the_curl_examples_of_the_docs_run_as_written(node, tmp_path):
    examples = _curl_examples()
    assert len(examples) >= 5
    for example in examples:
        script = example.replace("127.0.0.1:8000", f"{node.host}:{node.port}")
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True,
                             timeout=60)  # fmt: skip
        assert res.returncode == 0, (example, res.stderr)
        assert res.stdout and b'"error"' not in res.stdout, (example, res.stdout)
