"""The Open Inference Protocol (KServe v2), as the front doors speak it: pure encode, decode and error mapping.

No sockets here: :mod:`cis.runtime.oip.http_door` and :mod:`cis.runtime.oip.grpc_door` read
and write bytes, this module turns them into what a node admits (named numpy tensors
at stage 1) and a node's answer into the protocol's outputs. One model per node:

- its **inputs** are the entry stage's (stage 1 of the bundle: name, datatype, shape
  with ``-1`` for the batch);
- its **outputs** are what a node answers per sample: ``class`` (INT64), ``confidence``
  (FP32, the exit policy's confidence of that answer), ``exit`` (INT32, the exit that
  answered), ``flags`` (UINT8: 1 degraded, 2 capped, 4 non-finite input) and ``node``
  (BYTES, the node that answered), the five a request gets unless it names others; and,
  only when named, ``logits`` and ``probabilities`` (FP32 [N, C]: the answering exit's
  logits, and their softmax), which the request asks the tree for (the wire's
  ``want_logits``); the response's ``parameters`` add ``node`` (the node the request
  entered), ``degraded`` and ``capped`` (how many of its samples were).

Errors carry a code (the wire's :data:`cis.runtime.wire.ERROR_CODES`, or one of the
door's own: ``not_found``, ``unauthenticated``, ``not_ready``, ``timeout``,
``method_not_allowed``) that maps to an HTTP status (:data:`HTTP_STATUS`) and a gRPC
status (:data:`GRPC_STATUS`). See docs/runtime.md, *Open Inference Protocol*.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from cis.core.policy.confidence import softmax
from cis.core.stages.contract import LOGITS
from cis.core.version import __version__
from cis.runtime.feeds import TensorSpec
from cis.runtime.oip.errors import GRPC_STATUS, HTTP_STATUS, OipError
from cis.runtime.oip.tensors import BROKEN, DATATYPES, OIP_DATATYPE, Tensor, from_bytes, from_data, from_json
from cis.runtime.wire import MAX_DIM, MAX_DIMS

__all__ = [  # the protocol in one import for the doors (errors and tensors have modules of their own)
    "DATATYPES", "GRPC_STATUS", "HTTP_STATUS", "OIP_DATATYPE", "InferRequest", "Model", "OipError", "Tensor",
    "decode_json", "encode", "encode_json", "from_bytes", "from_data", "from_json", "input_meta", "request",
]  # fmt: skip

DEFAULT_OUTPUTS: dict[str, str] = {
    "class": "INT64",
    "confidence": "FP32",
    "exit": "INT32",
    "flags": "UINT8",
    "node": "BYTES",
}  # fmt: skip  (what a request that names no outputs gets)
LOGIT_OUTPUTS: dict[str, str] = {"logits": "FP32", "probabilities": "FP32"}  # [N, C]: only when named
OUTPUTS: dict[str, str] = {**DEFAULT_OUTPUTS, **LOGIT_OUTPUTS}
VERSION = "1"  # the one version of a node's model
PLATFORM = "cis"
EXTENSIONS = ["binary_tensor_data"]
HEADER_LENGTH = "inference-header-content-length"  # Triton's binary tensor data extension (lower case)

# ---------------------------------------------------------------- the model a node serves


def output_tensors(classes: int | None = None) -> tuple[Tensor, ...]:
    """The outputs' metadata: per sample ``[-1]``, the logits and probabilities ``[-1, classes]`` (-1: unknown)."""
    wide = (-1, -1 if classes is None else classes)
    return tuple(Tensor(k, v, wide if k in LOGIT_OUTPUTS else (-1,)) for k, v in OUTPUTS.items())


