"""Tracing in-process (docs/runtime.md, *Tracing*; docs/protocol.md, *Trace context*): real nodes on loopback
sockets with tiny numpy stages, their spans files and a real OTLP/HTTP receiver.

- a batch of traced requests forwarded as one message stays one trace per request on every node it visits
  (``trace_parts``), with each request's share of the samples;
- a node that does not trace answers the same and passes the context on;
- a malformed ``traceparent`` or ``trace_parts`` is ``bad_message`` and the node keeps serving;
- the ``OTEL_EXPORTER_OTLP_ENDPOINT`` variable exports the same spans over OTLP.

The three-tier test with a real bundle and real processes is in tests/test_serve_tiers.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

import msgpack
import numpy as np
import pytest
import zmq
from cli_process import cis_argv
from test_runtime_node import FakeStage, Running, T

from cis.core.errors import CisError
from cis.runtime import protocol as P
from cis.runtime import tracing
from cis.runtime.client import Client
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig
from cis.runtime.spans import read_spans

FAST = dict(heartbeat=0.05, heartbeat_timeout=0.5, forward_timeout=2.0)
SLACK = 0.005  # seconds: a node stamps a message's arrival when it last found its socket empty


def _tp(trace: int, span: int, flags: str = "01") -> str:
    return f"00-{trace:032x}-{span:016x}-{flags}"


def _stage(k: int) -> FakeStage:
    """Stage k: logits from the first three values (a large first value is confident), the input carried on."""
    name = "input" if k == 1 else "features"
    return FakeStage(
        (T(name, (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32")),
        lambda f: {"logits": f[name][:, :3] * 10, "features": f[name]},
    )


@pytest.fixture
def chain(tmp_path):
    """dev (exit 1) -> edge (exit 2) -> cloud (exit 3), thresholds 0.9, a spans file each unless told."""
    running = []

    def make(traced=("dev", "edge", "cloud"), max_wait=0.2):
        addr = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("dev", "edge", "cloud")}
        parent = {"dev": "edge", "edge": "cloud", "cloud": None}
        for nid, exit in (("cloud", 3), ("edge", 2), ("dev", 1)):
            spans = str(tmp_path / "{node}.jsonl") if nid in traced else None
            up = parent[nid]
            cfg = NodeConfig(
                nid, exit, bind=addr[nid], parent=addr[up] if up else None, threshold=0.9 if up else -np.inf,
                max_wait=max_wait, spans_file=spans, **FAST,
            )  # fmt: skip
            node = Node(cfg, {k: _stage(k) for k in range(1, exit + 1)})
            running.append(Running(node))
            end = time.monotonic() + 5
            while up and not node.parent_up and time.monotonic() < end:
                time.sleep(0.02)
        return addr

    def spans() -> dict[str, list]:
        for r in reversed(running):  # stopped: every span is in its file
            r.close()
        running.clear()
        files = {n: tmp_path / f"{n}.jsonl" for n in ("dev", "edge", "cloud")}
        return {n: read_spans(f) for n, f in files.items() if f.exists()}

    yield make, spans
    for r in reversed(running):
        r.close()


CONFIDENT, UNSURE = [5, 0, 0, 0], [0.1, 0, 0, 0]


def _by_trace(spans: dict[str, list]) -> dict[str, list]:
    out = defaultdict(list)
    for records in spans.values():
        for s in records:
            out[s.trace_id].append(s)
    return out


def _check_tree(records: list, client_span: str | None) -> list[str]:
    """One trace's spans are a tree: per node a request span (parent: the asker's span) with its queue, compute
    and forward spans; the next node's request span is the child of this node's forward span, inside it in
    time. Returns the nodes in the order the request visited them."""
    by_node = defaultdict(dict)
    for s in records:
        assert s.kind not in by_node[s.node], (s.node, s.kind)  # one span of each kind per node
        by_node[s.node][s.kind] = s
    order, parent = [], client_span
    for nid in ("dev", "edge", "cloud"):
        if nid not in by_node:
            break
        kinds = by_node[nid]
        req = kinds["request"]
        assert req.parent_id == parent, (nid, req.parent_id, parent)
        for kind in ("queue", "compute", "forward"):
            if kind in kinds:
                s = kinds[kind]
                assert s.parent_id == req.span_id and req.start - SLACK <= s.start <= s.end <= req.end + SLACK
        assert kinds["queue"].end <= kinds["compute"].start + SLACK
        order.append(nid)
        if "forward" in kinds:
            fwd = kinds["forward"]
            up = by_node.get({"dev": "edge", "edge": "cloud"}[nid])
            assert up, f"{nid} forwarded but the next node has no span of this trace"
            assert fwd.start - SLACK <= up["request"].start and up["request"].end <= fwd.end + SLACK
            parent = fwd.span_id
        else:
            parent = None
    assert sum(len(k) for k in by_node.values()) == len(records) and len(order) == len(by_node)
    return order


def test_a_batch_forwarded_as_one_message_stays_one_trace_per_request(chain):
    make, spans = chain
    addr = make()
    requests = {  # traceparent -> samples
        _tp(1, 11): [UNSURE],
        _tp(2, 12): [CONFIDENT],
        _tp(3, 13): [UNSURE, CONFIDENT, UNSURE],  # two of its three samples go up
        _tp(4, 14, "00"): [UNSURE],  # not sampled upstream: a spans file records it all the same
        None: [UNSURE, UNSURE],  # no context: the dev starts a trace of its own
    }
    with Client(addr["dev"], timeout=10) as c:
        ids = {c.submit(np.array(x, np.float32), traceparent=tp): tp for tp, x in requests.items()}
        got = {}
        while len(got) < len(ids):
            got.update(c.poll(5))
    for rid, tp in ids.items():
        assert got[rid].error is None
        assert got[rid].exit.tolist() == [1 if x == CONFIDENT else 3 for x in requests[tp]]
    traces = _by_trace(spans())
    assert len(traces) == len(requests)
    for tp, x in requests.items():
        if tp is None:
            [trace] = [t for t in traces if int(t, 16) > 4]
            client_span = None
        else:
            _, trace, client_span, flags = tp.split("-")
        records = traces[trace]
        up = sum(1 for row in x if row == UNSURE)
        assert _check_tree(records, client_span) == (["dev", "edge", "cloud"] if up else ["dev"])
        for s in records:
            assert s.samples == (len(x) if s.node == "dev" and s.kind != "forward" else up), s
            assert (s.stage_from, s.stage_to) == {"dev": (1, 1), "edge": (2, 2), "cloud": (3, 3)}[s.node]
            assert s.kind == "request" or s.batch >= 1
        dev = next(s for s in records if s.node == "dev" and s.kind == "request")
        assert dev.req_id in ids and ids[dev.req_id] == tp and dev.batch >= len(x)
    # the dev ran them as one batch and forwarded the undecided samples of four requests as one message
    edge = [s for s in sum(traces.values(), []) if s.node == "edge" and s.kind == "request"]
    assert len({s.req_id for s in edge}) == 1 and len(edge) == 4 and {s.batch for s in edge} == {6}


def test_a_node_that_does_not_trace_answers_the_same_and_passes_the_context_on(chain):
    make, spans = chain
    addr = make(traced=("dev", "cloud"))
    x = np.array([UNSURE, CONFIDENT], np.float32)
    with Client(addr["dev"], timeout=10) as c:
        plain = c.infer(x)
        traced = c.infer(x, traceparent=_tp(7, 70))
        ids = [c.submit(x[:1], traceparent=_tp(8 + i, 80 + i)) for i in range(2)]  # one batch, one forward
        got = {}
        while len(got) < 2:
            got.update(c.poll(5))
    for a in ("cls", "confidence", "exit", "flags", "served_by"):
        assert np.array_equal(getattr(plain, a), getattr(traced, a)), a
    assert traced.served_by == ["cloud", "dev"] and all(got[i].served_by == ["cloud"] for i in ids)
    traces = _by_trace(spans())
    assert "edge" not in {s.node for t in traces.values() for s in t}
    for trace in (7, 8, 9):
        records = traces[f"{trace:032x}"]
        fwd = next(s for s in records if s.node == "dev" and s.kind == "forward")
        req = next(s for s in records if s.node == "cloud" and s.kind == "request")
        assert req.parent_id == fwd.span_id and req.samples == 1  # through the edge, unchanged


def _raw(sock: zmq.Socket, rid: int, **fields) -> dict:
    header = {"v": 1, "kind": "infer", "id": rid, "names": ["input"], "dtypes": ["float32"], "shapes": [[2, 4]],
              **fields}  # fmt: skip
    sock.send_multipart([msgpack.packb(header), np.zeros((2, 4), np.float32).tobytes()])
    assert sock.poll(5000)
    return msgpack.unpackb(sock.recv_multipart()[0])


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"traceparent": "00-abc"}, "traceparent"),
        ({"traceparent": _tp(0xAB, 0xCD).upper()}, "traceparent"),  # W3C: lowercase hex
        ({"traceparent": _tp(0, 2)}, "traceparent"),  # an all-zero trace id is invalid (W3C)
        ({"traceparent": _tp(1, 2) + "\n"}, "traceparent"),
        ({"traceparent": "01" + _tp(1, 2)[2:]}, "traceparent"),  # only version 00
        ({"traceparent": None}, "traceparent"),
        ({"traceparent": ""}, "traceparent"),
        ({"trace_parts": [[2, "x"]]}, "trace_parts"),
        ({"trace_parts": [[0, ""], [2, ""]]}, "trace_parts"),
        ({"trace_parts": []}, "trace_parts"),
        ({"trace_parts": [[1, _tp(1, 2)]]}, "has 2"),  # counts that do not add up to the request's samples
        ({"trace_parts": [[2, _tp(1, 2)]], "traceparent": _tp(1, 2)}, "both"),
    ],
)
def test_a_malformed_trace_context_is_bad_message_and_the_node_keeps_serving(tmp_path, fields, says):
    spans = tmp_path / "root.jsonl"
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr, spans_file=str(spans)), {1: _stage(1)}))
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(addr)
    try:
        reply = _raw(sock, 5, **fields)
        assert (reply["kind"], reply["id"], reply["code"]) == ("error", 5, "bad_message") and says in reply["message"]
        assert _raw(sock, 6, traceparent=_tp(5, 6))["kind"] == "result"  # still serving
        assert _raw(sock, 7, trace_parts=[[1, ""], [1, _tp(6, 7)]])["kind"] == "result"
    finally:
        sock.close()
        node.close()
    records = read_spans(spans)
    assert {s.req_id for s in records} == {6, 7}  # a refused message never became a request: no span
    assert {s.trace_id for s in records if s.req_id == 6} == {f"{5:032x}"}
    assert len({s.trace_id for s in records if s.req_id == 7 and s.kind == "request"}) == 2  # a new trace and 6's


def test_spans_go_over_otlp_when_the_standard_variable_names_a_collector(tmp_path, monkeypatch):
    pytest.importorskip("opentelemetry.sdk")
    from otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "digits")
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr, spans_file=str(tmp_path / "s.jsonl")), {1: _stage(1)}))
    try:
        with Client(addr, timeout=5) as c:
            c.infer(np.array([CONFIDENT], np.float32), traceparent=_tp(3, 4))
            c.infer(np.array([CONFIDENT], np.float32), traceparent=_tp(5, 6, "00"))  # not sampled: not exported
        receiver.wait(lambda s: len(s) >= 3)
    finally:
        node.close()  # exports what it still holds
        receiver.close()
    got = receiver.spans
    on_file = {(s.trace_id, s.span_id, s.parent_id, s.kind) for s in read_spans(tmp_path / "s.jsonl")}
    assert {t for t, *_ in on_file} == {f"{3:032x}", f"{5:032x}"}  # the file records every request
    on_file = {s for s in on_file if s[0] == f"{3:032x}"}
    assert {(s["trace_id"], s["span_id"], s["parent_id"], s["name"]) for s in got} == on_file
    request = next(s for s in got if s["name"] == "request")
    assert request["service"] == "digits" and request["parent_id"] == f"{4:016x}"
    assert request["attributes"]["cis.node"] == "root" and request["attributes"]["cis.exit"] == 1


def test_no_tracer_without_a_spans_file_or_a_collector(monkeypatch):
    for key in tracing.ENV_ENDPOINTS:
        monkeypatch.delenv(key, raising=False)
    assert tracing.open_tracer("n", 1, None, None) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert tracing.otlp_endpoint(None, env) == ""  # the exporter reads the variable itself
    assert tracing.otlp_endpoint(None, {**env, "OTEL_SDK_DISABLED": "true"}) is None
    traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}
    assert tracing.otlp_endpoint(None, traces) == ""
    assert tracing.otlp_endpoint(None, {**traces, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.otlp_endpoint("http://c:4318/", {}) == "http://c:4318/v1/traces"
    assert tracing.otlp_endpoint("http://c:4318", {"OTEL_TRACES_EXPORTER": "none"}) == "http://c:4318/v1/traces"
    assert tracing.otlp_endpoint("http://c:4318", {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.otlp_endpoint("https://c/otlp/v1/traces", {}) == "https://c/otlp/v1/traces"
    with pytest.raises(CisError, match="--otlp-endpoint"):
        tracing.otlp_endpoint("c:4318")


def test_a_spans_file_gets_its_folder_or_one_line(tmp_path):
    tracer = tracing.open_tracer("edge0", 2, str(tmp_path / "logs" / "{node}" / "spans.jsonl"), None)
    assert tracer is not None and (tmp_path / "logs" / "edge0" / "spans.jsonl").is_file()
    tracer.close()
    (tmp_path / "plain").write_text("")
    with pytest.raises(CisError, match="--spans-file .*plain/x.jsonl: cannot open it"):
        tracing.open_tracer("edge0", 2, str(tmp_path / "plain" / "x.jsonl"), None)


def test_a_client_refuses_a_malformed_traceparent_before_sending():
    with Client(f"tcp://127.0.0.1:{free_port()}") as c, pytest.raises(CisError, match="W3C traceparent"):
        c.submit(np.zeros((1, 4), np.float32), traceparent="not-a-traceparent")
    assert P.decode(P.encode(P.INFER, 1, traceparent=_tp(1, 1))).head.traceparent == _tp(1, 1)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "none.npz", "--traceparent", "00-1-2-01"],
         "--traceparent is '00-1-2-01'; expected a W3C traceparent"),
        (["TRACEPARENT=00-1-2-01", "infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "none.npz"],
         "the TRACEPARENT variable is '00-1-2-01'; expected a W3C traceparent"),
        (["serve", "nowhere", "--all", "--spans-file", "spans.jsonl"], "put {node} in the path"),
        (["serve", "nowhere", "--node", "a", "--otlp-endpoint", "localhost:4318"], "expected an http:// or https://"),
    ],
)  # fmt: skip
def test_commands_say_what_is_wrong_with_a_tracing_flag_in_one_line(argv, says):
    env, argv = {k: v for k, v in os.environ.items() if k != "TRACEPARENT"}, list(argv)
    while "=" in argv[0]:  # a variable for the command
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    res = subprocess.run(cis_argv(*argv), capture_output=True, text=True, timeout=60, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and says in lines[0], res.stderr


def test_otlp_endpoint_without_the_otel_extra_is_one_line():
    """As on an install without 'cis-inference[otel]': the SDK cannot be imported."""
    code = "import sys; sys.modules['opentelemetry.sdk'] = None; from cis.cli.main import main; sys.exit(main())"
    argv = ["serve", "nowhere", "--node", "a", "--otlp-endpoint", "http://127.0.0.1:4318"]
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "cis serve: --otlp-endpoint needs the 'otel' extra: pip install 'cis-inference[otel]' "
        "(not installed: opentelemetry.sdk)"
    ]
