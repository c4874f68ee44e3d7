"""The ranges of ``cis serve``'s options: a value of the right kind that cannot work (a heartbeat of 0, a NaN
threshold, port 99999) is one line naming the flag, the variable or the --config key, before any node starts.

A node option's range is NodeConfig's own (:data:`cis.runtime.node_config.LIMITS`), so ``cis serve``, ``cis serve
--all`` and the Python API refuse the same values; the options that only ``cis serve`` has are here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from cis.core.policy.threshold_range import THRESHOLD_EXPECTED, is_threshold
from cis.core.replicas import MAX_PORT
from cis.runtime.addresses import PORT_EXPECTED, port_fits
from cis.runtime.node_config import SECONDS, setting_expected

PORT = (lambda v: 0 <= v <= MAX_PORT, f"a port 0 (a free one) to {MAX_PORT}")
ADDRESSES = (lambda v: all(port_fits(a) for a in v.split(",")), PORT_EXPECTED)  # --parent: one per replica
BIND = (ADDRESSES[0], f"{PORT_EXPECTED}, or 0 (a free one)")  # a bind may ask for a free port
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {  # option -> (holds, what is expected)
    "threshold": (is_threshold, THRESHOLD_EXPECTED),
    "metrics_port": PORT,
    "http_port": PORT,
    "grpc_port": PORT,
    "bind": BIND,
    "parent": ADDRESSES,
    # the front doors' limits (docs/runtime.md, *Limits of the front door*)
    "http_timeout": (lambda v: math.isfinite(v) and v > 0, SECONDS),
    "http_head_timeout": (lambda v: math.isfinite(v) and v > 0, SECONDS),
    **{name: (lambda v: v >= 1, "an integer >= 1") for name in ("http_max_connections", "http_max_json_bytes",
                                                                "door_max_request_bytes", "door_max_buffered_bytes")},
}


def expected(name: str, value: Any) -> str | None:
    """What option ``name`` must be, where ``value`` (already of the option's kind) is not that; else None."""
    if name in RULES:
        holds, wanted = RULES[name]
        return None if holds(value) else wanted
    return setting_expected(name, value)
