"""The load generator's transports (:mod:`cis.runtime.loadgen`): how one request goes out and its answer comes back.

Each transport is read from the load generator's one asyncio loop and says what a node takes (:meth:`describe`),
makes a sample's request body once (:meth:`encode`), sends it and awaits the answer (:meth:`call`), raising
:class:`Refused` with the error's class when the server answers with an error:

- ``zmq``: :class:`cis.runtime.client.Client` per address (its DEALER socket's descriptor read by the loop); the
  node's status reply names its inputs; error classes are the node's error codes (``overloaded``, ``bad_input``...);
- ``http``: the Open Inference Protocol over HTTP/1.1 (``http://HOST:PORT`` or ``https://``), keep-alive
  connections opened as requests need them (an open loop never waits for a free one), the JSON body (or, with
  ``binary``, Triton's binary tensor extension) made once per sample; error classes: the body's ``code`` (cis's
  front door), else ``http_STATUS``;
- ``grpc``: the Open Inference Protocol over gRPC (``HOST:PORT``, the 'grpc' extra), the message serialised once
  per sample; error classes: the cis code in the status details (``overloaded: ...``), else the gRPC status's name.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec
import numpy as np

from cis.core.bundle import TensorInfo
from cis.core.errors import CisError
from cis.runtime.oip.codec import DATATYPES, OIP_DATATYPE

TRANSPORTS = ("zmq", "http", "grpc")
WANTED = ("class", "confidence", "exit", "node", "flags")  # the outputs a load asks for: what served each request


@dataclass
class Answer:
    """What answered one request: its class, exit (0: unknown), the node that served it, its flags and the
    confidence of the exit that served it."""

    cls: int | None = None
    exit: int = 0
    node: str = ""
    flags: int = 0
    confidence: float | None = None


class Refused(Exception):
    """The server answered with an error; ``code`` is its class (``overloaded``, ``http_503``, ...)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


class Transport(Protocol):
    name: str

    async def describe(self, address: str) -> list[TensorInfo]: ...

    def encode(self, x: np.ndarray, input_name: str) -> Any: ...

    async def call(self, address: str, body: Any) -> Answer: ...

    async def close(self) -> None: ...


def make_transport(name: str, timeout: float, model: str = "cis", binary: bool = False, curve: Any = None) -> Transport:
    """The transport called ``name``; ``model``: the model name of the Open Inference Protocol (``cis serve
    --model-name``); ``binary``: HTTP inputs as raw bytes; ``curve``: a CurveConfig for zmq."""
    if name == "zmq":
        return ZmqTransport(timeout, curve)
    if name == "http":
        return HttpTransport(timeout, model, binary)
    if name == "grpc":
        from cis.core.extras import require

        require("grpc", "--transport grpc")
        return GrpcTransport(timeout, model)
    raise CisError(f"--transport {name}: unknown; expected one of {', '.join(TRANSPORTS)}")


def sample_inputs(inputs: Sequence[TensorInfo], where: str, count: int = 16, seed: int = 0) -> np.ndarray:
    """``count`` samples of the one input ``inputs`` describes: standard normal floats, zero integers."""
    if len(inputs) != 1:
        raise CisError(f"{where}: the model takes {len(inputs)} inputs; expected one (give samples with --data)")
    t = inputs[0]
    dims = list(t.shape[1:])
    if any(d is None or d < 1 for d in dims):
        raise CisError(f"{where}: input {t.name!r} has shape {list(t.shape)}; its sample size is not fixed, "
                       "give samples with --data")  # fmt: skip
    dtype = np.dtype(t.dtype)
    shape = (count, *(int(d or 1) for d in dims))
    if dtype.kind == "f":
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def _first(values: Any) -> Any:
    return values[0] if isinstance(values, (list, tuple, np.ndarray)) and len(values) else values


