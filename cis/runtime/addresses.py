"""ZeroMQ addresses as people type them: one line, not a ZeroMQ traceback, for one that cannot work.

ZeroMQ refuses an address without a transport (``127.0.0.1:5555``, ``http://...``) with ``EINVAL`` at
``connect``, and takes a TCP port past 65535 modulo 65536 (``tcp://127.0.0.1:99999`` is port 34463), so
the check of the port is ours. :func:`connect` is the one connect of a node's link to its parent
(:mod:`cis.runtime.upstream`); a client's entry nodes (:mod:`cis.runtime.entries`) say the same line.
"""

from __future__ import annotations

import zmq

from cis.core.errors import CisError
from cis.core.replicas import MAX_PORT

EXPECTED = "tcp://HOST:PORT"
PORT_EXPECTED = f"tcp://HOST:PORT, PORT 1 to {MAX_PORT}"


def port_fits(address: str) -> bool:
    """False for a TCP address whose port is past 65535; True otherwise (not TCP: ZeroMQ judges)."""
    _, colon, port = address.strip().rpartition(":")
    return not (address.strip().startswith("tcp://") and colon and port.isdigit() and int(port) > MAX_PORT)


def connect(sock: zmq.Socket, address: str, where: str = "") -> None:
    """``sock.connect(address)``; for an address ZeroMQ refuses, or whose TCP port is past 65535, the socket is
    closed and :class:`CisError` says so in one line (``where`` first: ``node edge0: parent ``)."""
    problem = f"port past {MAX_PORT}; expected {PORT_EXPECTED}"
    if address.strip().startswith("tcp://") and address.strip().rpartition(":")[2] == "0":
        problem = f"port 0 (a free port is for binding, not connecting); expected {PORT_EXPECTED}"
    elif port_fits(address):
        try:
            sock.connect(address)
            return
        except zmq.ZMQError as exc:  # '127.0.0.1:5555' (no scheme), 'http://...'
            problem = f"not a ZeroMQ address ({zmq.strerror(exc.errno or 0)}); expected {EXPECTED}"
    sock.close(0)
    raise CisError(f"{where}{address}: {problem}")


def check_port_run(port: int | None, count: int, what: str) -> None:
    """One line where ``count`` processes, process i on ``port`` + i, would pass port 65535 (0 or None: free ports
    or none, fine)."""
    if port and port + count - 1 > MAX_PORT:
        raise CisError(f"{what} {port}: process i of {count} gets port {port}+i, up to {port + count - 1}, past "
                       f"{MAX_PORT}; expected a port up to {MAX_PORT - count + 1} (or 0: a free port each)")
