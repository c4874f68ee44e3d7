"""Bare echo servers, the floor under each front door (bench/front_door.py): what the transport alone costs.

    python -m bench.transport_echo grpc|zeromq PORT

``grpc``: a grpcio server (the same library and thread pool model as the node's gRPC door) with one unary
method ``/echo.Echo/Echo`` that returns the request's bytes; ``zeromq``: a pyzmq ROUTER socket (as a node binds)
that sends every message back. Neither decodes anything: the difference of the two is what grpcio costs per call
over ZeroMQ on this machine, before any cis code runs.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

METHOD = "/echo.Echo/Echo"


def serve_grpc(port: int) -> None:
    import grpc

    handler = grpc.method_handlers_generic_handler(
        "echo.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server = grpc.server(ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def serve_zeromq(port: int) -> None:
    import zmq

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    while True:
        sock.send_multipart(sock.recv_multipart(copy=False), copy=False)


if __name__ == "__main__":
    {"grpc": serve_grpc, "zeromq": serve_zeromq}[sys.argv[1]](int(sys.argv[2]))
