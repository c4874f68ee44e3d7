"""The gRPC front door of a node: the Open Inference Protocol's ``inference.GRPCInferenceService``.

``cis serve ... --grpc-port PORT``. grpcio runs the server on its own threads (its C core
does the HTTP/2, TLS and flow control; slow or half-sent messages never reach Python).
A ModelInfer handler decodes the request (:mod:`cis.runtime.oip.codec`), puts a ticket in the
door's inbox and wakes the node's loop through a socket pair the loop polls; the node's
own thread takes the ticket into its normal path (:meth:`cis.runtime.node.Node.admit`),
and its answer wakes the waiting handler. So every count and every decision is made on the
node's thread, as for a ZeroMQ request. ServerLive, ServerReady, ServerMetadata,
ModelMetadata, ModelReady, ModelConfig and ModelStatistics are answered by the handler itself,
and so is the standard health service (``grpc.health.v1.Health``: Check and Watch, SERVING while
the node serves). The gRPC deadline of a call becomes the request's deadline. Messages:
:mod:`cis.runtime.oip.grpc_messages` (generated from grpc_predict_v2.proto; tritonclient is never needed).

Bounded before anything is authenticated (docs/runtime.md, *Limits of the front door*): the bearer
token is checked by a server interceptor from the call's metadata, before grpcio reads the message
(a call without it is refused by a handler that never reads its request); a message is at most
``--door-max-request-bytes`` (grpcio's receive limit), at most :data:`READERS` ModelInfer messages are
read at once, and the bytes of the calls not yet answered are taken from the node's doors' byte budget.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cis.core.errors import CisError
from cis.runtime.oip import codec, door, triton
from cis.runtime.oip import grpc_messages as pb
from cis.runtime.oip.door import Budget, DoorConfig, DoorNode, Ticket
from cis.runtime.requests import Request

WORKERS = 64  # handler threads: RPCs waiting for the node at once
MAX_RPCS = 1024  # RPCs accepted at once (waiting for a thread included); beyond: RESOURCE_EXHAUSTED
POLL = 0.5  # seconds between a waiting handler's looks at whether its caller is still there
READERS = 8  # ModelInfer messages read at once (each up to --door-max-request-bytes)
TICK = 0.5  # seconds between looks at whether the node serves (the health service's status)
OPEN = ("/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady")  # no token
HEALTH = "/grpc.health.v1.Health/"  # no token either: a load balancer probes it
NAMES = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics")
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


class _Health(health.HealthServicer):
    """The standard health service; Check answers from the node's state when asked: NOT_SERVING from the moment
    the node stops (its status for Watch follows the door's ticks, which the node runs at once when it stops)."""

    def __init__(self, serving: Callable[[], bool]) -> None:
        super().__init__()
        self._serving = serving

    def Check(self, request: Any, context: Any) -> Any:
        reply = super().Check(request, context)
        if reply.status == health_pb2.HealthCheckResponse.SERVING and not self._serving():
            reply.status = health_pb2.HealthCheckResponse.NOT_SERVING
        return reply


class _Call:
    """A ModelInfer handler waiting for the node's answer."""

    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.answer: tuple | None = None
        self.done = threading.Event()


def decode(request: Any, model: codec.Model) -> codec.InferRequest:
    """A ModelInferRequest as an InferRequest: ``raw_input_contents`` (one per input) or typed ``contents``."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise codec.OipError(
            "bad_message", f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; expected one per input"
        )
    tensors: dict[str, np.ndarray] = {}
    for i, t in enumerate(request.inputs):
        shape = list(t.shape)
        meta = codec.input_meta(model, t.name, t.datatype, shape, tensors)
        if raw and t.HasField("contents"):
            raise codec.OipError("bad_tensor", f"input {t.name!r}: both contents and raw_input_contents; give one")
        if raw:
            tensors[t.name] = codec.from_bytes(raw[i], meta, shape)
        else:
            field = CONTENTS.get(meta.datatype)
            if field is None:
                raise codec.OipError("bad_tensor", f"input {t.name!r}: {meta.datatype} goes in raw_input_contents")
            tensors[t.name] = codec.from_data(getattr(t.contents, field), meta, shape)
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items() if v.ListFields()}
    timeout = codec.timeout_of(params)  # Triton's "timeout" parameter (what tritonclient's infer(timeout=) sends)
    return codec.request(model, tensors, request.id, [o.name for o in request.outputs], timeout)


def response(model: codec.Model, req: codec.InferRequest, cls, conf, ex, flags, served_by, logits=None) -> Any:
    """The ModelInferResponse of an answer: every requested output in ``raw_output_contents``."""
    out = pb.ModelInferResponse(model_name=model.name, model_version=req.version or model.version, id=req.id or "")
    for key, value in codec.parameters(model.node, flags).items():
        if type(value) is str:
            out.parameters[key].string_param = value
        else:
            out.parameters[key].int64_param = value
    for name, values in codec.output_arrays(req.outputs, cls, conf, ex, flags, served_by, logits):
        out.outputs.add(name=name, datatype=codec.OUTPUTS[name], shape=codec.shape_of(values))
        out.raw_output_contents.append(codec.to_bytes(name, values))
    return out


class _TokenGate(grpc.ServerInterceptor):
    """Checks the bearer token from a call's metadata before grpcio reads its message: a call without it gets a
    handler that refuses it without reading a byte of its request (a request-streaming one, whose messages are
    read only when asked for)."""

    def __init__(self, door: GrpcDoor, token: bytes) -> None:
        self.door, self.token = door, token
        self.deny = grpc.stream_unary_rpc_method_handler(self._deny)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        method = details.method
        if method in OPEN or method.startswith(HEALTH):
            return continuation(details)
        given = dict(details.invocation_metadata or ()).get("authorization")
        if door.bearer(given, self.token):
            return continuation(details)
        self.door.count("token")
        return self.deny

    @staticmethod
    def _deny(requests: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata authorization)")


class _Unparsed:
    """A request message that does not parse: its handler answers INVALID_ARGUMENT with this message (a
    deserializer that raised would make grpcio answer INTERNAL and log a traceback)."""

    __slots__ = ("message",)

    def __init__(self, cls: Any, exc: Exception) -> None:
        name = cls.DESCRIPTOR.full_name
        self.message = f"bad_message: the request is not a serialized {name} ({exc})"


def _parser(cls: Any) -> Any:
    """``cls.FromString``, giving an :class:`_Unparsed` for bytes that do not parse."""

    def parse(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            return _Unparsed(cls, exc)

    return parse


def _parsed(handler: Any) -> Any:
    """``handler``, answering INVALID_ARGUMENT to a message that did not parse."""

    def run(request: Any, context: Any) -> Any:
        if isinstance(request, _Unparsed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return handler(request, context)

    return run


_PARSE_INFER = _parser(pb.ModelInferRequest)


def _sized(raw: bytes) -> tuple[int, Any]:
    """A ModelInfer message (or :class:`_Unparsed`) and its size (what it holds of the doors' budget)."""
    return len(raw), _PARSE_INFER(raw)


class GrpcDoor:
    """The gRPC front door of one node (see the module's docstring); :meth:`open` binds it."""

    kind = "grpc"

    def __init__(self, model: codec.Model, cfg: DoorConfig, budget: Budget | None = None, workers: int = WORKERS):
        self.model, self.cfg, self.workers = model, cfg, workers
        self.node: DoorNode  # its node, from open()
        self.server: Any = None
        self.url = ""
        self.token = cfg.token.encode() if cfg.token else None
        self.budget = budget if budget is not None else Budget(cfg.max_buffered)
        self.refused: collections.Counter = collections.Counter()  # reason -> calls
        self.calls = 0  # ModelInfer calls in progress
        self.lock = threading.Lock()  # refused and calls, from grpcio's threads
        self.readers = threading.BoundedSemaphore(READERS)
        self.health = _Health(self.serving)
        self.serves: bool | None = None  # what the health service says now
        self.credentials = None
        if cfg.cert:
            try:
                with open(cfg.cert, "rb") as c, open(str(cfg.key), "rb") as k:
                    self.credentials = grpc.ssl_server_credentials([(k.read(), c.read())])
            except OSError as exc:
                raise CisError(f"--grpc-tls-cert {cfg.cert}, --grpc-tls-key {cfg.key}: cannot read ({exc})") from None
        self.inbox: collections.deque[tuple[Ticket, tuple[str, str] | None]] = collections.deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.armed = False
        self.closed = False

    @property
    def connections(self) -> int:
        return self.calls

    def count(self, reason: str) -> None:
        with self.lock:
            self.refused[reason] += 1

    # ------------------------------------------------------------ the node's side (door.Door)

    def open(self, node: DoorNode) -> None:
        self.node = node
        host = self.cfg.bind_host
        options = [("grpc.max_receive_message_length", self.cfg.max_body), ("grpc.so_reuseport", 0)]
        server = grpc.server(
            ThreadPoolExecutor(self.workers, thread_name_prefix="cis-grpc"),
            options=options,
            maximum_concurrent_rpcs=MAX_RPCS,
            interceptors=[_TokenGate(self, self.token)] if self.token is not None else [],
        )
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(pb.SERVICE, self._handlers())])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self._health_now()
        address = f"[{host}]:{self.cfg.port}" if ":" in host else f"{host}:{self.cfg.port}"
        try:
            port = (
                server.add_secure_port(address, self.credentials)
                if self.credentials is not None
                else server.add_insecure_port(address)
            )
        except RuntimeError:
            port = 0
        if not port:
            raise CisError(
                f"node {node.cfg.name!r}: cannot serve gRPC on {address}; pick another --grpc-port (0: a free one)"
            )
        server.start()
        self.server = server
        self.url = door.url("grpc", host, port).removeprefix("grpc://")  # what gRPC clients take: HOST:PORT
        door.announce("grpc", node.cfg.name, self.url, self.cfg, self.model.name)

    def _handlers(self) -> dict[str, Any]:
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                _parsed(getattr(self, name)),
                request_deserializer=_parser(getattr(pb, name + "Request")),
                response_serializer=getattr(pb, name + "Response").SerializeToString,
            )
            for name in NAMES
        }
        handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(  # its message is read when the handler asks
            self.ModelInfer, request_deserializer=_sized, response_serializer=pb.ModelInferResponse.SerializeToString
        )
        return handlers

    def fileno(self) -> int:
        return self.wake_r.fileno()

    def on_ready(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        self.armed = False
        inbox, node = self.inbox, self.node
        while inbox:
            ticket, refusal = inbox.popleft()
            if refusal is not None:
                door.refuse(node, ticket, *refusal)
            else:
                door.submit(node, ticket)

    def tick(self, now: float) -> float:
        self._health_now()
        return now + TICK

    def _health_now(self) -> None:
        """The health service says SERVING while the node serves (as ServerReady), NOT_SERVING otherwise."""
        serves = self.serving()
        if serves != self.serves:
            self.serves = serves
            status = health_pb2.HealthCheckResponse.SERVING if serves else health_pb2.HealthCheckResponse.NOT_SERVING
            for service in ("", pb.SERVICE):
                self.health.set(service, status)

    def result(self, ticket: Ticket, req: Request) -> None:
        call = ticket.handle
        if ticket.request is not None:
            ticket.request.version = door.answered_by(req, ticket.request.version)
        call.answer = ("ok", *door.result_arrays(req), req.served_by, req.logits)
        call.done.set()

    def error(self, ticket: Ticket, code: str, message: str) -> None:
        call = ticket.handle
        call.answer = ("error", code, message)
        call.done.set()

    def close(self) -> None:
        self.closed = True
        self.health.enter_graceful_shutdown()
        if self.server is not None:
            self.server.stop(grace=1.0).wait(5)
        self.wake_r.close()
        self.wake_w.close()

    # ------------------------------------------------------------ the handlers (grpcio's threads)

    def _post(self, ticket: Ticket, refusal: tuple[str, str] | None = None) -> None:
        """Hand a ticket to the node's thread: the inbox, then one wake-up byte unless one is on its way."""
        self.inbox.append((ticket, refusal))
        if not self.armed:
            self.armed = True
            try:
                self.wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # full: the loop is awake already; closed: the node stops

    def _check(self, name: str, version: str, context: Any) -> list[str]:
        """The versions the node holds, once ``name`` and ``version`` are known to be its model's."""
        versions = door.versions(self.node)
        try:
            self.model.check(name, version or None, versions)
        except codec.OipError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
        return versions

    def serving(self) -> bool:
        node = self.node
        return node is not None and not node.stopping and node.executor.stage_ok

    def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 (the protocol's names)
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.serving())

    def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=self.serving())

    def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerMetadataResponse(**codec.server_metadata())

    def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        versions = self._check(request.name, request.version, context)
        out = pb.ModelMetadataResponse(name=self.model.name, versions=versions, platform=codec.PLATFORM)
        for t in self.model.inputs:
            out.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        for t in self.model.outputs:
            out.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        return out

    def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        versions = self._check(request.name, request.version, context)
        config = json_format.ParseDict(triton.config(self.model, self.node, versions), pb.ModelConfig())
        return pb.ModelConfigResponse(config=config)

    def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        versions = self._check(request.name, request.version, context)
        named = request.version if request.version not in ("", codec.VERSION) else versions[-1]  # 1: the newest
        stats = triton.statistics(self.model, self.node, named)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    def ModelInfer(self, requests: Any, context: Any) -> Any:  # noqa: N802
        """Read the call's one message (at most READERS at once), hold its bytes in the budget until answered."""
        if not self.readers.acquire(timeout=self.cfg.timeout):
            self.count("readers")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"over {READERS} messages being read; retry later")
        try:
            size, request = next(requests, (0, None))
        finally:
            self.readers.release()
        if request is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad_message: the call carries no ModelInferRequest")
        if isinstance(request, _Unparsed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        if not self.budget.take(size):
            self.count("max_buffered_bytes")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"overloaded: {self.budget.refusal(size)}")
        with self.lock:
            self.calls += 1
        try:
            return self._infer(request, context)
        finally:
            self.budget.give(size)
            with self.lock:
                self.calls -= 1

    def _infer(self, request: Any, context: Any) -> Any:
        versions = self._check(request.model_name, request.model_version, context)
        call = _Call()
        ticket = Ticket(self, call, None, request.id or None)
        try:
            ticket.request = req = decode(request, self.model)
        except codec.OipError as exc:
            self._post(ticket, (exc.code, exc.message))
            return self._answer(call, context, None)
        left = context.time_remaining()
        if left is not None and left < 1e6:
            req.timeout = max(min(left, req.timeout or left), 1e-6)
        metadata = context.invocation_metadata()
        req.traceparent = door.trace_context(dict(metadata).get("traceparent"))
        req.tracestate = door.trace_state(req.traceparent, [v for k, v in metadata if k == "tracestate"])
        req.version = versions[-1]
        self._post(ticket)
        return self._answer(call, context, req)

    def _answer(self, call: _Call, context: Any, req: codec.InferRequest | None) -> Any:
        while not call.done.wait(POLL):
            if self.closed or not context.is_active():
                context.abort(grpc.StatusCode.UNAVAILABLE, "the node stopped before it answered")
        answer = call.answer
        assert answer is not None
        if answer[0] == "error":
            _, code, message = answer
            context.abort(getattr(grpc.StatusCode, codec.GRPC_STATUS.get(code, "INTERNAL")), f"{code}: {message}")
        assert req is not None
        return response(self.model, req, *answer[1:])
