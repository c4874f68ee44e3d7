"""What each node does with a request: how long its stages take, how many bytes
it forwards, and whether it keeps a request (the exit policy).

All pure functions of the spec, the config and (optionally) the bundle; the
SimPy model only looks the answers up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cis.core.bundle import Bundle
from cis.core.errors import BundleError, CisError
from cis.core.policy.exit_policy import ExitPolicy, calibrate_thresholds
from cis.core.rates import compute_rates
from cis.core.spec import CisSpec, Node


@dataclass(frozen=True)
class Profile:
    """The bundle's validation confidence profile: per sample and exit, confidence and correctness."""

    confidence: np.ndarray  # (N, E) float
    correct: np.ndarray  # (N, E) bool
    predicted: np.ndarray | None = None  # (N, E) class per exit: what the patience rule counts on

    @property
    def samples(self) -> int:
        return self.confidence.shape[0]


def bundle_profile(bundle: Bundle, num_exits: int) -> Profile:
    """Read and check the confidence profile against the spec's number of exits."""
    where = f"bundle {bundle.root}: profiles/confidence.npz"
    try:
        conf, correct = bundle.confidence_profile()
    except (OSError, KeyError, ValueError) as exc:
        raise CisError(
            f"{where}: cannot read ({exc.__class__.__name__}: {exc}); expected arrays 'confidence' and 'correct'"
        ) from None
    if conf.ndim != 2 or conf.shape != correct.shape or conf.shape[0] == 0:
        raise CisError(
            f"{where}: confidence {conf.shape} and correct {correct.shape}; expected two equal (N, E) arrays with N "
            ">= 1"
        )
    if conf.shape[1] != num_exits:
        raise CisError(f"{where}: {conf.shape[1]} exits; expected {num_exits} (the spec's [cis] exits)")
    if not np.isfinite(conf).all():
        raise CisError(f"{where}: confidence has NaN or inf; expected finite values")
    predicted = bundle.predicted_profile()
    if predicted is not None and predicted.shape != conf.shape:
        raise CisError(f"{where}: predicted {predicted.shape}; expected {conf.shape} like confidence")
    return Profile(conf, correct, predicted)


def bundle_stage_profiles(bundle: Bundle, num_exits: int, backend: str = "cpu") -> list[dict[int, float]]:
    """Per stage 1..E, seconds per call by batch size on ``backend`` on the exporting machine (speed 1)."""
    where = f"bundle {bundle.root}: profiles/latency.json"
    try:
        profile = bundle.latency_profile(backend)
    except BundleError as exc:
        raise CisError(str(exc)) from None
    except (OSError, KeyError, ValueError, AttributeError) as exc:
        raise CisError(
            f'{where}: cannot read ({exc.__class__.__name__}: {exc}); expected {{"stages": {{stage: {{batch: '
            f'seconds}}}}}}'
        ) from None
    return check_stage_profiles(profile, num_exits, f"{where} ({backend})")


def check_stage_profiles(profile: dict, num_exits: int, where: str) -> list[dict[int, float]]:
    """``{stage: {batch: seconds}}`` as a list over stages 1..E, each with a batch-1 time, all seconds >= 0."""
    out = []
    for stage in range(1, num_exits + 1):
        points = profile.get(stage, {})
        t = points.get(1)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in points.values())
        if t is None or not numbers or not all(np.isfinite(v) and v >= 0 for v in points.values()):
            raise CisError(
                f"{where}: stage {stage} has batch-1 time {t!r}; expected seconds >= 0 for every stage 1..{num_exits} "
                "and batch size"
            )
        out.append({int(b): float(v) for b, v in points.items()})
    return out


def node_backend(node: Node) -> str:
    """The latency profile a node's stages take: its spec provider; ``auto`` and none are simulated as cpu."""
    return node.provider if node.provider in ("cuda", "tensorrt") else "cpu"


def node_stage_profiles(spec: CisSpec, bundle: Bundle) -> dict[str, list[dict[int, float]]]:
    """Per node, the stage profiles of the backend its ``provider`` picks (cis serve --provider)."""
    by_backend: dict[str, list[dict[int, float]]] = {}
    out = {}
    for n in spec.nodes:
        backend = node_backend(n)
        if backend not in by_backend:
            try:
                by_backend[backend] = bundle_stage_profiles(bundle, spec.num_exits, backend)
            except CisError as exc:
                raise CisError(
                    f"{exc}; node {n.id!r} has provider {n.provider!r}: export the bundle on a machine with that "
                    "backend (cis export --trt for tensorrt), or simulate the node with provider cpu"
                ) from None
        out[n.id] = by_backend[backend]
    return out


def bundle_payloads(bundle: Bundle, num_exits: int) -> dict[int, int]:
    """Bytes forwarded after each stage: the carry outputs, in the bundle's feature dtype."""
    if bundle.num_exits < num_exits:
        raise CisError(
            f"bundle {bundle.root}: {bundle.num_exits} stages; expected {num_exits} (the spec's [cis] exits)"
        )
    return {k: bundle.stage(k).carry_bytes_per_sample() for k in range(1, num_exits + 1)}


def batch_seconds(points: dict[int, float], max_batch: int) -> list[float]:
    """Seconds of one stage on a batch of n, for n = 0..max_batch, from its profiled batch sizes.

    Linear between the profiled sizes; beyond the largest, at the slope of the last
    segment (one profiled size: in proportion to n). Index 0 is 0 (no batch)."""
    sizes = sorted(points)
    times = [points[b] for b in sizes]
    out = [0.0]
    for n in range(1, max_batch + 1):
        if len(sizes) == 1:
            out.append(times[0] * n / sizes[0])
        elif n <= sizes[-1]:
            out.append(float(np.interp(n, sizes, times)))
        else:
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            out.append(times[-1] + slope * (n - sizes[-1]))
    return out