def answer_of(outputs: dict[str, Any]) -> Answer:
    """An Answer from the outputs by name (lists or arrays of one sample each); a missing one stays unknown."""
    cls, conf, ex, node, flags = (_first(outputs.get(k)) for k in WANTED)
    return Answer(None if cls is None else int(cls), 0 if ex is None else int(ex),
                  "" if node is None else (str(node, "utf-8") if isinstance(node, bytes) else str(node)),
                  0 if flags is None else int(flags), None if conf is None else float(conf))  # fmt: skip


# ---------------------------------------------------------------- zmq


class ZmqTransport:
    """cis.Client per address, its socket's descriptor read by the loop."""

    name = "zmq"

    def __init__(self, timeout: float, curve: Any = None) -> None:
        import zmq

        self._zmq = zmq
        self.timeout, self.curve = timeout, curve
        self.clients: dict[str, Any] = {}
        self.pending: dict[tuple[str, int], asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self, address: str) -> Any:
        c = self.clients.get(address)
        if c is None:
            from cis.runtime.client import Client

            try:
                c = self.clients[address] = Client(address, timeout=self.timeout, curve=self.curve)
            except self._zmq.ZMQError as exc:
                raise CisError(f"{address}: not a ZeroMQ address ({exc}); expected tcp://HOST:PORT") from None
            if self._loop is not None:
                self._loop.add_reader(int(c.sock.getsockopt(self._zmq.FD)), self._drain, address)
        return c

    async def describe(self, address: str) -> list[TensorInfo]:
        try:
            status = self._client(address).status(min(self.timeout, 5.0))
        except TimeoutError:
            raise CisError(f"{address}: no node answers status; expected a running cis node (cis serve)") from None
        return [TensorInfo.from_json(t) for t in status.get("inputs") or []]

    def encode(self, x: np.ndarray, input_name: str) -> dict[str, np.ndarray]:
        from cis.runtime.client_checks import request_array

        return {input_name: request_array(x)}

    def _drain(self, address: str) -> None:
        """Read every reply waiting (ZeroMQ's descriptor is edge-triggered: read until nothing is left)."""
        for rid, res in self.clients[address].poll(0):
            fut = self.pending.pop((address, rid), None)
            if fut is None or fut.done():
                continue
            if res.error is not None:
                fut.set_exception(Refused(res.error.code, res.error.message))
            else:
                fut.set_result(Answer(int(res.cls[0]), int(res.exit[0]), res.served_by[0], int(res.flags[0]),
                                      float(res.confidence[0])))  # fmt: skip

    async def call(self, address: str, body: dict[str, np.ndarray]) -> Answer:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            for a, c in self.clients.items():
                self._loop.add_reader(c.sock.getsockopt(self._zmq.FD), self._drain, a)
        client = self._client(address)
        fut = self._loop.create_future()
        rid = client.submit(body)
        self.pending[(address, rid)] = fut
        self._drain(address)  # the send may have taken the descriptor's edge of a reply already here
        try:
            return await fut
        finally:
            self.pending.pop((address, rid), None)

    async def close(self) -> None:
        for c in self.clients.values():
            if self._loop is not None:
                self._loop.remove_reader(c.sock.getsockopt(self._zmq.FD))
            c.close()


# ---------------------------------------------------------------- http


_JSON = msgspec.json.Encoder()
_READ = msgspec.json.Decoder()


