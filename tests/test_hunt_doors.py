"""Bad input at the front doors found by a hunt with real requests (issue hunt 20): parameters of the wrong type
are 400 rather than ignored, Triton's gRPC ``timeout`` parameter is read, a gRPC message that does not parse is
INVALID_ARGUMENT (not grpcio's INTERNAL and a traceback in the node's log), and malformed HTTP says what httptools
found wrong. One node for the module."""

from __future__ import annotations

import json
import re
import socket

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("httptools")
grpc = pytest.importorskip("grpc")

from cli_process import read_until, start, stop  # noqa: E402

from cis.runtime.launcher import free_port  # noqa: E402
from cis.runtime.oip import codec, grpc_door  # noqa: E402
from cis.runtime.oip import grpc_messages as pb  # noqa: E402


class _Spec:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype


MODEL = codec.Model.of_stage("cis", "device0", [_Spec("input", (None, 1, 8, 8), "float32")])
X = np.zeros((1, 1, 8, 8), np.float32)


def _body(**extra) -> bytes:
    inp = {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": X.ravel().tolist()}
    return json.dumps({"inputs": [inp], **extra}).encode()


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"parameters": {"binary_data_output": "yes"}}, "parameter binary_data_output is 'yes'; expected true or"),
        ({"parameters": {"binary_data_output": 1}}, "parameter binary_data_output is 1; expected true or false"),
        (
            {"outputs": [{"name": "class", "parameters": {"binary_data": "x"}}]},
            "output 'class': parameter binary_data is 'x'; expected true or false",
        ),
    ],
)
def test_a_binary_data_parameter_that_is_not_a_boolean_is_refused(extra, words):
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(_body(**extra), MODEL)
    assert err.value.code == "bad_message" and words in err.value.message
    req = codec.decode_json(_body(parameters={"binary_data_output": True}), MODEL)
    assert req.binary == frozenset(codec.DEFAULT_OUTPUTS)


def _grpc_request(**params) -> object:
    req = pb.ModelInferRequest(model_name="cis")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 1, 8, 8])
    req.raw_input_contents.append(X.tobytes())
    for key, (kind, value) in params.items():
        setattr(req.parameters[key], kind, value)
    return req


def test_the_grpc_timeout_parameter_is_the_requests_deadline_and_checked():
    assert grpc_door.decode(_grpc_request(timeout=("int64_param", 250_000)), MODEL).timeout == 0.25
    assert grpc_door.decode(_grpc_request(), MODEL).timeout is None
    for kind, value in (("int64_param", -5), ("string_param", "x")):
        with pytest.raises(codec.OipError) as err:
            grpc_door.decode(_grpc_request(timeout=(kind, value)), MODEL)
        assert err.value.code == "bad_message" and "expected microseconds, an integer > 0" in err.value.message


def test_a_timeout_in_tritons_other_parameter_fields_is_read_or_refused_not_ignored():
    """Triton's proto also has double_param (4) and uint64_param (5): a timeout sent in one is not dropped."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

    def ours(kind, value):
        theirs = service_pb2.ModelInferRequest(model_name="cis")
        setattr(theirs.parameters["timeout"], kind, value)
        req = _grpc_request()
        req.MergeFromString(theirs.SerializeToString())
        return grpc_door.decode(req, MODEL)

    assert ours("uint64_param", 250_000).timeout == 0.25
    with pytest.raises(codec.OipError) as err:
        ours("double_param", 250_000.0)
    assert err.value.code == "bad_message"
    assert "parameter timeout is 250000.0; expected microseconds" in err.value.message


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    bundle = make_demo_bundle(tmp_path_factory.mktemp("hunt_doors"), steps=20)
    zmq = f"tcp://127.0.0.1:{free_port()}"
    proc = start(
        "serve", bundle, "--node", "cloud", "--bind", zmq, "--provider", "cpu", "--http-port", 0, "--grpc-port", 0
    )
    text = "".join(read_until(proc.stderr, proc, "node_start"))
    http = re.search(r"http front door at http://(\S+)", text).group(1)
    target = re.search(r"grpc front door at (\S+)", text).group(1)
    yield proc, http, target
    assert stop(proc) == 0


def _grpc(target: str, method: str, message: bytes, answer) -> object:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/{pb.SERVICE}/{method}", response_deserializer=answer.FromString)
        return call(message, timeout=10)


def test_a_grpc_message_that_does_not_parse_is_invalid_argument(node):
    proc, _, target = node
    for method in ("ModelInfer", "ModelMetadata"):
        with pytest.raises(grpc.RpcError) as err:
            _grpc(target, method, b"\xff\xff\xff\xff", getattr(pb, method + "Response"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"bad_message: the request is not a serialized inference.{method}Request" in err.value.details()
    good = _grpc(target, "ModelInfer", _grpc_request().SerializeToString(), pb.ModelInferResponse)
    assert [o.name for o in good.outputs][0] == "class" and proc.poll() is None
    with pytest.raises(grpc.RpcError) as err:
        bad = _grpc_request(timeout=("int64_param", -1)).SerializeToString()
        _grpc(target, "ModelInfer", bad, pb.ModelInferResponse)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameter timeout is -1" in err.value.details()


@pytest.mark.parametrize(
    "head, words",
    [
        (b"Content-Length: -1\r\n", b"malformed HTTP/1.1 request: Invalid character in Content-Length"),
        (b"Content-Length: 1\r\nContent-Length: 2\r\n", b"malformed HTTP/1.1 request: Duplicate Content-Length"),
    ],
)
def test_malformed_http_says_what_is_wrong(node, head, words):
    host, port = node[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/cis/infer HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n{}")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 400 ") and words in got


def test_an_empty_version_in_a_path_names_no_endpoint():
    from cis.runtime.oip.http_connection import route

    assert route("/v2/models/cis/versions//ready") == ("", None, None)
    assert route("/v2/models/cis/versions/1/ready") == ("model_ready", "cis", "1")


def test_a_timeout_of_hundreds_of_digits_says_so():
    body = _body().replace(b'"inputs"', b'"parameters": {"timeout": 1' + b"0" * 400 + b'}, "inputs"', 1)
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(body, MODEL)
    assert err.value.code == "bad_message"
    assert "parameter timeout is an integer of 1329 bits" in err.value.message
    assert "expected microseconds, an integer > 0 and < 2**63" in err.value.message


def test_a_grpc_input_in_both_contents_and_raw_input_contents_is_refused():
    req = _grpc_request()
    req.inputs[0].contents.fp32_contents.extend([0.5] * 64)
    with pytest.raises(codec.OipError) as err:
        grpc_door.decode(req, MODEL)
    assert err.value.code == "bad_tensor" and "both contents and raw_input_contents" in err.value.message


def test_a_json_value_past_its_datatypes_range_says_the_range_may_be_why():
    from cis.runtime.oip.errors import OipError
    from cis.runtime.oip.tensors import Tensor, from_json

    with pytest.raises(OipError, match=r"data is not a flat or nested list of FP32 values \(of the shape, each "
                                       r"within FP32's range\)"):  # fmt: skip
        from_json(b"[1.0, " + b"9" * 400 + b"]", Tensor("input", "FP32", (-1, 2)), (1, 2))


def test_a_null_timeout_is_refused_as_any_timeout_that_is_not_an_integer():
    """Present means valid (docs/runtime.md: a timeout that is not an integer > 0 and < 2**63 is 400)."""
    body = _body().replace(b'"inputs"', b'"parameters": {"timeout": null}, "inputs"', 1)
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(body, MODEL)
    assert err.value.code == "bad_message" and "parameter timeout is None" in err.value.message
