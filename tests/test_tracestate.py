"""The W3C ``tracestate`` goes with its ``traceparent`` (docs/protocol.md, *Trace context*; docs/runtime.md,
*Tracing*): real nodes on loopback sockets with tiny numpy stages (tests/test_tracing.py's), their front doors,
their spans files, ``cis infer`` as a process and a real OTLP/HTTP receiver.

- the schema and the documented checks accept and refuse the same ``tracestate`` and ``trace_states``;
- a tracestate sent to the HTTP door (two header lines) or the gRPC door (metadata) is on every span of every
  node the request visits; one the door cannot carry is dropped and the request is answered all the same;
- a batch forwarded as one message keeps each request's tracestate (``trace_states``), through a node that
  does not trace;
- a tracestate without its traceparent, or ``trace_states`` that do not fit ``trace_parts``, is
  ``bad_message`` at any node, and the node keeps serving;
- the OTLP export sets each span's trace state; old spans files are read as before;
- the client and ``cis infer`` (``--tracestate``, ``TRACESTATE``) check it in one line.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from collections import defaultdict

import msgpack
import msgspec
import numpy as np
import pytest
import zmq
from cli_process import cis_argv
from test_runtime_node import Running
from test_tracing import CONFIDENT, FAST, UNSURE, _stage, _tp

from cis.core.errors import CisError
from cis.runtime import protocol as P
from cis.runtime.client import Client
from cis.runtime.launcher import free_port
from cis.runtime.node import Node, NodeConfig
from cis.runtime.oip import door
from cis.runtime.spans import LINE_ENCODER, SpanRecord, read_spans
from cis.runtime.wire import MAX_TRACESTATE, is_tracestate

STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"  # W3C's example
LONGEST = ",".join(f"k{i:02d}=" + "v" * 11 for i in range(32))  # 32 members, 511 characters
MANY = [f"k{i:02d}=1" for i in range(33)]
VALID = ["a=1", " a=1 , ,b=2 ", "a=1,", ",", "a@b=1", "1a@b=x", "a=1 2", "k=" + "v" * 256, LONGEST,
         ",".join(MANY[:32]), "a=" + "1" * 255 + "," + "b=" + "2" * 252]  # fmt: skip
INVALID = ["", "A=1", "a", "a=", "a=b=c", "a=1\t", "1a=x", "é=1", "k=" + "v" * 257, ",".join(MANY),
           LONGEST + ",", "a=" + "1" * 255 + "," + "b=" + "2" * 253, "x" * 600]  # fmt: skip
# (W3C's grammar counts blank members too, so LONGEST + "," is 33 members; the last valid one is 512 long)


def _decoded_both_ways(frames: list) -> tuple[P.Header | None, P.Header | None]:
    """The header as the one-pass schema and as the documented checks read it (None: refused)."""
    try:
        fast = P._fast(P.decoder(P.KINDS).decode(frames[0]), frames[0], frames, 1 << 20, None, None)
    except msgspec.ValidationError:
        fast = None
    try:
        slow = P._checked(P._buffer(frames[0]), frames, 1 << 20, None, None, P.KINDS).head
    except P.ProtocolError as exc:
        assert exc.code == "bad_message" and "trace" in exc.message
        slow = None
    return (None if fast is None else fast.head), slow


def test_both_wire_paths_accept_and_refuse_the_same_tracestates():
    assert len(LONGEST) == 511 and len(VALID[-1]) == MAX_TRACESTATE
    x = {"x": np.zeros((2, 3), np.float32)}
    for value in VALID + INVALID:
        one = [bytes(P._buffer(f)) for f in P.encode(P.INFER, 1, x, traceparent=_tp(1, 2), tracestate=value)]
        parts = [[1, _tp(1, 2)], [1, _tp(3, 4)]]
        several = [bytes(P._buffer(f)) for f in P.encode(P.FORWARD, 2, x, trace_parts=parts, trace_states=[value, ""])]
        fast, slow = _decoded_both_ways(one)
        assert (fast is not None) == (slow is not None) == (value in VALID) == is_tracestate(value), value
        assert fast is None or fast.tracestate == slow.tracestate == value
        fast, slow = _decoded_both_ways(several)
        entry_ok = value in VALID or value == ""  # an entry of trace_states may be "" (no tracestate)
        assert (fast is not None) == (slow is not None) == entry_ok, value
        assert fast is None or fast.trace_states == slow.trace_states == (value, "")
    for states in ([], [""] * 4097, "a=1", [1]):
        frames = [bytes(P._buffer(f)) for f in P.encode(P.FORWARD, 3, x, trace_parts=[[2, _tp(1, 2)]],
                                                        trace_states=states)]  # fmt: skip
        assert _decoded_both_ways(frames) == (None, None), states


def test_the_door_keeps_a_valid_tracestate_beside_a_valid_traceparent_only():
    tp = _tp(1, 2)
    assert door.trace_state(tp, [b"congo=t61rcWkgMzE", b" rojo=00f067aa0ba902b7\t"]) == STATE  # lines joined
    assert door.trace_state(tp, [b"a=1 \t, ,\tb=x y "]) == "a=1,,b=x y"  # W3C's optional whitespace taken off
    assert door.trace_state(tp, ["congo=t61rcWkgMzE"]) == "congo=t61rcWkgMzE"  # gRPC metadata: strings
    later = door.trace_context("01" + tp[2:] + "-more")  # a later version's traceparent is taken as 00
    assert door.trace_state(later, [b"a=1"]) == "a=1"
    assert door.trace_state(None, [b"a=1"]) == "" and door.trace_state("00-abc", [b"a=1"]) == ""  # no valid parent
    assert door.trace_state(tp, []) == "" and door.trace_state(tp, [b""]) == ""
    for bad in (b"Bad=1", b"a=1\tb=2", b"x" * 600, (LONGEST + ",z=1").encode()):  # dropped, never refused
        assert door.trace_state(tp, [bad]) == ""
    assert door.trace_state(tp, [",".join(MANY[:17]), ",".join(MANY[17:32])]) == ",".join(MANY[:32])
    assert door.trace_state(tp, [",".join(MANY[:17]), ",".join(MANY[17:])]) == ""  # 33 members once joined


# ---------------------------------------------------------------- a chain of real nodes, a door on the device


@pytest.fixture
def chain(tmp_path):
    """dev (exit 1, an HTTP door, and a gRPC door when grpc is installed) -> edge (exit 2) -> cloud (exit 3),
    thresholds 0.9; ``traced`` nodes write tmp_path/{node}.jsonl. ``spans()`` stops them and reads the files."""
    from cis.runtime.oip import codec
    from cis.runtime.oip.door import DoorConfig
    from cis.runtime.oip.http_door import HttpDoor

    running = []

    def make(traced=("dev", "edge", "cloud")) -> dict[str, str]:
        addr = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("dev", "edge", "cloud")}
        parent = {"dev": "edge", "edge": "cloud", "cloud": None}
        urls = {}
        for nid, exit in (("cloud", 3), ("edge", 2), ("dev", 1)):
            up = parent[nid]
            cfg = NodeConfig(
                nid, exit, bind=addr[nid], parent=addr[up] if up else None, threshold=0.9 if up else -np.inf,
                max_wait=0.2, spans_file=str(tmp_path / "{node}.jsonl") if nid in traced else None, **FAST,
            )  # fmt: skip
            stages = {k: _stage(k) for k in range(1, exit + 1)}
            node = Node(cfg, stages)
            if nid == "dev":
                model = codec.Model.of_stage("cis", nid, stages[1].inputs, stages[1].outputs)
                node.doors.append(HttpDoor(model, DoorConfig(0)))
                if _grpc() is not None:
                    from cis.runtime.oip.grpc_door import GrpcDoor

                    node.doors.append(GrpcDoor(model, DoorConfig(0)))
            running.append(Running(node))
            end = time.monotonic() + 5
            while up and not node.parent_up and time.monotonic() < end:
                time.sleep(0.02)
            if nid == "dev":
                urls = {d.kind: d.url for d in node.doors}
        return {**addr, **urls}

    def spans() -> dict[str, list[SpanRecord]]:
        """Each trace's spans (every node's), once the nodes stopped (every span is in its file)."""
        for r in reversed(running):
            r.close()
        running.clear()
        out = defaultdict(list)
        for nid in ("dev", "edge", "cloud"):
            path = tmp_path / f"{nid}.jsonl"
            for s in read_spans(path) if path.exists() else []:
                out[s.trace_id].append(s)
        return out

    yield make, spans
    for r in reversed(running):
        r.close()


def _grpc():
    try:
        import grpc
    except ImportError:
        return None
    return grpc


def _http_infer(url: str, x: list, headers: list[tuple[str, str]]) -> int:
    """POST one inference request to the HTTP door, with these header lines (a name may come twice)."""
    host, port = url.split("://")[1].rsplit(":", 1)
    body = json.dumps({"inputs": [{"name": "input", "shape": [len(x), 4], "datatype": "FP32",
                                   "data": np.ravel(x).tolist()}]}).encode()  # fmt: skip
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("POST", "/v2/models/cis/infer")
        for name, value in [*headers, ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]:
            conn.putheader(name, value)
        conn.endheaders(body)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def _grpc_infer(target: str, x: list, metadata: list[tuple[str, str]]) -> None:
    from cis.runtime.oip import grpc_messages as pb

    grpc = _grpc()
    req = pb.ModelInferRequest(model_name="cis")
    req.inputs.add(name="input", datatype="FP32", shape=[len(x), 4])
    req.raw_input_contents.append(np.asarray(x, np.float32).tobytes())
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=type(req).SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)  # fmt: skip
        call(req, timeout=10, metadata=metadata)


def _nodes_and_states(records: list[SpanRecord]) -> tuple[set[str], set[str]]:
    return {s.node for s in records}, {s.tracestate for s in records}


def test_a_tracestate_from_either_door_is_on_every_span_of_every_node(chain):
    make, spans = chain
    at = make()
    sent = {  # trace -> (tracestate expected on its spans, how it was sent)
        1: (STATE, [("traceparent", _tp(1, 11)), ("tracestate", "congo=t61rcWkgMzE \t"),
                    ("tracestate", "rojo=00f067aa0ba902b7")]),  # two header lines: one list, without the tab
        2: ("", [("traceparent", _tp(2, 12)), ("tracestate", "Congo=1")]),  # not a W3C tracestate: dropped
        3: ("", [("traceparent", _tp(3, 13)), ("tracestate", "a=" + "1" * 600)]),  # over 512: dropped
        4: ("", [("traceparent", _tp(4, 14))]),  # none
    }  # fmt: skip
    for trace, (_, headers) in sent.items():
        assert _http_infer(at["http"], [UNSURE], headers) == 200, trace  # dropped, never refused
    assert _http_infer(at["http"], [UNSURE], [("traceparent", "00-nothing"), ("tracestate", "a=1")]) == 200
    if _grpc() is not None:
        _grpc_infer(at["grpc"], [UNSURE], [("traceparent", _tp(5, 15)), ("tracestate", "a=1"), ("tracestate", "b=2")])
        sent[5] = ("a=1,b=2", [])
    traces = spans()
    for trace, (state, _) in sent.items():
        records = traces[f"{trace:032x}"]
        assert _nodes_and_states(records) == ({"dev", "edge", "cloud"}, {state}), trace
        assert {s.kind for s in records if s.node != "cloud"} == {"request", "queue", "compute", "forward"}
    new = [t for t in traces if int(t, 16) > 5]  # the invalid traceparent started a trace: without the tracestate
    assert len(new) == 1 and _nodes_and_states(traces[new[0]])[1] == {""}


def test_a_batch_keeps_each_requests_tracestate_through_a_node_that_does_not_trace(chain):
    make, spans = chain
    at = make(traced=("dev", "cloud"))
    requests = {  # traceparent -> (tracestate, samples)
        _tp(1, 11): ("a=1", [UNSURE]),
        _tp(2, 12): (None, [UNSURE, CONFIDENT]),
        _tp(3, 13): ("b=2,c=3", [CONFIDENT, UNSURE, UNSURE]),
        None: (None, [UNSURE]),  # no context: a new trace at the dev
    }
    with Client(at["dev"], timeout=10) as c:  # one batch at the dev (max_wait 0.2 s), one forward up
        ids = [c.submit(np.array(x, np.float32), traceparent=tp, tracestate=ts) for tp, (ts, x) in requests.items()]
        got = {}
        while len(got) < len(ids):
            got.update(c.poll(5))
    assert all(r.error is None for r in got.values())
    traces = spans()
    assert not any(s.node == "edge" for t in traces.values() for s in t)
    for tp, (ts, _) in requests.items():
        trace = tp.split("-")[1] if tp else next(t for t in traces if int(t, 16) > 3)
        assert _nodes_and_states(traces[trace]) == ({"dev", "cloud"}, {ts or ""}), tp
    forward_ids = {s.req_id for t in traces.values() for s in t if s.node == "cloud"}
    assert len(forward_ids) == 1  # the four requests' samples went up in one forward, through the edge


def _raw(sock: zmq.Socket, rid: int, **fields) -> dict:
    header = {"v": 1, "kind": "infer", "id": rid, "names": ["input"], "dtypes": ["float32"], "shapes": [[2, 4]],
              **fields}  # fmt: skip
    sock.send_multipart([msgpack.packb(header), np.zeros((2, 4), np.float32).tobytes()])
    assert sock.poll(5000)
    return msgpack.unpackb(sock.recv_multipart()[0])


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize(
    "fields, says",
    [
        ({"tracestate": "a=1"}, "tracestate without traceparent"),
        ({"tracestate": "a=1", "trace_parts": [[2, _tp(1, 2)]]}, "tracestate without traceparent"),
        ({"trace_states": ["a=1"]}, "trace_states without trace_parts"),
        ({"trace_states": ["a=1"], "traceparent": _tp(1, 2)}, "trace_states without trace_parts"),
        ({"trace_parts": [[1, _tp(1, 2)], [1, _tp(3, 4)]], "trace_states": ["a=1"]}, "one entry per pair"),
        ({"trace_parts": [[1, ""], [1, _tp(3, 4)]], "trace_states": ["a=1", ""]}, "entry 0"),
        ({"traceparent": _tp(1, 2), "tracestate": "A=1"}, "tracestate is 'A=1'; expected a W3C tracestate"),
        ({"traceparent": _tp(1, 2), "tracestate": None}, "tracestate"),
        ({"trace_parts": [[2, _tp(1, 2)]], "trace_states": ["a=1\t"]}, "trace_states"),
    ],
)
def test_a_tracestate_that_does_not_fit_its_context_is_bad_message_and_the_node_keeps_serving(
    tmp_path, fields, says, traced
):
    spans = tmp_path / "root.jsonl"
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr, spans_file=str(spans) if traced else None), {1: _stage(1)}))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(addr)
    try:
        reply = _raw(sock, 5, **fields)
        assert (reply["kind"], reply["id"], reply["code"]) == ("error", 5, "bad_message") and says in reply["message"]
        assert _raw(sock, 6, traceparent=_tp(5, 6), tracestate="a=1")["kind"] == "result"  # still serving
        both = _raw(sock, 7, trace_parts=[[1, ""], [1, _tp(6, 7)]], trace_states=["", "b=2"])
        assert both["kind"] == "result"
    finally:
        sock.close()
        node.close()
    if traced:
        records = read_spans(spans)
        assert {s.req_id for s in records} == {6, 7}  # a refused message never became a request: no span
        assert {(s.trace_id, s.tracestate) for s in records if s.req_id == 6} == {(f"{5:032x}", "a=1")}
        assert {s.tracestate for s in records if s.req_id == 7 and s.trace_id == f"{6:032x}"} == {"b=2"}
        assert {s.tracestate for s in records if s.req_id == 7 and s.trace_id != f"{6:032x}"} == {""}


# ---------------------------------------------------------------- spans: the file and the OTLP export


def test_the_otlp_export_sets_each_spans_trace_state(tmp_path, monkeypatch):
    pytest.importorskip("opentelemetry.sdk")
    from otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    addr = f"tcp://127.0.0.1:{free_port()}"
    node = Running(Node(NodeConfig("root", 1, bind=addr, otlp_endpoint=receiver.url), {1: _stage(1)}))
    try:
        with Client(addr, timeout=5) as c:
            c.infer(np.array([CONFIDENT], np.float32), traceparent=_tp(3, 4), tracestate=STATE)
            c.infer(np.array([CONFIDENT], np.float32), traceparent=_tp(5, 6))
        receiver.wait(lambda s: len(s) >= 6)
    finally:
        node.close()
        receiver.close()
    states = defaultdict(set)
    for s in receiver.spans:
        states[s["trace_id"]].add(s["trace_state"])
    assert states == {f"{3:032x}": {STATE}, f"{5:032x}": {""}}  # the request, queue and compute spans alike


def test_a_spans_line_has_a_tracestate_only_when_its_trace_came_with_one(tmp_path):
    fields = ("4bf92f3577b34da6a3ce929d0e0e4736", "7956321b38e6d5fd", None, "edge0", "request", 1.0, 2.0, 4, 1, 1, 2, 2)
    old = json.dumps(dict(zip(SpanRecord.__struct_fields__, fields)))  # a line of a file written before
    new = LINE_ENCODER.encode(SpanRecord(*fields, tracestate="a=1")).decode()
    assert LINE_ENCODER.encode(SpanRecord(*fields)).decode() == old.replace(" ", "")  # no key: as before
    (tmp_path / "s.jsonl").write_text(old + "\n" + new + "\n")
    assert [s.tracestate for s in read_spans(tmp_path / "s.jsonl")] == ["", "a=1"]


# ---------------------------------------------------------------- the client and cis infer


def test_the_client_checks_a_tracestate_before_sending():
    with Client(f"tcp://127.0.0.1:{free_port()}") as c:
        x = np.zeros((1, 4), np.float32)
        with pytest.raises(CisError, match="tracestate is 'a=1' without a traceparent"):
            c.submit(x, tracestate="a=1")
        with pytest.raises(CisError, match="tracestate is 'A=1'; expected a W3C tracestate"):
            c.submit(x, traceparent=_tp(1, 2), tracestate="A=1")
        with pytest.raises(CisError, match="without a traceparent"):
            c.infer_many(x, tracestate="a=1")
        assert c.in_flight == 0


def _cis(*argv: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("TRACEPARENT", "TRACESTATE")}
    return subprocess.run(cis_argv(*argv), capture_output=True, text=True, timeout=timeout, env={**base, **env})


@pytest.mark.parametrize(
    "argv, env, says",
    [
        (["--traceparent", _tp(1, 2), "--tracestate", "A=1"], {}, "--tracestate is 'A=1'; expected a W3C tracestate"),
        ([], {"TRACEPARENT": _tp(1, 2), "TRACESTATE": "a=1\tb=2"},
         "the TRACESTATE variable is 'a=1\\tb=2'; expected a W3C tracestate"),
        (["--tracestate", "a=1"], {}, "--tracestate is 'a=1' without a traceparent"),
    ],
)  # fmt: skip
def test_cis_infer_says_what_is_wrong_with_a_tracestate_in_one_line(argv, env, says):
    res = _cis("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "none.npz", *argv, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and says in lines[0], res.stderr


def test_cis_infer_sends_the_tracestate_of_its_flag_or_of_the_variables(tmp_path):
    np.savez(tmp_path / "x.npz", x=np.array([CONFIDENT], np.float32))
    addr = f"tcp://127.0.0.1:{free_port()}"
    spans = tmp_path / "root.jsonl"
    node = Running(Node(NodeConfig("root", 1, bind=addr, spans_file=str(spans)), {1: _stage(1)}))
    runs = [  # argv, env: the trace's expected tracestate
        (["--traceparent", _tp(1, 2), "--tracestate", "a=1"], {}),
        ([], {"TRACEPARENT": _tp(2, 2), "TRACESTATE": "b=2"}),
        (["--traceparent", _tp(3, 2)], {"TRACESTATE": "c=3"}),  # TRACESTATE is TRACEPARENT's: not this trace's
    ]
    try:
        for argv, env in runs:
            res = _cis("infer", "--connect", addr, "--dataset", str(tmp_path / "x.npz"), *argv, env=env)
            assert res.returncode == 0, res.stderr
    finally:
        node.close()
    got = {(int(s.trace_id, 16), s.tracestate) for s in read_spans(spans)}
    assert got == {(1, "a=1"), (2, "b=2"), (3, "")}
