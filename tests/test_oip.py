"""The Open Inference Protocol's encode and decode (cis/runtime/oip/codec.py), without sockets: JSON tensors flat and
nested, Triton's binary tensor data extension both ways, and every bad input the front doors refuse, each with
its code (HTTP 400/404/413) and one line saying what was expected. The servers are tested in
tests/test_front_door.py."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from cis.runtime.feeds import FeedContract
from cis.runtime.oip import codec

pytest.importorskip("httptools")
from cis.runtime.oip.http_connection import route  # noqa: E402


class _Spec:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype


INPUTS = [_Spec("input", (None, 1, 8, 8), "float32")]
MODEL = codec.Model.of_stage("cis", "device0", INPUTS)


def _json(inputs, **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _input(data, shape=(2, 1, 8, 8), datatype="FP32", **params):
    t = {"name": "input", "shape": list(shape), "datatype": datatype}
    if data is not None:
        t["data"] = data
    if params:
        t["parameters"] = params
    return t


def test_metadata_names_the_entry_stage_inputs_and_the_node_outputs():
    meta = MODEL.metadata()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    names = ["class", "confidence", "exit", "flags", "node", "logits", "probabilities"]
    assert [o["name"] for o in meta["outputs"]] == names
    assert meta["outputs"][5] == {"name": "logits", "datatype": "FP32", "shape": [-1, -1]}  # width unknown here
    assert meta["versions"] == ["1"] and meta["platform"] == "cis"
    exit_outputs = [_Spec("logits", (None, 10), "float32"), _Spec("features_1", (None, 16, 8, 8), "float32")]
    wide = codec.Model.of_stage("cis", "device0", INPUTS, exit_outputs).metadata()["outputs"]
    assert {o["name"]: o["shape"] for o in wide} == {**{n: [-1] for n in names[:5]}, "logits": [-1, 10],
                                                       "probabilities": [-1, 10]}  # fmt: skip


def test_flat_and_nested_data_give_the_same_tensor_the_stage_accepts():
    x = np.arange(128, dtype=np.float32).reshape(2, 1, 8, 8) / 128
    flat = codec.decode_json(_json([_input(x.ravel().tolist())], id="r1"), MODEL)
    nested = codec.decode_json(_json([_input(x.tolist())]), MODEL)
    np.testing.assert_array_equal(flat.tensors["input"], x)
    np.testing.assert_array_equal(nested.tensors["input"], x)
    assert flat.id == "r1" and nested.id is None and flat.outputs == ["class", "confidence", "exit", "flags", "node"]
    assert not flat.wants_logits  # the default outputs: the wire request asks for no logits
    assert FeedContract(INPUTS).check(flat.tensors) == (None, 2)  # what the executor admits


def test_binary_inputs_and_outputs_follow_the_extension():
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    head = _json(
        [_input(None, x.shape, binary_data_size=x.nbytes)],
        outputs=[{"name": "class", "parameters": {"binary_data": True}}, {"name": "node"}],
        parameters={"binary_data_output": False},
    )
    req = codec.decode_json(head + x.tobytes(), MODEL, len(head))
    np.testing.assert_array_equal(req.tensors["input"], x)
    assert req.outputs == ["class", "node"] and req.binary == {"class"}
    cls, conf = np.array([1, 2, 3], np.int64), np.array([0.5, 0.25, 1.0], np.float32)
    ex, flags = np.array([1, 2, 2], np.int32), np.array([0, 1, 2], np.uint8)
    body, length = codec.encode_json(MODEL, req, cls, conf, ex, flags, ["device0", "edge0", "device0"])
    assert length is not None
    answer = json.loads(body[:length])
    assert answer["parameters"] == {"node": "device0", "degraded": 1, "capped": 1}
    assert answer["outputs"][0] == {"name": "class", "datatype": "INT64", "shape": [3],
                                    "parameters": {"binary_data_size": 24}}  # fmt: skip
    assert answer["outputs"][1]["data"] == ["device0", "edge0", "device0"]
    np.testing.assert_array_equal(np.frombuffer(body[length:], "<i8"), cls)


def test_all_outputs_binary_and_bytes_are_length_prefixed():
    head = _json([_input(None, (1, 1, 8, 8), binary_data_size=256)], parameters={"binary_data_output": True})
    req = codec.decode_json(head + bytes(256), MODEL, len(head))
    assert req.binary == {"class", "confidence", "exit", "flags", "node"}  # the default outputs, all binary
    assert codec.to_bytes("node", ["edge1"]) == struct.pack("<I", 5) + b"edge1"


def test_logits_and_probabilities_when_named_json_flat_and_binary():
    head = _json(
        [_input(None, (2, 1, 8, 8), binary_data_size=512)],
        outputs=[{"name": "probabilities", "parameters": {"binary_data": True}}, {"name": "logits"}, {"name": "exit"}],
    )
    req = codec.decode_json(head + bytes(512), MODEL, len(head))
    assert req.outputs == ["probabilities", "logits", "exit"] and req.binary == {"probabilities"} and req.wants_logits
    logits = np.array([[0.0, 1.0, 2.0], [np.nan, np.nan, np.nan]], np.float32)  # a row nobody could give: NaN
    cls, conf = np.array([2, -1], np.int64), np.array([0.66, np.nan], np.float32)
    ex, flags = np.array([3, 1], np.int32), np.array([0, 4], np.uint8)
    body, length = codec.encode_json(MODEL, req, cls, conf, ex, flags, ["cloud", "device0"], logits)
    answer = json.loads(body[:length])
    probs, lg, ex_out = answer["outputs"]
    assert probs == {"name": "probabilities", "datatype": "FP32", "shape": [2, 3],
                     "parameters": {"binary_data_size": 24}}  # fmt: skip
    assert lg == {"name": "logits", "datatype": "FP32", "shape": [2, 3], "data": [0.0, 1.0, 2.0, None, None, None]}
    assert ex_out["data"] == [3, 1]
    p = np.frombuffer(body[length:], "<f4").reshape(2, 3)
    np.testing.assert_allclose(p[0], np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum(), rtol=1e-6)
    assert abs(p[0].sum() - 1) < 1e-6 and np.isnan(p[1]).all()


@pytest.mark.parametrize(
    "body, length, code, words",
    [
        (b'{"inputs": [', None, "bad_message", "not valid JSON"),
        (b'{"inputs": 3}', None, "bad_message", "Expected `array`"),
        (_json([_input([0.0] * 128, datatype="FP64")]), None, "bad_tensor", "datatype 'FP64'; expected FP32"),
        (_json([_input([0.0] * 128, shape=(2, 64))]), None, "bad_tensor", "shape [2, 64]; expected [-1, 1, 8, 8]"),
        (_json([_input([0.0] * 127)]), None, "bad_tensor", "127 values in data; shape [2, 1, 8, 8] holds 128"),
        (_json([_input([[0.0] * 64, [0.0] * 63])]), None, "bad_tensor", "flat or nested list of FP32"),
        (_json([_input(["a"] * 128)]), None, "bad_tensor", "flat or nested list of FP32"),
        (_json([_input(None)]), None, "bad_tensor", "no data"),
        (_json([{**_input([0.0] * 128), "name": "x"}]), None, "bad_tensor", "unknown input 'x'"),
        (_json([]), None, "bad_tensor", "missing input 'input'"),
        (_json([_input([0.0] * 128)], outputs=[{"name": "features"}]), None, "bad_tensor",
         "unknown output 'features'"),
        (_json([_input([0.0] * 128)], parameters={"timeout": -1}), None, "bad_message", "timeout"),
        (b"{}", 10, "bad_message", "Inference-Header-Content-Length is 10; the body has 2 bytes"),
        (_json([_input(None, binary_data_size=512)]) + bytes(100), len(_json([_input(None, binary_data_size=512)])),
         "bad_message", "runs past the body"),
        (_json([_input(None, binary_data_size=100)]) + bytes(100), len(_json([_input(None, binary_data_size=100)])),
         "bad_tensor", "100 bytes; shape [2, 1, 8, 8] of FP32 needs 512"),
        (_json([_input([0.0] * 128)]) + bytes(8), len(_json([_input([0.0] * 128)])), "bad_message", "binary data"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_with_a_code_and_one_line(body, length, code, words):
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(body, MODEL, length)
    assert err.value.code == code and err.value.status == 400
    assert words in err.value.message and "\n" not in err.value.message


def test_unknown_model_or_version_is_404():
    MODEL.check("cis", None)
    MODEL.check("cis", "1")
    for name, version in (("other", None), ("cis", "2")):
        with pytest.raises(codec.OipError) as err:
            MODEL.check(name, version)
        assert err.value.status == 404 and err.value.code == "not_found"


def test_every_wire_error_code_has_an_http_and_a_grpc_status():
    from cis.runtime.wire import ERROR_CODES

    assert set(ERROR_CODES) <= set(codec.HTTP_STATUS) and set(codec.HTTP_STATUS) == set(codec.GRPC_STATUS)
    assert codec.HTTP_STATUS["overloaded"] == 503 and codec.HTTP_STATUS["deadline_exceeded"] == 504
    assert codec.HTTP_STATUS["too_large"] == 413


@pytest.mark.parametrize(
    "path, want",
    [
        ("/v2", ("server", None, None)),
        ("/v2/health/live", ("live", None, None)),
        ("/v2/health/ready", ("ready", None, None)),
        ("/v2/models/cis", ("model", "cis", None)),
        ("/v2/models/cis/ready", ("model_ready", "cis", None)),
        ("/v2/models/cis/infer", ("infer", "cis", None)),
        ("/v2/models/cis/versions/1/infer", ("infer", "cis", "1")),
        ("/v2/models/my%20model/versions/7", ("model", "my model", "7")),
        ("/v2/models/cis/explain", ("", "cis", None)),
        ("/v1/models/cis", ("", None, None)),
    ],
)
def test_routes(path, want):
    assert route(path) == want


# ---------------------------------------------------------------- issue 42 (D6): strict data, one answer per name


@pytest.mark.parametrize(
    "data, words",
    [
        (["0.5"] * 128, "list of FP32"),  # numeric strings are no numbers
        ([True] * 128, "list of FP32"),  # nor are booleans
        ([[0.0] * 64] * 2, "list of FP32"),  # nested, but not to the shape (rank 4)
    ],
)
def test_data_takes_numbers_of_the_datatype_only(data, words):
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(_json([_input(data)], id="r5"), MODEL)
    assert err.value.code == "bad_tensor" and words in err.value.message
    assert err.value.req_id == "r5"  # a fault after the id was read carries it


def test_integer_and_bool_inputs_are_strict_too():
    model = codec.Model.of_stage("m", "n", [_Spec("ids", (None, 3), "int64"), _Spec("mask", (None, 3), "bool")])

    def body(ids, mask):
        return _json([{"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": ids},
                      {"name": "mask", "shape": [1, 3], "datatype": "BOOL", "data": mask}])  # fmt: skip

    req = codec.decode_json(body([[1, 2, 3]], [True, False, True]), model)
    assert req.tensors["ids"].tolist() == [[1, 2, 3]] and req.tensors["mask"].dtype == np.bool_
    for ids, mask in (([1.5, 2, 3], [True] * 3), ([1, 2, 3], [1, 0, 1]), ([1, 2, "3"], [True] * 3)):
        with pytest.raises(codec.OipError):
            codec.decode_json(body(ids, mask), model)


def test_a_repeated_output_and_data_beside_binary_data_size_are_refused():
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(_json([_input([0.0] * 128)], outputs=[{"name": "class"}, {"name": "class"}]), MODEL)
    assert "output 'class' is named twice" in err.value.message
    with pytest.raises(codec.OipError) as err:
        codec.request(MODEL, {"input": np.zeros((1, 1, 8, 8), np.float32)}, outputs=["exit", "exit"])
    assert "named twice" in err.value.message
    head = _json([_input([0.0] * 128, binary_data_size=512)])
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(head + bytes(512), MODEL, len(head))
    assert "both data and binary_data_size" in err.value.message


@pytest.mark.parametrize(
    "body, words, req_id",
    [
        (b'{"id": "a", "inputs": 3}', "Expected `array`", "a"),  # valid JSON: the id is read alone
        (b'{"id": "b", "inputs": [', "not valid JSON", "b"),  # truncated after the id: the id is its first key
        (b'{"id": "c", "inputs": [{"name": "input", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",
         "nested too deeply", "c"),
        (b'{"inputs": [], "id": "d", "x": [', "not valid JSON", None),  # a broken body whose id is not first
        (b'{"id": "\xff"}', "not UTF-8", None),
    ],
)  # fmt: skip
def test_undecodable_json_is_a_bad_message_with_the_id_where_it_can_be_read(body, words, req_id):
    with pytest.raises(codec.OipError) as err:
        codec.decode_json(body, MODEL)
    assert err.value.code == "bad_message" and words in err.value.message and err.value.req_id == req_id


def test_versions_are_the_bundles_the_node_holds_and_1_names_the_newest():
    from types import SimpleNamespace

    from cis.runtime.oip import door

    node = SimpleNamespace(cfg=SimpleNamespace(bundle_sha256="ab" * 32))
    assert door.versions(node) == ["abababababababab"]  # the bundle id: the manifest's sha256[:16]
    node.versions = ["0123456789abcdef", "fedcba9876543210"]  # a node holding two bundles (a rollout), newest last
    assert door.versions(node) == node.versions
    for version in (None, "", "1", "0123456789abcdef", "fedcba9876543210"):
        MODEL.check("cis", version, node.versions)
    with pytest.raises(codec.OipError) as err:
        MODEL.check("cis", "2", node.versions)
    assert err.value.code == "not_found" and "0123456789abcdef, fedcba9876543210" in err.value.message
    assert MODEL.metadata(node.versions)["versions"] == node.versions


def test_the_bearer_scheme_is_any_case_and_the_token_exact():
    from cis.runtime.oip.door import bearer

    for given in (b"Bearer s3", b"bearer s3", b"BEARER s3", "Bearer s3", b" Bearer  s3 "):
        assert bearer(given, b"s3")
    for given in (None, b"", b"Bearer s4", b"Basic s3", b"Bearers3", b"Bearer s3x"):
        assert not bearer(given, b"s3")


def test_a_later_traceparent_version_is_read_as_version_00():
    from cis.runtime.oip.door import trace_context
    from cis.runtime.wire import is_traceparent

    ids = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert trace_context(f"00-{ids}") == f"00-{ids}"
    assert trace_context(f"01-{ids}-later-fields") == f"00-{ids}" and is_traceparent(trace_context(f"01-{ids}-x"))
    assert trace_context(f"01-{ids}") == f"00-{ids}"  # a later version with its four fields only
    for bad in (f"ff-{ids}-x", f"00-{ids}-extra", "not-a-trace"):  # ff is invalid; version 00 has no more fields
        assert not is_traceparent(trace_context(bad))
    assert trace_context(None) is None


def test_triton_config_and_statistics_forms():
    from types import SimpleNamespace

    from cis.runtime.metrics_http import node_timings
    from cis.runtime.oip import triton

    exit_outputs = [_Spec("logits", (None, 10), "float32")]
    model = codec.Model.of_stage("cis", "device0", INPUTS, exit_outputs)
    node = SimpleNamespace(
        cfg=SimpleNamespace(queue_limit=256), observe_latency=None, executor=SimpleNamespace(timings=None),
        outcomes={("infer", "ok"): 3, ("forward", "ok"): 1, ("infer", "bad_tensor"): 2, ("other", "ok"): 9},
        counters={"samples": 12, "batches": 4},
    )  # fmt: skip
    latency, timings = node_timings(node)
    latency.observe(0.002)
    timings.queue.observe(0.001)
    timings.compute.observe(0.003)
    config = triton.config(model, node, ["abc"])
    assert config["max_batch_size"] == 256 and config["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [1, 8, 8]}
    ]
    outputs = {o["name"]: o for o in config["output"]}
    assert outputs["class"] == {"name": "class", "data_type": "TYPE_INT64", "dims": [1], "reshape": {"shape": []}}
    assert outputs["node"]["data_type"] == "TYPE_STRING" and outputs["logits"]["dims"] == [10]
    (stats,) = triton.statistics(model, node, "abc")["model_stats"]
    assert stats["version"] == "abc" and stats["inference_count"] == 12 and stats["execution_count"] == 4
    inference = stats["inference_stats"]
    assert inference["success"] == {"count": 4, "ns": 2_000_000} and inference["fail"]["count"] == 2
    assert inference["queue"] == {"count": 1, "ns": 1_000_000} and inference["compute_infer"]["ns"] == 3_000_000