@dataclass
class Model:
    """The model a node serves through its doors: stage 1's inputs, the node's outputs."""

    name: str
    node: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...] = output_tensors()
    version: str = VERSION
    by_name: dict[str, Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.inputs}

    @classmethod
    def of_stage(
        cls, name: str, node: str, inputs: Sequence[TensorSpec], exit_outputs: Sequence[TensorSpec] = ()
    ) -> Model:
        """The model whose inputs are a stage's (``None`` dimensions become -1); ``exit_outputs``, the outputs of
        the node's exit stage, give the width of the logits (their last dimension)."""
        tensors = []
        for t in inputs:
            dt = OIP_DATATYPE.get(str(t.dtype))
            if dt is None:
                raise ValueError(f"input {t.name!r}: dtype {t.dtype} has no Open Inference Protocol datatype")
            tensors.append(Tensor(t.name, dt, tuple(-1 if d is None else int(d) for d in t.shape)))
        widths = [t.shape[-1] for t in exit_outputs if t.name == LOGITS and t.shape and t.shape[-1] is not None]
        return cls(name, node, tuple(tensors), output_tensors(int(widths[0]) if widths else None))

    def check(self, name: str, version: str | None, versions: Sequence[str] = (VERSION,)) -> None:
        """Raise ``not_found`` unless ``name`` is this model's and ``version`` (when given) one the node holds
        (``versions``: its bundle ids; :data:`VERSION` names the newest of them)."""
        if name != self.name:
            raise OipError("not_found", f"unknown model {name!r}; this node serves {self.name!r}")
        if version not in (None, "", VERSION, *versions):
            raise OipError("not_found", f"model {name!r} has no version {version!r}; versions: {', '.join(versions)}")

    def metadata(self, versions: Sequence[str] = (VERSION,)) -> dict:
        return {
            "name": self.name,
            "versions": list(versions),
            "platform": PLATFORM,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }


def server_metadata() -> dict:
    return {"name": "cis", "version": __version__, "extensions": EXTENSIONS}


# ---------------------------------------------------------------- a request


@dataclass
class InferRequest:
    """A decoded inference request: named tensors for stage 1, and what the answer should hold."""

    id: str | None
    tensors: dict[str, np.ndarray]
    outputs: list[str]  # requested output names, in the order the answer gives them
    binary: frozenset[str] = frozenset()  # outputs sent as raw bytes (HTTP's binary tensor data extension)
    timeout: float | None = None  # seconds (the request parameter "timeout", in microseconds as Triton's)
    traceparent: str | None = None  # W3C trace context of the caller (HTTP header / gRPC metadata "traceparent")
    tracestate: str = ""  # its W3C tracestate ("tracestate"), kept only when valid beside a valid traceparent
    version: str | None = None  # the model version its answer names (the bundle that answered it)

    @property
    def wants_logits(self) -> bool:
        """Whether an output needs the answering exits' logits (the INFER's ``want_logits``)."""
        return any(name in LOGIT_OUTPUTS for name in self.outputs)


_NO_DATA = msgspec.Raw(b"")


class _Input(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] = {}
    data: msgspec.Raw = _NO_DATA  # decoded with the input's datatype and shape once they are checked


class _Output(msgspec.Struct):
    name: str
    parameters: dict[str, Any] = {}


class _Request(msgspec.Struct):
    inputs: list[_Input]
    id: str | None = None
    parameters: dict[str, Any] = {}
    outputs: list[_Output] | None = None


class _Id(msgspec.Struct):
    id: str | None = None


_DECODE_REQUEST = msgspec.json.Decoder(_Request)
_DECODE_ID = msgspec.json.Decoder(_Id)
encode = msgspec.json.Encoder().encode


def _id_of(head: bytes | memoryview) -> str | None:
    """The ``id`` of a request that could not be decoded whole, when it can be read alone: by the decoder, or,
    where what follows it breaks even that (nested too deeply), as the body's first key, a plain string."""
    try:
        return _DECODE_ID.decode(head).id
    except (msgspec.ValidationError, *BROKEN):
        found = _LEADING_ID.match(bytes(head[:_LEADING_ID_BYTES]))
        return found.group(1).decode() if found else None


_LEADING_ID_BYTES = 512
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*"([ !#-\[\]-~]{0,256})"')  # printable ASCII but " and \


