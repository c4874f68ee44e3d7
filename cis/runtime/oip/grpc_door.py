"""The gRPC front door of a node: the Open Inference Protocol's ``inference.GRPCInferenceService``.

``cis serve ... --grpc-port PORT``. grpcio runs the server on its own threads (its C core
does the HTTP/2, TLS and flow control; slow or half-sent messages never reach Python).
A ModelInfer handler decodes the request (:mod:`cis.runtime.oip.codec`), puts a ticket in the
door's inbox and wakes the node's loop through a socket pair the loop polls; the node's
own thread takes the ticket into its normal path (:meth:`cis.runtime.node.Node.admit`),
and its answer wakes the waiting handler. So every count and every decision is made on the
node's thread, as for a ZeroMQ request. ServerLive, ServerReady, ServerMetadata,
ModelMetadata and ModelReady are answered by the handler itself. The gRPC deadline of a
call becomes the request's deadline. Messages: :mod:`cis.runtime.oip.grpc_messages` (generated from
grpc_predict_v2.proto; tritonclient is never needed).
"""

from __future__ import annotations

import collections
import hmac
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from cis.core.errors import CisError
from cis.runtime.oip import codec, door
from cis.runtime.oip import grpc_messages as pb
from cis.runtime.oip.door import DoorConfig, Ticket
from cis.runtime.requests import Request

WORKERS = 64  # handler threads: RPCs waiting for the node at once
MAX_RPCS = 1024  # RPCs accepted at once (waiting for a thread included); beyond: RESOURCE_EXHAUSTED
POLL = 0.5  # seconds between a waiting handler's looks at whether its caller is still there
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


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
        if raw:
            tensors[t.name] = codec.from_bytes(raw[i], meta, shape)
        else:
            field = CONTENTS.get(meta.datatype)
            if field is None:
                raise codec.OipError("bad_tensor", f"input {t.name!r}: {meta.datatype} goes in raw_input_contents")
            tensors[t.name] = codec.from_data(getattr(t.contents, field), meta, shape)
    return codec.request(model, tensors, request.id, [o.name for o in request.outputs])


def response(model: codec.Model, req: codec.InferRequest, cls, conf, ex, flags, served_by, logits=None) -> Any:
    """The ModelInferResponse of an answer: every requested output in ``raw_output_contents``."""
    out = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=req.id or "")
    for key, value in codec.parameters(model.node, flags).items():
        if type(value) is str:
            out.parameters[key].string_param = value
        else:
            out.parameters[key].int64_param = value
    for name, values in codec.output_arrays(req.outputs, cls, conf, ex, flags, served_by, logits):
        out.outputs.add(name=name, datatype=codec.OUTPUTS[name], shape=codec.shape_of(values))
        out.raw_output_contents.append(codec.to_bytes(name, values))
    return out


class GrpcDoor:
    """The gRPC front door of one node (see the module's docstring); :meth:`open` binds it."""

    def __init__(self, model: codec.Model, cfg: DoorConfig, workers: int = WORKERS) -> None:
        self.model, self.cfg, self.workers = model, cfg, workers
        self.node: Any = None
        self.server: Any = None
        self.url = ""
        self.token = ("Bearer " + cfg.token).encode() if cfg.token else None
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

    # ------------------------------------------------------------ the node's side (door.Door)

    def open(self, node: Any) -> None:
        self.node = node
        host = self.cfg.bind_host
        options = [("grpc.max_receive_message_length", self.cfg.max_body), ("grpc.so_reuseport", 0)]
        server = grpc.server(
            ThreadPoolExecutor(self.workers, thread_name_prefix="cis-grpc"),
            options=options,
            maximum_concurrent_rpcs=MAX_RPCS,
        )
        names = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                getattr(self, name),
                request_deserializer=getattr(pb, name + "Request").FromString,
                response_serializer=getattr(pb, name + "Response").SerializeToString,
            )
            for name in names
        }
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(pb.SERVICE, handlers)])
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
                f"node {node.cfg.node_id!r}: cannot serve gRPC on {address}; pick another --grpc-port (0: a free one)"
            )
        server.start()
        self.server = server
        self.url = door.url("grpc", host, port).removeprefix("grpc://")  # what gRPC clients take: HOST:PORT
        door.announce("grpc", node.cfg.node_id, self.url, self.cfg, self.model.name)

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
        return now + 3600.0

    def result(self, ticket: Ticket, req: Request) -> None:
        call = ticket.handle
        call.answer = ("ok", *door.result_arrays(req), req.served_by, req.logits)
        call.done.set()

    def error(self, ticket: Ticket, code: str, message: str) -> None:
        call = ticket.handle
        call.answer = ("error", code, message)
        call.done.set()

    def close(self) -> None:
        self.closed = True
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

    def _auth(self, context: Any) -> None:
        if self.token is None:
            return
        given = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(given.encode() if isinstance(given, str) else given, self.token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata authorization)")

    def _check(self, name: str, version: str, context: Any) -> None:
        try:
            self.model.check(name, version or None)
        except codec.OipError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, exc.message)

    def serving(self) -> bool:
        node = self.node
        return node is not None and not node.stopping and node.executor.stage_ok

    def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 (the protocol's names)
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.serving())

    def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._auth(context)
        self._check(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=self.serving())

    def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._auth(context)
        return pb.ServerMetadataResponse(**codec.server_metadata())

    def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._auth(context)
        self._check(request.name, request.version, context)
        meta = self.model.metadata()
        out = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for t in self.model.inputs:
            out.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        for t in self.model.outputs:
            out.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        return out

    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._auth(context)
        self._check(request.model_name, request.model_version, context)
        call = _Call()
        ticket = Ticket(self, call, None)
        try:
            ticket.request = req = decode(request, self.model)
        except codec.OipError as exc:
            self._post(ticket, (exc.code, exc.message))
            return self._answer(call, context, None)
        left = context.time_remaining()
        if left is not None and left < 1e6:
            req.timeout = max(left, 1e-6)
        trace = dict(context.invocation_metadata()).get("traceparent")
        req.traceparent = trace if isinstance(trace, str) else None
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

