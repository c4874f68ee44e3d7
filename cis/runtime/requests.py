"""What the executor works on: a request and the samples of a forward, and the two interfaces
around it (a stage that runs, an outbox that sends). No sockets here; see :mod:`cis.runtime.executor`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cis.runtime.feeds import TensorSpec


class Stage(Protocol):
    """What a node needs of a stage: its tensor contract and a way to run it."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass
class BundleStage:
    """A bundle stage (manifest contract) run by :class:`cis.stages.StageRunner`."""

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
    answer once it is complete; they are allocated only for a request answered in parts."""

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


class Pending:
    """Samples forwarded to the parent, with this node's own answer kept as the fallback.
    ``parts``: (request, its samples: an index array, or None for all of them), in carry order."""

    __slots__ = ("parts", "cls", "conf", "n", "deadline", "expires")

    def __init__(self, parts: list[tuple[Request, np.ndarray | None]], cls: np.ndarray, conf: np.ndarray):
        self.parts, self.cls, self.conf = parts, cls, conf
        self.n = len(cls)
        deadlines = [req.deadline for req, _ in parts if req.deadline]
        self.deadline = min(deadlines) if deadlines else None
        self.expires = math.inf  # set by whoever sends it


class Outbox(Protocol):
    @property
    def parent_up(self) -> bool: ...

    def reply(self, req: Request) -> None: ...

    def error(self, req: Request, code: str, message: str) -> None: ...

    def forward(self, pending: Pending, carry: dict[str, np.ndarray]) -> bool:
        """Send the carry to the parent; False when it cannot go (then the executor serves it here)."""