def _broken(exc: Exception, head: bytes | memoryview) -> str:
    """Why a body is not JSON. Bytes that are not UTF-8 are found here, whatever the decoder said: msgspec
    before 0.23 raised UnicodeDecodeError (with the byte), 0.23 its own "Invalid UTF-8 encoded string"."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    try:
        bytes(head).decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not UTF-8: {bad.reason} at byte {bad.start}"
    return str(exc)


def decode_json(body: bytes | memoryview, model: Model, header_length: int | None = None) -> InferRequest:
    """An HTTP request body: JSON, or (with ``header_length``, the Inference-Header-Content-Length) JSON
    followed by the inputs' raw bytes (Triton's binary tensor data extension). Every fault is an
    :class:`OipError` carrying the request's ``id`` when it was read."""
    view = memoryview(body)
    if header_length is not None:
        if not 0 <= header_length <= len(view):
            raise OipError(
                "bad_message",
                f"Inference-Header-Content-Length is {header_length}; the body has {len(view)} bytes",
            )
        head, binary = view[:header_length], view[header_length:]
    else:
        head, binary = view, view[:0]
    try:
        r = _DECODE_REQUEST.decode(head)
    except msgspec.ValidationError as exc:
        raise OipError("bad_message", f"inference request: {exc}", _id_of(head)) from None
    except BROKEN as exc:
        why = _broken(exc, head)
        raise OipError("bad_message", f"inference request is not valid JSON ({why})", _id_of(head)) from None
    try:
        tensors = _tensors(r.inputs, model, binary)
        outputs, binary_out = _outputs(r.outputs, r.parameters)
        return InferRequest(r.id, _complete(model, tensors), outputs, binary_out, timeout_of(r.parameters))
    except OipError as exc:
        exc.req_id = r.id
        raise


def _tensors(inputs: Sequence[_Input], model: Model, binary: memoryview) -> dict[str, np.ndarray]:
    """The inputs' tensors: each from its JSON ``data`` or its ``binary_data_size`` bytes of ``binary``."""
    tensors: dict[str, np.ndarray] = {}
    used = 0
    for i in inputs:
        meta = input_meta(model, i.name, i.datatype, i.shape, tensors)
        size = i.parameters.get("binary_data_size")
        has_data = len(i.data) > 0 and bytes(memoryview(i.data)[:4]) != b"null"
        if size is not None:
            if has_data:
                raise OipError("bad_tensor", f"input {i.name!r}: both data and binary_data_size; give one of them")
            if type(size) is not int or size < 0:
                raise OipError("bad_message", f"input {i.name!r}: binary_data_size is {size!r}; expected bytes >= 0")
            if used + size > len(binary):
                raise OipError(
                    "bad_message",
                    f"input {i.name!r}: binary_data_size {size} runs past the body ({len(binary) - used} bytes left)",
                )
            tensors[i.name] = from_bytes(binary[used : used + size], meta, i.shape)
            used += size
        elif not has_data:
            raise OipError("bad_tensor", f"input {i.name!r}: no data (and no binary_data_size parameter)")
        else:
            tensors[i.name] = from_json(i.data, meta, i.shape)
    if used != len(binary):
        raise OipError("bad_message", f"the body has {len(binary)} bytes of binary data; the inputs use {used}")
    return tensors


def input_meta(model: Model, name: str, datatype: str, shape: Sequence[int], seen: Mapping) -> Tensor:
    meta = model.by_name.get(name)
    if meta is None:
        raise OipError("bad_tensor", f"unknown input {name!r}; model {model.name!r} takes {list(model.by_name)}")
    if name in seen:
        raise OipError("bad_tensor", f"input {name!r} is given twice")
    if datatype != meta.datatype:
        raise OipError("bad_tensor", f"input {name!r}: datatype {datatype!r}; expected {meta.datatype}")
    if len(shape) != len(meta.shape) or not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape):
        raise OipError("bad_tensor", f"input {name!r}: shape {list(shape)}; expected {list(meta.shape)} (-1: any)")
    if any(want not in (-1, got) for want, got in zip(meta.shape, shape)) or len(shape) > MAX_DIMS:
        raise OipError("bad_tensor", f"input {name!r}: shape {list(shape)}; expected {list(meta.shape)} (-1: any)")
    return meta


