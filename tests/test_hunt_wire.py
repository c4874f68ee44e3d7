"""Defects a wire hunt found (docs/protocol.md is the contract): a header value nested 1,000 deep (1 KB of
msgpack) killed the node while it wrote the error message; a ROUTER's identity frame, counted against
``--max-message-bytes``, made a message just under the limit lose its last tensor frame silently, and the
request was served without it.

A real node process (``cis serve`` of the demo bundle) and real DEALER sockets."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

pytest.importorskip("onnx")

from cli_process import read_until, start, stop  # noqa: E402

from cis.runtime import protocol as P  # noqa: E402
from cis.runtime.launcher import free_port  # noqa: E402

LIMIT = 20_000
DEEP = b"\x91" * 1000 + b"\xc0"  # [[[ ... nil ... ]]], 1,000 levels: 1 KB


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    bundle = make_demo_bundle(tmp_path_factory.mktemp("wire"), steps=20)
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = start("serve", bundle, "--node", "cloud", "--bind", address, "--provider", "cpu",
                 "--max-message-bytes", LIMIT)  # fmt: skip
    read_until(proc.stderr, proc, "node_start")
    yield address, proc
    assert stop(proc) == 0


def _ask(address: str, frames: list, identity: bytes | None = None) -> P.Message:
    with zmq.Context.instance().socket(zmq.DEALER) as s:
        s.linger = 0
        if identity:
            s.routing_id = identity
        s.connect(address)
        s.send_multipart(frames)
        assert s.poll(10_000), "no reply: the node did not answer"
        return P.decode(s.recv_multipart(), kinds=P.REPLY_KINDS)


def _good(address: str) -> P.Message:
    x = np.zeros((1, 1, 8, 8), np.float32)
    return _ask(address, P.encode(P.INFER, 7, tensors={"input": x}))


def _nested(field: str) -> bytes:
    fields = {"v": 1, "kind": "status", "id": 5}
    head = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in fields.items() if k != field)
    return bytes([0x80 | (len(fields) - (field in fields) + 1)]) + head + msgpack.packb(field) + DEEP


@pytest.mark.parametrize("field", ["route", "kind", "traceparent"])
def test_a_value_nested_a_thousand_deep_is_answered_bad_message_and_the_node_serves_on(node, field):
    address, proc = node
    reply = _ask(address, [_nested(field)])
    assert reply.kind == P.ERROR and reply.head.code in ("bad_message", "unknown_kind")
    assert proc.poll() is None and _good(address).kind == P.RESULT


def test_a_reply_nested_a_thousand_deep_is_a_protocol_error_not_a_crash():
    head = b"\x84" + b"".join(msgpack.packb(x) for x in ("v", 2, "kind", "pong", "id", 1, "node")) + DEEP
    with pytest.raises(P.ProtocolError) as err:
        P.decode([head], kinds=P.REPLY_KINDS)
    assert err.value.code == "bad_message" and "node is [[[[" in err.value.message


def _two_tensors(total: int) -> list[bytes]:
    """An infer whose frames add up to ``total`` bytes: the input and an extra tensor the stage does not take."""
    h = {"v": 1, "kind": "infer", "id": 9, "names": ["input", "p"], "dtypes": ["float32", "uint8"],
         "shapes": [[1, 1, 8, 8], [0]]}  # fmt: skip
    for _ in range(3):  # the header's length depends on the padding's shape
        pad = total - 256 - len(msgpack.packb(h))
        h["shapes"][1] = [pad]
    return [msgpack.packb(h), bytes(256), bytes(pad)]


@pytest.mark.parametrize("identity", [None, b"R" * 200])
@pytest.mark.parametrize("total", [LIMIT - 300, LIMIT - 150, LIMIT])
def test_a_tensor_near_the_size_limit_is_never_dropped_silently(node, identity, total):
    reply = _ask(node[0], _two_tensors(total), identity and identity[:-6] + str(total).encode().rjust(6, b"x"))
    assert reply.kind == P.ERROR and reply.head.code == "bad_tensor", reply.head
    assert "['input', 'p']" in reply.head.message