def stage_tables(
    spec: CisSpec, profiles: dict[str, list[dict[int, float]]], max_batch: int
) -> dict[str, list[list[float]]]:
    """Per node and stage 1..E_i, seconds of a batch of n (index n) at the node's ``speed``."""
    return {
        n.id: [[t / n.speed for t in batch_seconds(profiles[n.id][k], max_batch)] for k in range(n.exit)]
        for n in spec.nodes
    }


def bundle_carries(bundle: Bundle, num_exits: int, policy: ExitPolicy | None) -> dict[int, dict[str, np.ndarray]]:
    """Per stage k < E, one sample of the carry that leaves stage k, with the policy's state (patience's)."""
    out = {}
    for k in range(1, num_exits):
        carry = {
            t.name: np.zeros((1, *(int(d or 1) for d in t.shape[1:])), t.dtype)
            for t in bundle.stage(k).outputs
            if t.name != "logits"
        }
        if policy is not None:
            carry.update(policy.fresh_state(1))
        out[k] = carry
    return out


def tcp_messages(spec: CisSpec, carries: dict[int, dict[str, np.ndarray]]) -> tuple[dict[int, int], int]:
    """What the runtime puts on a TCP link: per stage k, a one-sample FORWARD of ``carries[k]``; and a
    one-sample RESULT. Each as the wire carries it (:func:`cis.sim.links.wire_bytes`): the message's frames
    (header and tensors, by :mod:`cis.runtime.protocol`), ZeroMQ's frame prefixes, TCP segments."""
    from cis.runtime import protocol as P
    from cis.sim.links import wire_bytes

    route = [n.id for n in spec.path_to_root(max(spec.nodes, key=lambda n: spec.depth(n.id)).id)]
    messages = {
        k: wire_bytes(_zmtp(P.encode(P.FORWARD, 2**40, carry, stage=k + 1, deadline=2e9, route=route, sender=route[0],
                                     bundle=_BUNDLE)))
        for k, carry in carries.items()
    }
    one = np.zeros(1)
    result = P.result_frames(
        2**40, 1, one.astype(np.int64), one.astype(np.float32), one.astype(np.int32), one.astype(np.uint8),
        route[:1], route[-1], bundle=_BUNDLE,
    )
    return messages, wire_bytes(_zmtp(result))


_BUNDLE = "0" * 16  # a bundle id: every forward and result names one (docs/protocol.md, *Bundle identity*)


def _zmtp(frames: list) -> int:
    """Bytes of a multipart message in ZeroMQ's wire format: a 2-byte prefix per frame (9 above 255 bytes)."""
    sizes = [memoryview(f).nbytes for f in frames]
    return sum(s + (2 if s < 256 else 9) for s in sizes)


def bundle_policy(
    spec: CisSpec, bundle: Bundle, profile: Profile, calibrate: bool, seed: int, threshold: float | None = None
) -> ExitPolicy:
    """The bundle's thresholds, or thresholds calibrated on the profile when it has none (or when asked);
    ``threshold`` replaces every non-root node's, as ``cis serve --all --threshold`` does."""
    policy = bundle.policy
    if policy is not None and not policy.thresholded:  # no thresholds to calibrate or replace (FLAME)
        return policy
    if threshold is not None:
        measure = policy.measure if policy is not None else spec.confidence
        return ExitPolicy(measure, {n.id: threshold if n.parent else -np.inf for n in spec.nodes})
    if policy is None or calibrate:
        conf = {e: profile.confidence[:, e - 1] for e in range(1, spec.num_exits + 1)}
        return calibrate_thresholds(spec, conf, seed=seed)
    missing = [n.id for n in spec.nodes if n.id not in policy.thresholds]
    if missing:
        raise CisError(
            f"bundle {bundle.root}: policy has no threshold for node {missing[0]!r}; "
            "expected the spec's nodes (or pass --calibrate to calibrate on the profile)"
        )
    return policy


def profile_decisions(
    spec: CisSpec, policy: ExitPolicy, profile: Profile
) -> tuple[dict[str, list[bool]], list[int] | None]:
    """Per node and profile row, does the policy keep that sample at the node; and per row, the exit that
    serves it when the rule fixes one whatever the path (else None: each node's own exit).

    A sample's confidence and class at every exit are fixed, so the policy decides
    once per (node, row) here instead of once per simulated request.
    """
    masks, exit_at = policy.profile_decision({n.id: n.exit for n in spec.nodes}, profile.confidence, profile.predicted)
    return {nid: m.tolist() for nid, m in masks.items()}, None if exit_at is None else exit_at.tolist()


def state_payload(policy: ExitPolicy | None) -> int:
    """Extra bytes per forwarded sample: the rule's state that travels with the carry (patience: two int64)."""
    return 0 if policy is None else sum(a.nbytes for a in policy.fresh_state(1).values())


def served_shares(spec: CisSpec, overrides: dict[str, float]) -> dict[str, float]:
    """Without a bundle: the share of what reaches each node that it keeps; f_i by default."""
    rates = compute_rates(spec)
    return {n.id: overrides.get(n.id, rates.served_fraction(n.id)) for n in spec.nodes}