def _complete(model: Model, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    missing = [t.name for t in model.inputs if t.name not in tensors]
    if missing:
        raise OipError("bad_tensor", f"missing input {missing[0]!r}; model {model.name!r} takes {list(model.by_name)}")
    return tensors


def _outputs(wanted: Iterable[_Output] | None, params: Mapping[str, Any]) -> tuple[list[str], frozenset[str]]:
    default = _flag(params, "binary_data_output", False, "parameter")
    if not wanted:
        return list(DEFAULT_OUTPUTS), frozenset(DEFAULT_OUTPUTS) if default else frozenset()
    names: list[str] = []
    binary = set()
    for o in wanted:
        _check_output(o.name, names)
        names.append(o.name)
        if _flag(o.parameters, "binary_data", default, f"output {o.name!r}: parameter"):
            binary.add(o.name)
    return names, frozenset(binary)


def _flag(params: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = params.get(key, default)
    if type(value) is not bool:
        raise OipError("bad_message", f"{where} {key} is {value!r}; expected true or false")
    return value


def _check_output(name: str, before: Sequence[str]) -> None:
    if name not in OUTPUTS:
        raise OipError("bad_tensor", f"unknown output {name!r}; expected some of {list(OUTPUTS)}")
    if name in before:
        raise OipError("bad_tensor", f"output {name!r} is named twice; name each output once")


def timeout_of(params: Mapping[str, Any]) -> float | None:
    """Seconds of the request parameter ``timeout`` (Triton's: microseconds, an integer > 0), or None."""
    if "timeout" not in params:
        return None
    t = params["timeout"]  # present means valid: a JSON null is no timeout given, so it is refused too
    if type(t) is not int or not 0 < t < 2**63:  # an int64 (gRPC's int64_param), so seconds are a float
        shown = f"an integer of {t.bit_length()} bits" if type(t) is int and t >= 2**63 else repr(t)
        expected = "expected microseconds, an integer > 0 and < 2**63"
        raise OipError("bad_message", f"parameter timeout is {shown}; {expected}")
    return t / 1e6


def request(
    model: Model,
    tensors: dict[str, np.ndarray],
    req_id: str | None = None,
    outputs: Sequence[str] = (),
    timeout: float | None = None,
) -> InferRequest:
    """An InferRequest from tensors already decoded (the gRPC door), checked like :func:`decode_json`'s."""
    for i, name in enumerate(outputs):
        _check_output(name, outputs[:i])
    return InferRequest(
        req_id or None, _complete(model, tensors), list(outputs or DEFAULT_OUTPUTS), frozenset(), timeout
    )


# ---------------------------------------------------------------- an answer


def output_arrays(
    names: Sequence[str], cls, conf, ex, flags, served_by: Sequence[str], logits: np.ndarray | None = None
) -> list[tuple[str, Any]]:
    """(name, values) of the requested outputs: arrays ((N,), or (N, C) for ``logits`` and ``probabilities``,
    the softmax of the logits), and for ``node`` a list of node ids."""
    values = {"class": cls, "confidence": conf, "exit": ex, "flags": flags, "node": served_by}
    if logits is not None or any(name in LOGIT_OUTPUTS for name in names):
        lg = np.zeros((len(cls), 0), np.float32) if logits is None else np.asarray(logits, np.float32)
        values["logits"] = lg
        if "probabilities" in names:
            values["probabilities"] = softmax(lg).astype(np.float32)
    return [(name, values[name]) for name in names]


def to_bytes(name: str, values: Any) -> bytes:
    """An output's raw bytes: little-endian row-major, BYTES as 4-byte lengths each followed by its bytes."""
    if OUTPUTS[name] == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (s.encode() for s in values))
    return np.ascontiguousarray(values, np.dtype(DATATYPES[OUTPUTS[name]]).newbyteorder("<")).tobytes()


def shape_of(values: Any) -> list[int]:
    """An output's shape: an array's, or [N] for the node ids."""
    return list(values.shape) if type(values) is np.ndarray else [len(values)]


def parameters(node: str, flags: np.ndarray) -> dict[str, Any]:
    """The response's parameters: the entry node, and how many samples were degraded and capped."""
    return {
        "node": node,
        "degraded": int(np.count_nonzero(flags & 1)),
        "capped": int(np.count_nonzero(flags & 2)),
    }


def encode_json(
    model: Model, req: InferRequest, cls, conf, ex, flags, served_by: Sequence[str], logits: np.ndarray | None = None
) -> tuple[bytes, int | None]:
    """The HTTP body of an answer, and the Inference-Header-Content-Length when outputs go as binary (else None).
    JSON ``data`` is flat (row-major), NaN as ``null``."""
    outputs, blobs = [], []
    for name, values in output_arrays(req.outputs, cls, conf, ex, flags, served_by, logits):
        out: dict[str, Any] = {"name": name, "datatype": OUTPUTS[name], "shape": shape_of(values)}
        if name in req.binary:
            raw = to_bytes(name, values)
            out["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            out["data"] = values if name == "node" else values.ravel().tolist()
        outputs.append(out)
    body: dict[str, Any] = {"model_name": model.name, "model_version": req.version or model.version}
    if req.id is not None:
        body["id"] = req.id
    body["parameters"] = parameters(model.node, flags)
    body["outputs"] = outputs
    head = encode(body)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)