class HttpTransport:
    """The Open Inference Protocol over HTTP/1.1 on keep-alive connections of asyncio's streams."""

    name = "http"

    def __init__(self, timeout: float, model: str = "cis", binary: bool = False) -> None:
        self.timeout, self.model, self.binary = timeout, model, binary
        self.idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self.open: set[asyncio.StreamWriter] = set()

    async def describe(self, address: str) -> list[TensorInfo]:
        try:
            status, body = await asyncio.wait_for(
                self.request(address, "GET", f"/v2/models/{self.model}", b"", {}), min(self.timeout, 5.0))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise CisError(f"{address}: no model metadata ({type(exc).__name__}: {exc}); expected a node's HTTP front "
                           "door (cis serve --http-port)") from None  # fmt: skip
        if status != 200:
            raise CisError(f"{address}: GET /v2/models/{self.model} answered {status}; expected the model's metadata "
                           "(is the model name right? --model-name)")  # fmt: skip
        meta = _READ.decode(body)
        return [TensorInfo(t["name"], tuple(None if d < 0 else d for d in t["shape"]), DATATYPES[t["datatype"]])
                for t in meta.get("inputs", [])]  # fmt: skip

    def encode(self, x: np.ndarray, input_name: str) -> tuple[bytes, dict[str, str]]:
        """The request's body and headers (made once per sample)."""
        datatype = OIP_DATATYPE[str(x.dtype)]
        head: dict[str, Any] = {"name": input_name, "shape": list(x.shape), "datatype": datatype}
        outputs = [{"name": k} for k in WANTED]
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if not self.binary:
            head["data"] = x.ravel().tolist()
            return _JSON.encode({"inputs": [head], "outputs": outputs}), headers
        raw = np.ascontiguousarray(x, x.dtype.newbyteorder("<")).tobytes()
        head["parameters"] = {"binary_data_size": len(raw)}
        json_part = _JSON.encode({"inputs": [head], "outputs": outputs})
        headers = {"Inference-Header-Content-Length": str(len(json_part)), "Accept-Encoding": "identity"}
        return json_part + raw, headers

    async def call(self, address: str, body: tuple[bytes, dict[str, str]]) -> Answer:
        status, got = await self.request(address, "POST", f"/v2/models/{self.model}/infer", *body)
        if status != 200:
            raise Refused(*_http_error(status, got))
        reply = _READ.decode(got)
        return answer_of({o["name"]: o.get("data") for o in reply.get("outputs", [])})

    async def _connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        idle = self.idle.setdefault(address, [])
        if idle:
            return idle.pop()
        url = urlsplit(address if "://" in address else f"http://{address}")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise CisError(f"{address}: not an HTTP address; expected http://HOST:PORT or https://HOST:PORT")
        tls = ssl.create_default_context() if url.scheme == "https" else None
        reader, writer = await asyncio.open_connection(url.hostname, url.port or (443 if tls else 80), ssl=tls)
        self.open.add(writer)
        return reader, writer

    async def request(self, address: str, method: str, path: str, body: bytes, headers: dict[str, str]
                      ) -> tuple[int, bytes]:  # fmt: skip
        """One request on a keep-alive connection: (status, body). A connection whose exchange did not finish (a
        timeout cancelled it, the server closed it) is closed, never reused."""
        reader, writer = await self._connect(address)
        done = False
        try:
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            host = urlsplit(address if "://" in address else f"http://{address}").netloc
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{head}\r\n"
                         .encode() + body)  # fmt: skip
            status, keep, got = await _read_response(reader)
            done = keep
            return status, got
        finally:
            if done:
                self.idle.setdefault(address, []).append((reader, writer))
            else:
                self.open.discard(writer)
                writer.close()

    async def close(self) -> None:
        for w in self.open:
            w.close()
        self.open.clear()
        self.idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """(status, whether the connection stays open, body) of one HTTP/1.1 response."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await reader.readexactly(size + 2))
        await reader.readuntil(b"\r\n")
        body = b"".join(p[:-2] for p in parts)
    else:
        body = await reader.readexactly(int(fields.get("content-length", 0)))
    return status, fields.get("connection", "").lower() != "close", body


def _http_error(status: int, body: bytes) -> tuple[str, str]:
    """An HTTP error's (class, message): the JSON body's ``code`` and ``error`` (cis's front door), else
    ``http_STATUS``."""
    try:
        got = _READ.decode(body)
    except msgspec.DecodeError:
        got = None
    if isinstance(got, dict) and isinstance(got.get("code"), str):
        return got["code"], str(got.get("error", ""))
    return f"http_{status}", body[:200].decode("utf-8", "replace")


# ---------------------------------------------------------------- grpc


class GrpcTransport:
    """The Open Inference Protocol over gRPC (grpc.aio), one channel per address."""

    name = "grpc"
    SERVICE = "/inference.GRPCInferenceService/"

    def __init__(self, timeout: float, model: str = "cis") -> None:
        import grpc

        from cis.runtime.oip import grpc_messages as pb

        self.grpc, self.pb, self.timeout, self.model = grpc, pb, timeout, model
        self.channels: dict[str, Any] = {}
        self.infer: dict[str, Any] = {}

    def _channel(self, address: str) -> Any:
        if address not in self.channels:
            target = address.split("://", 1)[-1]
            ch = self.channels[address] = self.grpc.aio.insecure_channel(target)
            self.infer[address] = ch.unary_unary(self.SERVICE + "ModelInfer",
                                                 response_deserializer=self.pb.ModelInferResponse.FromString)
        return self.channels[address]

    async def describe(self, address: str) -> list[TensorInfo]:
        call = self._channel(address).unary_unary(
            self.SERVICE + "ModelMetadata", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.pb.ModelMetadataResponse.FromString)  # fmt: skip
        try:
            meta = await call(self.pb.ModelMetadataRequest(name=self.model), timeout=min(self.timeout, 5.0))
        except self.grpc.aio.AioRpcError as exc:
            raise CisError(f"{address}: ModelMetadata {self.model!r} failed ({exc.code().name}: {exc.details()}); "
                           "expected a cis node's gRPC door (cis serve --grpc-port)") from None  # fmt: skip
        return [TensorInfo(t.name, tuple(None if d < 0 else d for d in t.shape), DATATYPES[t.datatype])
                for t in meta.inputs]  # fmt: skip

    def encode(self, x: np.ndarray, input_name: str) -> bytes:
        """The ModelInferRequest, serialised once per sample."""
        req = self.pb.ModelInferRequest(model_name=self.model)
        t = req.inputs.add()
        t.name, t.datatype = input_name, OIP_DATATYPE[str(x.dtype)]
        t.shape.extend(x.shape)
        req.raw_input_contents.append(np.ascontiguousarray(x, x.dtype.newbyteorder("<")).tobytes())
        for k in WANTED:
            req.outputs.add().name = k
        return req.SerializeToString()

    async def call(self, address: str, body: bytes) -> Answer:
        if address not in self.infer:
            self._channel(address)
        try:
            reply = await self.infer[address](body, timeout=self.timeout)
        except self.grpc.aio.AioRpcError as exc:
            raise Refused(*_grpc_error(exc.code().name, exc.details() or "")) from None
        raw = list(reply.raw_output_contents)
        outputs = {o.name: _grpc_values(o, raw[i] if i < len(raw) else None) for i, o in enumerate(reply.outputs)}
        return answer_of(outputs)

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()


def _grpc_values(out: Any, raw: bytes | None) -> list:
    """An output's values: from its raw bytes (little-endian; BYTES as 4-byte lengths) or its typed contents."""
    if raw is None:
        field = {"BYTES": "bytes_contents", "INT64": "int64_contents", "FP32": "fp32_contents",
                 "UINT8": "uint_contents", "INT32": "int_contents"}.get(out.datatype)  # fmt: skip
        return list(getattr(out.contents, field)) if field else []
    if out.datatype == "BYTES":
        items, at = [], 0
        while at + 4 <= len(raw):
            (size,) = struct.unpack_from("<I", raw, at)
            items.append(raw[at + 4 : at + 4 + size])
            at += 4 + size
        return items
    return np.frombuffer(raw, np.dtype(DATATYPES[out.datatype]).newbyteorder("<")).tolist()


def _grpc_error(status: str, details: str) -> tuple[str, str]:
    """A gRPC error's (class, message): the cis code its details begin with (``overloaded: ...``), else the
    status's name in lower case (``unavailable``); a deadline that ran out is a ``timeout``."""
    code, sep, rest = details.partition(": ")
    if sep and code.replace("_", "").isalpha() and code.islower():
        return code, rest
    return ("timeout" if status == "DEADLINE_EXCEEDED" else status.lower()), details
