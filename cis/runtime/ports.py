"""Free TCP ports for addresses that are planned before anything binds them.

``bind(0)`` hands out a port from the kernel's ephemeral range (``ip_local_port_range``,
32768-60999 on Linux), the range every outgoing connection on the host also takes its
local port from. Between the moment a planner learns such a port and the moment its
server binds it, any ``connect()`` may take it: CI saw a node of ``cis serve --all``
fail with "address already in use" while Ray and a load generator were opening
connections beside it. So a planned port is drawn below the ephemeral range (from
:data:`PLANNED_LOW` up), where only an explicit bind can take it; it is tested free by
binding it, and this process never hands the same port out twice. Where the range cannot
be read (not Linux) or leaves no room below it, the kernel's ``bind(0)`` is used.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

PLANNED_LOW = 20000  # Ray's workers take 10002-19999 by default; below that, common service ports
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
TRIES = 200
_handed_out: set[tuple[str, int]] = set()


def ephemeral_range() -> tuple[int, int] | None:
    """(low, high) of the kernel's ephemeral ports, or None where it cannot be read."""
    try:
        low, high = (int(v) for v in EPHEMERAL_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def planned_range(ephemeral: tuple[int, int] | None) -> range | None:
    """The ports to draw from: [PLANNED_LOW, ephemeral low), or None when fewer than 1000 are there."""
    if ephemeral is None or ephemeral[0] - PLANNED_LOW < 1000:
        return None
    return range(PLANNED_LOW, ephemeral[0])


def pick_port(
    candidates: range | None,
    is_free: Callable[[int], bool],
    kernel_port: Callable[[], int],
    taken: set[int],
    rng: random.Random,
) -> int:
    """A port of ``candidates`` that ``is_free`` and not in ``taken``; ``kernel_port()`` when there are no
    candidates or none of TRIES draws was free."""
    if candidates is not None:
        for _ in range(TRIES):
            port = rng.choice(candidates)
            if port not in taken and is_free(port):
                return port
    while True:
        port = kernel_port()
        if port not in taken:
            return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now, outside the ephemeral range where the host allows it."""
    taken = {p for h, p in _handed_out if h == host}
    port = pick_port(
        planned_range(ephemeral_range()),
        lambda p: _bindable(host, p),
        lambda: _kernel_port(host),
        taken,
        random.Random(),
    )
    _handed_out.add((host, port))
    return port
