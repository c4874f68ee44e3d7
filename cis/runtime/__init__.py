"""The ZeroMQ runtime: protocol codec, node, client, launcher, CurveZMQ helpers.

``build_node(bundle, node_id, ...)`` makes a :class:`Node` from a verified
bundle; ``Client`` talks to any node. See docs/runtime.md and docs/protocol.md.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from cis.errors import CisError
from cis.logs import event
from cis.runtime.config import STAGE_THREADS

log = logging.getLogger(__name__)


def build_node(
    bundle: Any,
    node_id: str,
    spec: Any = None,
    bind: str | None = None,
    parent: str | None = None,
    threshold: float | None = None,
    transfer_cap: bool = True,
    **options: Any,
):
    """A :class:`cis.runtime.node.Node` for ``node_id`` serving ``bundle`` (a path or a loaded Bundle).

    The spec (default: the bundle's) gives the node's exit, parent, transfer cap,
    queue limit, provider and addresses; ``bind``/``parent`` override the addresses and
    ``threshold`` the bundle policy's threshold; ``provider`` (cpu, cuda, tensorrt, auto;
    see cis.backends) the spec's. ``options`` go to NodeConfig.
    """
    from cis.bundle import Bundle, load_bundle
    from cis.rates import compute_rates
    from cis.runtime.node import BundleStage, Node, NodeConfig

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)  # verifies every file's sha256 before any stage is loaded
    spec = spec or bundle.spec
    if spec is None:
        raise CisError(f"{bundle.root}: bundle has no spec; pass --spec")
    node = spec.node(node_id)
    if node.exit > bundle.num_exits:
        raise CisError(f"node {node_id!r}: exit {node.exit} but the bundle has {bundle.num_exits} stages")
    try:
        indices = [k for k in bundle.stages_for_node(node_id) if k <= node.exit]
    except CisError:
        indices = list(range(1, node.exit + 1))
    if node.exit not in indices:
        indices = list(range(1, node.exit + 1))
    patience = bundle.policy.patience if bundle.policy is not None and bundle.policy.uses_patience else None
    if threshold is None:
        if node.parent is None or patience is not None:  # the root serves all; patience uses no threshold
            threshold = -math.inf
        elif bundle.policy is not None and node_id in bundle.policy.thresholds:
            threshold = bundle.policy.thresholds[node_id]
        else:
            raise CisError(f"node {node_id!r}: the bundle's policy has no threshold for it; pass --threshold")
    if parent is None and node.parent is not None:
        parent = spec.node(node.parent).address
        if parent is None:
            raise CisError(f"node {node_id!r}: parent {node.parent!r} has no address in the spec; pass --parent")
    bind = bind or node.address
    if bind is None:
        raise CisError(f"node {node_id!r}: no address in the spec; pass --bind (e.g. tcp://127.0.0.1:5555)")
    rates = compute_rates(spec)
    inc = rates.incoming[node_id]
    target = rates.transfer_rate[node_id] / inc if inc > 0 else 0.0
    from cis.backends import node_provider, open_stages, refusal
    from cis.stages import ProviderError

    threads = options.pop("threads", STAGE_THREADS)
    provider, source = node_provider(node, options.pop("provider", None))
    try:
        runners, backend = open_stages(bundle, indices, provider, threads)
    except ProviderError as exc:
        raise refusal(node_id, exc, source) from None
    if backend.note:  # auto fell back to the CPU: said once, at start
        event(log, logging.WARNING, "provider_fallback", f"node {node_id}: {backend.note}", node=node_id)
    stages = {k: BundleStage(bundle.stage(k).inputs, bundle.stage(k).outputs, r) for k, r in runners.items()}
    options.setdefault("measure", bundle.policy.measure if bundle.policy else spec.confidence)
    if options["measure"] == "patience":
        options.setdefault("patience", patience)
    if node.queue_limit is not None:
        options.setdefault("queue_limit", node.queue_limit)
    cfg = NodeConfig(
        node_id=node_id,
        exit=node.exit,
        bind=bind,
        parent=parent if node.parent is not None else None,
        threshold=float(threshold),
        max_transfer_rate=node.max_transfer_rate if transfer_cap else math.inf,
        tiers_above=max(1, spec.depth(node_id)),
        adapt_target=target,
        backend=backend,
        parent_id=node.parent,
        bundle=str(bundle.root),
        bundle_sha256=bundle.sha256,
        **options,
    )
    return Node(cfg, stages)


def __getattr__(name: str):
    if name == "Client":
        from cis.runtime.client import Client

        return Client
    raise AttributeError(name)
