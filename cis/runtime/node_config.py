"""A node's settings, shared by its socket loop (:mod:`cis.runtime.node`) and its batch
executor (:mod:`cis.runtime.executor`). ``cis serve`` flags map onto these fields."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cis.core.errors import CisError

if TYPE_CHECKING:
    from cis.core.stages.backends import Backend

NONFINITE_MODES = ("refuse", "flag")
STAGE_THREADS = 1  # onnxruntime threads per stage (cis serve --threads)


@dataclass
class CurveConfig:
    """Curve settings of one process: its own key pair, the allow-list, the server key it talks to."""

    secret_file: str | None = None  # own .key_secret
    allow_dir: str | None = None  # folder of authorised public .key files (server side)
    server_public_file: str | None = None  # the parent's / server's public .key (client side)

    @property
    def enabled(self) -> bool:
        return self.secret_file is not None


@dataclass
class NodeConfig:
    node_id: str
    exit: int
    bind: str = "tcp://127.0.0.1:5555"
    parent: str | None = None  # parent's address (its replicas': separated by commas); None at the root
    threshold: float = -math.inf
    measure: str = "max_softmax"
    patience: int | None = None  # with measure "patience": p (the bundle's inference patience)
    max_transfer_rate: float = math.inf  # forwarded samples per second (token bucket)
    transfer_burst: float | None = None  # bucket depth in samples (default: 10 s of the cap, at least 1)
    max_batch: int = 32  # samples per micro-batch
    max_wait: float = 0.0  # seconds the oldest queued request may wait for company
    queue_limit: int = 1024  # samples admitted and waiting; beyond: "overloaded"; a bigger request: "too_many_samples"
    rcv_hwm: int = 64  # messages ZeroMQ may hold per peer before the node reads them (then TCP pushes back)
    rcv_buf: int = -1  # SO_RCVBUF of the ROUTER's connections in bytes; -1: the OS default (autotuned)
    forward_timeout: float = 1.0  # seconds a forward waits for the parent (per tier above)
    tiers_above: int = 1
    heartbeat: float = 0.2  # seconds between pings to the parent
    heartbeat_timeout: float = 0.0  # seconds without a pong before the parent counts as down; 0: max(1, 5 heartbeats)
    max_message_bytes: int = 64 << 20  # per message; also ZMQ_MAXMSGSIZE, the limit of each frame
    nonfinite: str = "refuse"  # "refuse": bad_input error; "flag": answer such samples here with flag 4
    adapt: bool = False
    adapt_target: float = 0.0  # target forwarded share
    adapt_gain: float = 0.05
    curve: CurveConfig = field(default_factory=CurveConfig)
    spin: bool = False  # busy-poll instead of sleeping in poll (a node that owns a core): no wake-up per message
    drain_timeout: float = 10.0  # seconds to finish in-flight work after SIGTERM
    restarts: int = 0  # how often the launcher restarted this node (shown by status)
    backend: Backend | None = None  # runs the stages (cis.core.stages.backends; None: stages given)
    parent_id: str | None = None  # the parent's node id (the build-info metric, logs); None at the root or unknown
    spans_file: str | None = None  # append the node's spans here ("{node}": its id); docs/runtime.md, Tracing
    otlp_endpoint: str | None = None  # export them over OTLP/HTTP (also the OTEL_EXPORTER_OTLP_* variables)
    bundle: str = ""  # the served bundle's folder, and the sha256 of its manifest (which lists every file's sha256)
    bundle_sha256: str = ""
    trust: str | None = None  # Ed25519 public key (PEM): a bundle it loads (at start, on reload) must be signed by it
    retire_after: float = 10.0  # reload: seconds a replaced bundle stays held after the last request named it
    name: str = ""  # the replica's id (cloud#1; cis.core.replicas) in logs, status, metrics; "": the node id

    def __post_init__(self) -> None:
        self.name = self.name or self.node_id
        if not self.heartbeat_timeout:
            self.heartbeat_timeout = heartbeat_timeout(self.heartbeat)
        if self.nonfinite not in NONFINITE_MODES:
            raise CisError(f"nonfinite is {self.nonfinite!r}; expected one of {', '.join(NONFINITE_MODES)}")
        for name in LIMITS:
            expected = setting_expected(name, getattr(self, name))
            if expected is not None:
                raise CisError(f"node {self.node_id}: {name} is {getattr(self, name)!r}; expected {expected}")

    @property
    def parents(self) -> tuple[str, ...]:
        """The parent's address, or each of its replicas' (docs/runtime.md, *Replicas*); () at the root."""
        return tuple(a.strip() for a in (self.parent or "").split(",") if a.strip())


def _seconds(v: Any) -> bool:
    return math.isfinite(v) and v > 0


SECONDS = "a finite number of seconds > 0"
# the settings a node cannot work with outside a range: field -> (holds, what is expected); cis serve checks its
# flags, variables and --config keys by the same rules (cis.cli.commands.serve_config), before any node starts
C_INT_MAX = 2**31 - 1  # ZMQ_RCVHWM and ZMQ_RCVBUF are C ints; ZMQ_MAXMSGSIZE an int64 (pyzmq overflows beyond)
INT64_MAX = 2**63 - 1
LIMITS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{name: (lambda v: v >= 1, "an integer >= 1") for name in ("max_batch", "queue_limit")},
    "rcv_hwm": (lambda v: 1 <= v <= C_INT_MAX, f"an integer >= 1, at most {C_INT_MAX} (a C int)"),
    "max_message_bytes": (lambda v: 1 <= v <= INT64_MAX, f"an integer >= 1, at most {INT64_MAX} (an int64)"),
    "rcv_buf": (lambda v: -1 <= v <= C_INT_MAX, f"bytes >= 0, or -1 (the OS's); at most {C_INT_MAX} (a C int)"),
    "max_wait": (lambda v: math.isfinite(v) and v >= 0, "a finite number of seconds >= 0 (0: run when idle)"),
    "forward_timeout": (_seconds, SECONDS),
    "heartbeat": (_seconds, SECONDS),
}


def setting_expected(name: str, value: Any) -> str | None:
    """What NodeConfig field ``name`` must be, where ``value`` is not that (NaN never is); None where it is, or
    where the field has no rule in :data:`LIMITS`."""
    rule = LIMITS.get(name)
    try:
        return None if rule is None or rule[0](value) else rule[1]
    except TypeError:  # not a number at all
        return rule[1] if rule is not None else None


def heartbeat_timeout(heartbeat: float) -> float:
    """Seconds without a pong before the parent counts as down, when not set: five heartbeats, at least 1 s."""
    return max(1.0, 5 * heartbeat)


def node_default(name: str) -> Any:
    """NodeConfig's default of field ``name``: what cis serve and cis simulate default to as well."""
    return {f.name: f.default for f in dataclasses.fields(NodeConfig)}[name]
