"""What the executor works on: a request and the samples of a forward, and the two interfaces
around it (a stage that runs, an outbox that sends). No sockets here; see :mod:`cis.runtime.executor`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cis.core.stages.contract import LOGITS
from cis.runtime.feeds import TensorSpec
from cis.runtime.wire import FLAG_NONFINITE, VERSION


class Stage(Protocol):
    """What a node needs of a stage: its tensor contract and a way to run it."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass
class BundleStage:
    """A bundle stage (manifest contract) run by :class:`cis.core.stages.runner.StageRunner`."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    runner: Any

    def __post_init__(self) -> None:
        self.run = self.runner.run  # type: ignore[method-assign]  # one call less per stage

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feeds)


class Request:
    """One request (a client's INFER or a child's FORWARD) while the node works on it.

    ``cls``, ``conf``, ``exit``, ``flags`` (arrays of N) and ``served_by`` (N node ids) hold its
    answer once it is complete; they are allocated only for a request answered in parts. ``logits``
    (N, C) float32, the answering exit's, only for a request that asked for them (``want_logits``).
    ``version``: the :class:`cis.runtime.versions.Version` (bundle) it was admitted with, which answers
    all of it; ``v``: the protocol version it came in, which its reply speaks."""

    __slots__ = (
        "prefix",
        "req_id",
        "stage",
        "feeds",
        "n",
        "t0",
        "deadline",
        "route",
        "forward",
        "bad",
        "cls",
        "conf",
        "exit",
        "flags",
        "served_by",
        "remaining",
        "answered",
        "trace",
        "want_logits",
        "logits",
        "version",
        "v",
    )

    def __init__(
        self,
        prefix: Sequence[bytes],
        req_id: int,
        stage: int,
        feeds: dict[str, np.ndarray],
        n: int,
        t0: float,
        deadline: float | None = None,
        route: Sequence[str] = (),
        forward: bool = False,
        bad: np.ndarray | None = None,
        trace: Any = None,
        want_logits: bool = False,
        version: Any = None,
        v: int = VERSION,
    ):
        self.prefix, self.req_id, self.stage, self.feeds, self.n = prefix, req_id, stage, feeds, n
        self.t0 = t0  # monotonic seconds when the request reached the node (status latencies start here)
        self.deadline, self.route, self.forward, self.bad = deadline, route, forward, bad
        self.cls: Any = None
        self.conf: Any = None
        self.exit: Any = None
        self.flags: Any = None
        self.served_by: Any = None
        self.remaining = n
        self.answered = False
        self.trace = trace  # cis.runtime.tracing.Trace: only a request with a trace context, or at a tracing node
        self.want_logits = want_logits
        self.logits: Any = None  # (N, C) float32 once answered, when want_logits
        self.version, self.v = version, v

    def fill(self, idx: np.ndarray | None, cls, conf, ex, flags, served_by: str | Sequence[str], logits=None) -> bool:
        """Answer samples ``idx`` (None: all of them; the arrays are then the answer as they are), with ``logits``
        (their rows) when the request wants them; True once every sample has its answer."""
        m = self.n if idx is None else len(idx)
        if m == self.n and self.remaining == self.n:  # the whole request at once: no copies
            self.cls, self.conf, self.exit, self.flags = cls, conf, ex, flags
            self.served_by = [served_by] * m if type(served_by) is str else list(served_by)
            if self.want_logits:
                self.logits = logits
        else:
            if self.cls is None:
                self.cls, self.conf = np.zeros(self.n, np.int64), np.zeros(self.n, np.float32)
                self.exit, self.flags = np.zeros(self.n, np.int32), np.zeros(self.n, np.uint8)
                self.served_by = np.full(self.n, "", object)
            at = slice(None) if idx is None else idx
            self.cls[at], self.conf[at], self.exit[at], self.flags[at] = cls, conf, ex, flags
            self.served_by[at] = served_by if type(served_by) is str else np.array(served_by, object)
            if self.want_logits and logits is not None:
                if self.logits is None:
                    self.logits = np.full((self.n, logits.shape[-1]), np.nan, np.float32)
                self.logits[at] = logits
        self.remaining -= m
        if self.remaining:
            return False
        if type(self.served_by) is np.ndarray:
            self.served_by = self.served_by.tolist()
        return True


class Pending:
    """Samples forwarded to the parent, with this node's own answer kept as the fallback.
    ``parts``: (request, its samples: an index array, or None for all of them), in carry order;
    ``logits``: this node's logits of those samples when a request among them wants logits (else None:
    then the forward does not ask the parent for any); ``version``: the bundle whose carry goes up (the
    forward names it, and only an answer of that bundle fills the samples)."""

    __slots__ = ("parts", "cls", "conf", "logits", "n", "deadline", "expires", "version")

    def __init__(
        self,
        parts: list[tuple[Request, np.ndarray | None]],
        cls: np.ndarray,
        conf: np.ndarray,
        logits: np.ndarray | None = None,
        version: Any = None,
    ):
        self.parts, self.cls, self.conf, self.logits, self.version = parts, cls, conf, logits, version
        self.n = len(cls)
        deadlines = [req.deadline for req, _ in parts if req.deadline]
        self.deadline = min(deadlines) if deadlines else None
        self.expires = math.inf  # set by whoever sends it


def exit_logits(
    last: np.ndarray, seen: Mapping[int, np.ndarray], exit_at: np.ndarray | None, keep: np.ndarray | None
) -> np.ndarray:
    """The logits of the exit that answers each sample, float32 (N, C): ``last`` (the node's exit, for the
    samples still in the batch) unless ``exit_at`` names an earlier exit here (the patience rule), whose rows
    come from ``seen`` (stage -> logits of the batch's first samples: those that had joined by that stage;
    ``keep``: the batch's samples still in it)."""
    out = np.asarray(last, np.float32)
    if exit_at is None or not seen:
        return out
    copied, own = False, max(seen)  # the node's exit: its rows are ``last`` already
    for k, lg in seen.items():
        if k == own:
            continue
        if keep is not None:
            lg = lg[keep[: len(lg)]]
        rows = np.flatnonzero(exit_at[: len(lg)] == k)
        if len(rows):
            if not copied:
                out, copied = np.array(out, np.float32), True
            out[rows] = lg[rows]
    return out


def parent_logits(tensors: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The logits of a parent's result for a forward whose own logits have ``shape``; NaN rows where the parent
    sent none (a node of an older version ignores ``want_logits``) or of another shape."""
    got = tensors.get(LOGITS)
    if got is None or got.shape != shape:
        return np.full(shape, np.nan, np.float32)
    return got


def forward_route(parts: Sequence[tuple[Request, np.ndarray | None]], node_id: str) -> tuple[list[str], bool]:
    """The ``route`` of a forward of ``parts`` from ``node_id`` (every node that ran stages for its samples, once,
    in order), and whether a trace context goes up with them."""
    if len(parts) == 1:
        route = parts[0][0].route
        return (list(route) if node_id in route else [*route, node_id]), parts[0][0].trace is not None
    route = list(dict.fromkeys([r for req, _ in parts for r in req.route] + [node_id]))
    return route, any(req.trace is not None for req, _ in parts)


def flag_nonfinite(order: Sequence[Request], over: np.ndarray | None, serve, cls, conf, flags, lg) -> tuple:
    """(serve, cls, conf, flags, logits, samples flagged) with nonfinite="flag"'s samples (non-finite input, or
    outputs that overflowed: ``over``) answered here: class -1, confidence NaN, flag 4, never forwarded."""
    bad = over
    if any(req.bad is not None for req in order):
        given = np.concatenate([req.bad if req.bad is not None else np.zeros(req.n, bool) for req in order])
        bad = given if bad is None else bad | given
    if bad is None:
        return serve, cls, conf, flags, lg, 0
    serve = None if serve is None else serve | bad
    cls, conf = np.where(bad, -1, cls), np.where(bad, np.float32(np.nan), conf)
    flags = np.where(bad, np.uint8(FLAG_NONFINITE), flags)
    if lg is not None:
        lg = np.where(bad[:, None], np.float32(np.nan), lg)
    return serve, cls, conf, flags, lg, int(np.count_nonzero(bad))


def rows_of(lg: np.ndarray | None, at: Any) -> np.ndarray | None:
    return None if lg is None else lg[at]


def split(
    order: list[Request], serve: np.ndarray
) -> tuple[list[tuple[Request, np.ndarray | None]], list[tuple[Request, int, np.ndarray | None]]]:
    """(what goes up: (request, its samples, None for all), what is answered here: (request, its first row,
    its samples, None for all)), in sample order, from the batch's ``serve`` mask."""
    parts: list[tuple[Request, np.ndarray | None]] = []
    here: list[tuple[Request, int, np.ndarray | None]] = []
    start = 0
    for req in order:
        end = start + req.n
        up = np.flatnonzero(~serve[start:end])
        if len(up) == req.n:
            parts.append((req, None))
        elif len(up):
            parts.append((req, up))
            here.append((req, start, np.flatnonzero(serve[start:end])))
        else:
            here.append((req, start, None))
        start = end
    return parts, here


class Outbox(Protocol):
    @property
    def parent_up(self) -> bool: ...

    def reply(self, req: Request) -> None: ...

    def error(self, req: Request, code: str, message: str) -> None: ...

    def forward(self, pending: Pending, carry: dict[str, np.ndarray]) -> bool:
        """Send the carry to the parent; False when it cannot go (then the executor serves it here)."""
