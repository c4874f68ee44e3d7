"""The node factory: a :class:`cis.runtime.node.Node` for one node of a spec, serving a verified bundle.

    node = build_node("bundle", "device0")   # the spec inside the bundle, its thresholds, its addresses
    node.run()

The spec gives the node's exit, parent, transfer cap, queue limit, provider and
addresses; the bundle its stages and its exit policy; ``cis serve`` flags override
any of them (:mod:`cis.cli.commands.serve_config`). The node can load another
bundle later (``node.updates``, :mod:`cis.runtime.updates`) through
:func:`load_version`, with the same spec, threshold override, provider and trusted key.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

from cis.core.bundle import Bundle, load_bundle
from cis.core.errors import CisError
from cis.core.logs import event
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.rates import compute_rates
from cis.core.replicas import split_replica_id
from cis.core.spec import CisSpec
from cis.core.spec import Node as SpecNode
from cis.runtime.node import BundleStage, Node
from cis.runtime.node_config import STAGE_THREADS, NodeConfig
from cis.runtime.versions import Version

log = logging.getLogger(__name__)


def build_node(
    bundle: Bundle | str,
    node_id: str,
    spec: CisSpec | None = None,
    bind: str | None = None,
    parent: str | None = None,
    threshold: float | None = None,
    transfer_cap: bool = True,
    **options: Any,
) -> Node:
    """A :class:`Node` for ``node_id`` serving ``bundle`` (a path or a loaded Bundle).

    ``node_id`` names a replica (``cloud#1``) of a node with replicas (:mod:`cis.core.replicas`).
    The spec (default: the bundle's) gives the node's exit, parent, transfer cap (shared by its replicas),
    queue limit, provider and addresses; ``bind``/``parent`` override the addresses and
    ``threshold`` the bundle policy's threshold; ``provider`` (cpu, cuda, tensorrt, auto;
    see cis.core.stages.backends) the spec's. ``options`` go to NodeConfig.
    """
    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)  # verifies every file's sha256 before any stage is loaded
    spec = spec or bundle.spec
    if spec is None:
        raise CisError(f"{bundle.root}: bundle has no spec; pass --spec")
    node, index, name = _replica(spec, node_id)
    node_id = node.id
    given = threshold
    threshold = fit(bundle, spec, node_id, threshold)
    bind, parent = _addresses(spec, node, index, bind, parent)
    provider, threads = options.pop("provider", None), options.pop("threads", STAGE_THREADS)
    stages, backend = _open_stages(bundle, node, provider, threads, name)
    _policy_options(bundle, spec, options)
    if node.queue_limit is not None:
        options.setdefault("queue_limit", node.queue_limit)
    rates = compute_rates(spec)
    incoming = rates.incoming[node_id]
    cfg = NodeConfig(
        node_id=node_id,
        exit=node.exit,
        bind=bind,
        parent=parent,
        threshold=float(threshold),
        max_transfer_rate=node.max_transfer_rate / node.replicas if transfer_cap else math.inf,
        tiers_above=max(1, spec.depth(node_id)),
        adapt_target=rates.transfer_rate[node_id] / incoming if incoming > 0 else 0.0,
        backend=backend,
        parent_id=node.parent,
        bundle=str(bundle.root),
        bundle_sha256=bundle.sha256,
        name=name,
        **options,
    )
    built = Node(cfg, stages)
    built.updates.threshold = given  # in its status: cis rollout checks a new bundle's fit with it too
    built.updates.loader = functools.partial(load_version, spec=spec, node_id=node_id, threshold=given,
                                             provider=provider, threads=threads, trust=cfg.trust,
                                             name=name)  # fmt: skip
    return built


def fit(bundle: Bundle, spec: CisSpec, node_id: str, threshold: float | None = None) -> float:
    """The threshold ``node_id`` of ``spec`` serves ``bundle`` with; :class:`CisError` (one line) when the bundle
    does not fit the node: fewer stages than its exit, or no threshold for it (and none given)."""
    node = spec.node(node_id)
    if node.exit > bundle.num_exits:
        raise CisError(f"node {node_id!r}: exit {node.exit} but the bundle has {bundle.num_exits} stages")
    if spec.num_exits != bundle.num_exits:  # its root would answer at an exit before the model's last
        raise CisError(
            f"spec {spec.name!r}: {spec.num_exits} exits, but the bundle has {bundle.num_exits} stages (one per "
            "exit); expected a spec of the bundle's exits (the one it was exported for: 'cis inspect BUNDLE')"
        )
    held = (bundle.manifest.get("nodes") or {}).get(node_id) or {}
    if threshold is None and node.parent is not None and held.get("exit") not in (None, node.exit):
        raise CisError(
            f"node {node_id!r}: exit {node.exit} in the spec, but the bundle's threshold for it was calibrated at "
            f"exit {held['exit']}; expected a bundle exported for this spec ('cis export RUN --spec SPEC'), or "
            "'cis serve --threshold T' for this node"
        )
    return _threshold(bundle, node, threshold)


def load_version(
    path: str,
    spec: CisSpec,
    node_id: str,
    threshold: float | None = None,
    provider: str | None = None,
    threads: int = STAGE_THREADS,
    trust: str | None = None,
    name: str | None = None,
) -> Version:
    """The bundle at ``path`` as a :class:`Version` that node ``node_id`` of ``spec`` can hold beside its own:
    verified first (its signature by ``trust``, then every file's sha256), checked to fit the node, its stages
    opened on the node's provider, its policy with the bundle's threshold for the node (or ``threshold``).
    ``name``: the replica's id in log lines (the node id where None)."""
    bundle = load_bundle(path, trust=trust)
    node = spec.node(node_id)
    threshold = fit(bundle, spec, node_id, threshold)
    stages, _ = _open_stages(bundle, node, provider, threads, name)
    options: dict[str, Any] = {}
    _policy_options(bundle, spec, options)
    policy = ExitPolicy(options["measure"], {node_id: float(threshold)}, options.get("patience"))
    return Version(bundle.id, stages, policy, node.exit, str(bundle.root), bundle.sha256)


def _replica(spec: CisSpec, name: str) -> tuple[SpecNode, int, str]:
    """(the spec node, the replica's index, its id) of ``name``: a node id, or a replica id such as cloud#1."""
    try:
        node_id, index = split_replica_id(name)
    except ValueError as exc:
        raise CisError(f"--node {exc}") from None
    node = spec.node(node_id)
    ids = node.replica_ids
    if index is None and node.replicas > 1 or index is not None and name not in ids:
        raise CisError(f"node {node_id!r} runs as {node.replicas} replica{'s' if node.replicas > 1 else ''}: "
                       f"{', '.join(ids)}; expected one of those, not {name!r}")
    return node, index or 0, name


def _addresses(
    spec: CisSpec, node: SpecNode, index: int, bind: str | None, parent: str | None
) -> tuple[str, str | None]:
    """(the address replica ``index`` of the node binds, its parent's: the addresses of all the parent's
    replicas, separated by commas; None at the root): the spec's unless given."""
    if node.parent is None:
        parent = None
    elif parent is None:
        where = spec.node(node.parent).replica_addresses
        if where is None:
            raise CisError(f"node {node.id!r}: parent {node.parent!r} has no address in the spec; pass --parent")
        parent = ",".join(where)
    addresses = node.replica_addresses
    bind = bind or (addresses[index] if addresses else None)
    if bind is None:
        raise CisError(f"node {node.id!r}: no address in the spec; pass --bind (e.g. tcp://127.0.0.1:5555)")
    return bind, parent


def _threshold(bundle: Bundle, node: SpecNode, threshold: float | None) -> float:
    """The node's threshold: given, else the bundle policy's; -inf where none applies (the root serves
    everything; a policy without thresholds, FLAME's patience, decides otherwise)."""
    if threshold is not None:
        return threshold
    policy = bundle.policy
    if node.parent is None or (policy is not None and not policy.thresholded):
        return -math.inf
    if policy is not None and node.id in policy.thresholds:
        return policy.thresholds[node.id]
    raise CisError(
        f"node {node.id!r}: the bundle's policy has no threshold for it; expected a bundle exported for this spec "
        "('cis export RUN --spec SPEC'), or 'cis serve --threshold T' for this node"
    )


def _policy_options(bundle: Bundle, spec: CisSpec, options: dict[str, Any]) -> None:
    """The bundle policy's measure (and its patience, for that measure), unless the options name one."""
    policy = bundle.policy
    options.setdefault("measure", policy.measure if policy else spec.confidence)
    if policy is not None and policy.patience is not None and options["measure"] == policy.measure:
        options.setdefault("patience", policy.patience)


def _open_stages(
    bundle: Bundle, node: SpecNode, provider: str | None, threads: int, name: str | None = None
) -> tuple[dict, Any]:
    """The node's stages 1..E_i on the provider that runs them here: ({k: stage}, the backend)."""
    from cis.core.stages.backends import node_provider, open_stages, refusal
    from cis.core.stages.runner import ProviderError

    try:
        indices = [k for k in bundle.stages_for_node(node.id) if k <= node.exit]
    except CisError:
        indices = list(range(1, node.exit + 1))
    if node.exit not in indices:
        indices = list(range(1, node.exit + 1))
    chosen, source = node_provider(node, provider)
    try:
        runners, backend = open_stages(bundle, indices, chosen, threads)
    except ProviderError as exc:
        raise refusal(node.id, exc, source) from None
    if backend.note:  # auto fell back to the CPU: said once, at start
        who = name or node.id  # a replica's id (cloud#1), as every log line of the process
        event(log, logging.WARNING, "provider_fallback", f"node {who}: {backend.note}", node=who)
    return {k: BundleStage(bundle.stage(k).inputs, bundle.stage(k).outputs, r) for k, r in runners.items()}, backend
