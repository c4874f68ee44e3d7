"""A null Open Inference Protocol endpoint: what the load generator costs on its own.

    python -m bench.peers.null_oip --port 8080

Answers every request (any path, any method) with one canned infer response of the size cis's front door
answers (``class``, ``confidence``, ``exit``, ``flags``, ``node``, in JSON), reading each request whole
(httptools, keep-alive, pipelining in order) and computing nothing. Driven like the real servers, its p50 is
the floor of every HTTP p50 here (the client, the loopback and one parse) and its largest rate the ceiling
the load generator can offer on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httptools

BODY = json.dumps({
    "model_name": "cis", "model_version": "1", "parameters": {"node": "cloud", "degraded": 0, "capped": 0},
    "outputs": [
        {"name": "class", "datatype": "INT64", "shape": [1], "data": [3]},
        {"name": "confidence", "datatype": "FP32", "shape": [1], "data": [0.5]},
        {"name": "exit", "datatype": "INT32", "shape": [1], "data": [3]},
        {"name": "flags", "datatype": "UINT8", "shape": [1], "data": [0]},
        {"name": "node", "datatype": "BYTES", "shape": [1], "data": ["cloud"]},
    ],
}).encode()  # fmt: skip
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)


class Null(asyncio.Protocol):
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Null, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
