"""The bundles a node holds: one :class:`Version` per bundle, each with its own stages and exit policy.

A node answers new client requests with one bundle, the *current* one, and may hold others while a
model is updated (docs/runtime.md, *Updating a model*): parents hold the old and the new bundle
until no child sends the old one. A request keeps the version it was admitted with until it is
answered, and a forward names its version's bundle, so a carry is only ever continued by the bundle
that made it (docs/protocol.md, *Bundle identity*). A version that is no longer current is
*retiring* once told so (``drop``, or a ``reload`` that switched away from it): it is dropped when
no request of it is queued or forwarded and none named it for its quiet period.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cis.core.policy.exit_policy import ExitPolicy
from cis.core.stages.contract import LOGITS
from cis.runtime.feeds import FeedContract
from cis.runtime.requests import Stage


class Version:
    """One bundle as a node runs it: ``id`` (its :attr:`cis.core.bundle.Bundle.id`; "" for stages given
    without a bundle), ``stages`` 1..exit, its ``policy``, and what the executor precomputes from them."""

    __slots__ = (
        "id",
        "path",
        "sha256",
        "stages",
        "policy",
        "carry_names",
        "contracts",
        "input_names",
        "wire",
        "active",
        "named_at",
        "retire_after",
    )

    def __init__(
        self,
        bundle_id: str,
        stages: Mapping[int, Stage],
        policy: ExitPolicy,
        exit: int,
        path: str = "",
        sha256: str = "",
    ):
        if exit not in stages:
            raise ValueError(f"bundle {bundle_id or '(none)'}: no stage {exit} (the node's exit)")
        self.id, self.path, self.sha256 = bundle_id, path, sha256
        self.stages = dict(stages)
        self.policy = policy
        self.carry_names = [t.name for t in self.stages[exit].outputs if t.name != LOGITS]
        runs = [k for k in sorted(self.stages) if k <= exit]  # entry stages this node accepts
        self.contracts = {k: FeedContract(self.stages[k].inputs, policy.state_names) for k in runs}
        self.input_names = {k: [t.name for t in self.stages[k].inputs] for k in runs}
        self.wire = {"bundle": bundle_id} if bundle_id else {}  # the header field of its forwards
        self.active = 0  # requests admitted with this version and not answered yet (queued or forwarded)
        self.named_at = -math.inf  # monotonic time a request last named this bundle
        self.retire_after: float | None = None  # retiring: dropped once unused and not named for this many s


class Versions:
    """The versions a node holds, in the order they were loaded (newest last), and the current one."""

    def __init__(self, first: Version):
        self.held: dict[str, Version] = {first.id: first}
        self.current = first

    @property
    def ids(self) -> list[str]:
        return list(self.held)

    def add(self, version: Version) -> Version:
        """Hold ``version`` beside the others (the one already held, when its bundle is held)."""
        held = self.held.setdefault(version.id, version)
        held.retire_after = None if held is self.current else held.retire_after
        return held

    def switch(self, bundle_id: str) -> Version:
        """New client requests go to this held bundle; the previous current one stays held."""
        v = self.held[bundle_id]
        v.retire_after, self.current = None, v
        return v

    def retire(self, bundle_id: str, after: float = 0.0, now: float = 0.0) -> None:
        """Drop this held bundle (not the current one) once no request of it is left and none named it for
        ``after`` seconds (counted from ``now`` at the latest: a child that still sends it has that long)."""
        v = self.held[bundle_id]
        v.retire_after, v.named_at = after, max(v.named_at, now)

    def sweep(self, now: float) -> list[Version]:
        """Drop the retiring versions that nothing uses any more; the dropped ones."""
        gone = [
            v
            for v in self.held.values()
            if v.retire_after is not None and v is not self.current and not v.active
            and now - v.named_at >= v.retire_after
        ]  # fmt: skip
        for v in gone:
            del self.held[v.id]
        return gone

    @property
    def retiring(self) -> bool:
        return any(v.retire_after is not None for v in self.held.values())

    def describe(self) -> list[dict]:
        """Each held bundle for ``status``: id, folder, state (current, held, retiring), requests in work."""
        return [
            {
                "id": v.id,
                "path": v.path,
                "state": "current" if v is self.current else ("held" if v.retire_after is None else "retiring"),
                "requests": v.active,
            }
            for v in self.held.values()
        ]
