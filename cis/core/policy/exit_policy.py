"""The exit policy: the one piece of code that decides where a request is served.

Three users share it: the offline CIS evaluation in training, the runtime node
and the simulator. It holds

- the confidence measures (max softmax, normalised entropy, margin; :mod:`cis.core.policy.confidence`);
- :class:`ExitPolicy`, per-node thresholds on a confidence measure, applied per sample,
  or FLAME's patience rule (:mod:`cis.core.policy.patience`), whose state travels with the carry;
- :meth:`ExitPolicy.batch`, that decision on one micro-batch at one node, stage by stage
  (:mod:`cis.core.policy.decision`);
- :func:`route`, the flow of a set of requests through the tree, either by
  quota (each node serves the most confident share its serving rate allows,
  splitting the boundary sample fractionally; the paper's Table 1 evaluation)
  or by thresholds (what the runtime does);
- :func:`calibrate_thresholds`, which turns the quota flow on validation data
  into per-node thresholds.

Confidence at a node is always computed at that node's own largest exit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from cis.core.errors import CisError
from cis.core.policy import patience as patience_rule
from cis.core.policy.confidence import confidence
from cis.core.policy.decision import BatchDecision, PatienceDecision, ThresholdDecision
from cis.core.rates import Rates, compute_rates
from cis.core.records import json_float
from cis.core.spec import CisSpec

# ---------------------------------------------------------------- policy


@dataclass
class ExitPolicy:
    """Per-node thresholds on one confidence measure, or FLAME's patience rule.

    A node serves a sample when its confidence at the node's exit is at least the
    node's threshold; the root's threshold is -inf (it serves everything).

    With ``measure == "patience"`` (and ``patience`` = p) no threshold applies:
    the decision depends on the sequence of exits a request has passed, so it
    takes the request's patience state (label, count; :mod:`cis.core.policy.patience`) and
    returns the new one (:meth:`decide_patience`). Every exit a request passes
    advances the count, and it is served at the first exit where the count
    reaches p (at the latest by the root). ``thresholds`` is then unused.
    """

    measure: str
    thresholds: dict[str, float]
    patience: int | None = None
    _threshold_decisions: dict[tuple[str, bool], ThresholdDecision] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.measure == patience_rule.MEASURE:
            if self.patience is None:
                raise CisError("exit policy: measure 'patience' needs a patience value (an integer >= 1)")
            self.patience = patience_rule.check_patience(self.patience)
        elif self.patience is not None:
            raise CisError(f"exit policy: a patience value applies only to measure 'patience', not {self.measure!r}")

    @property
    def uses_patience(self) -> bool:
        return self.measure == patience_rule.MEASURE

    @property
    def thresholded(self) -> bool:
        """Whether per-node thresholds decide: what --threshold, calibration and --adapt set or move."""
        return not self.uses_patience

    def decide(self, node_id: str, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (serve mask, confidence) for a batch of logits at ``node_id``."""
        if self.uses_patience:
            raise CisError(
                "exit policy 'patience': the decision needs the requests' patience state; use decide_patience"
            )
        conf = confidence(logits, self.measure)
        return conf >= self.thresholds[node_id], conf

    def decide_patience(
        self, logits: np.ndarray, state: patience_rule.PatienceState, last: bool = False
    ) -> tuple[np.ndarray, patience_rule.PatienceState]:
        """(serve mask, new state) after one exit's logits, for requests arriving with ``state``."""
        if not self.uses_patience:
            raise CisError(f"exit policy {self.measure!r}: thresholds decide, not patience")
        assert self.patience is not None  # uses_patience: p is set
        new, done = patience_rule.step(state, logits, self.patience, last=last)
        return done, new

    @property
    def state_names(self) -> tuple[str, ...]:
        """The tensors a request carries for the rule between stages and tiers (patience: label and count)."""
        return (patience_rule.LABEL, patience_rule.COUNT) if self.uses_patience else ()

    def fresh_state(self, n: int) -> dict[str, np.ndarray]:
        """The rule's state of n requests that have passed no exit, as carry tensors (none for thresholds)."""
        return patience_rule.to_carry(patience_rule.initial_state(n)) if self.uses_patience else {}

    def batch(self, node_id: str, node_exit: int, root: bool) -> BatchDecision:
        """The decision on one micro-batch at ``node_id``, fed stage by stage (:class:`BatchDecision`)."""
        if self.uses_patience:  # state per batch
            return PatienceDecision(self, node_exit)
        stateless = self._threshold_decisions.get((node_id, root))  # none: one per node serves every batch
        if stateless is None:
            stateless = self._threshold_decisions[node_id, root] = ThresholdDecision(self, node_id, root)
        return stateless

    def profile_decision(
        self, node_exits: Mapping[str, int], conf: np.ndarray, predicted: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The decision on a validation profile (per row and exit 1..E: confidence, predicted class or None):
        per node, the rows it serves; per row, the exit that serves it whatever the path when the rule fixes
        one (patience), else None (each node's own exit). The simulator replays these instead of deciding."""
        if not self.uses_patience:
            return {nid: conf[:, e - 1] >= self.thresholds[nid] for nid, e in node_exits.items()}, None
        if predicted is None:
            raise CisError(
                "simulate: the bundle's profile has no 'predicted' classes, which the patience rule needs; "
                "re-export the bundle"
            )
        assert self.patience is not None  # uses_patience: p is set
        at = patience_rule.exit_points_from_labels(predicted, self.patience)
        return {nid: at <= e for nid, e in node_exits.items()}, at

    def to_json(self) -> dict:
        out: dict = {"measure": self.measure, "thresholds": {k: json_float(v) for k, v in self.thresholds.items()}}
        if self.patience is not None:
            out["patience"] = self.patience
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> ExitPolicy:
        p = data.get("patience")
        return cls(data["measure"], {k: float(v) for k, v in data["thresholds"].items()}, None if p is None else int(p))


# ---------------------------------------------------------------- routing


@dataclass
class Routing:
    """Where each request was served. Pieces of one request may be served at
    different nodes when the quota flow splits a boundary sample; ``weight``
    sums to 1 per request."""

    sample: np.ndarray  # (M,) request index
    node: np.ndarray  # (M,) index into spec.ids
    exit: np.ndarray  # (M,) exit that served it
    weight: np.ndarray  # (M,) fraction of the request
    node_ids: list[str]
    num_requests: int
    boundary: dict[str, float] = field(default_factory=dict)  # per node: (last served + first forwarded) / 2

    def accuracy(self, correct: Mapping[int, np.ndarray]) -> float:
        """CIS accuracy: each request counted once, at the exit that served it."""
        table = np.stack([np.asarray(correct[e], dtype=np.float64) for e in sorted(correct)])
        hits = table[self.exit - min(correct), self.sample]
        return float((hits * self.weight).sum() / max(self.num_requests, 1))

    def exit_shares(self, num_exits: int) -> dict[int, float]:
        return {
            e: float(self.weight[self.exit == e].sum() / max(self.num_requests, 1)) for e in range(1, num_exits + 1)
        }

    def node_shares(self) -> dict[str, float]:
        return {
            nid: float(self.weight[self.node == k].sum() / max(self.num_requests, 1))
            for k, nid in enumerate(self.node_ids)
        }


def assign_entries(spec: CisSpec, num_requests: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Split requests among the nodes with local arrivals, in proportion to their arrival rates."""
    sources = [n for n in spec.nodes if n.arrival_rate > 0]
    if not sources:
        raise CisError(f"spec {spec.name!r}: no node has an arrival_rate > 0; expected requests to arrive somewhere")
    rates = np.array([n.arrival_rate for n in sources])
    order = np.random.default_rng(seed).permutation(num_requests)
    cuts = np.round(np.cumsum(rates / rates.sum()) * num_requests).astype(int)
    starts = np.concatenate([[0], cuts[:-1]])
    return {n.id: np.sort(order[a:b]) for n, a, b in zip(sources, starts, cuts)}


Decider = Callable[[str, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(node id, sample indices, their weights, their confidences) -> weight served here."""


def route(
    spec: CisSpec,
    conf: Mapping[int, np.ndarray],
    entries: Mapping[str, np.ndarray],
    decide: Decider,
) -> Routing:
    """Flow requests up the tree; each node keeps what ``decide`` serves and forwards the rest."""
    ids = spec.ids
    pending: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {i: [] for i in ids}
    for nid, idx in entries.items():
        pending[nid].append((np.asarray(idx, dtype=np.int64), np.ones(len(idx))))
    out_s, out_n, out_e, out_w = [], [], [], []
    boundary: dict[str, float] = {}
    for node in spec.bottom_up():
        parts = pending[node.id]
        idx = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
        w = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
        c = np.asarray(conf[node.exit])[idx]
        if node.parent is None:
            served = w.copy()
        else:
            served = decide(node.id, idx, w, c)
            if len(idx):
                boundary[node.id] = _boundary(c, served, w)
        keep = served > 0
        out_s.append(idx[keep])
        out_n.append(np.full(keep.sum(), ids.index(node.id)))
        out_e.append(np.full(keep.sum(), node.exit))
        out_w.append(served[keep])
        rest = w - served
        fwd = rest > 1e-12
        if node.parent is not None and fwd.any():
            pending[node.parent].append((idx[fwd], rest[fwd]))
    total = sum(len(v) for v in entries.values())
    return Routing(
        np.concatenate(out_s), np.concatenate(out_n), np.concatenate(out_e), np.concatenate(out_w), ids, total, boundary
    )


def _boundary(conf: np.ndarray, served: np.ndarray, weight: np.ndarray) -> float:
    """A threshold between the least confident served and the most confident forwarded sample."""
    full = served >= weight - 1e-12
    fwd = served < weight - 1e-12
    if not fwd.any():
        return -math.inf
    if not full.any():
        return math.inf
    lo, hi = conf[fwd].max(), conf[full].min()
    return float((lo + hi) / 2) if hi >= lo else float(hi)


def quota_decider(spec: CisSpec, rates: Rates | None = None) -> Decider:
    """Serve the most confident share f_i of what reaches each node (boundary sample split)."""
    rates = rates or compute_rates(spec)

    def decide(node_id: str, idx: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
        quota = rates.served_fraction(node_id) * w.sum()
        order = np.argsort(-c, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(w[order])[:-1]])
        take = np.clip(quota - before, 0.0, w[order])
        served = np.empty_like(w)
        served[order] = take
        return served

    return decide


def threshold_decider(policy: ExitPolicy) -> Decider:
    """Serve what clears the node's threshold (the runtime's rule, without the time-based cap)."""

    def decide(node_id: str, idx: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.where(c >= policy.thresholds[node_id], w, 0.0)

    return decide


def exit_confidences(logits: Mapping[int, np.ndarray], measure: str) -> dict[int, np.ndarray]:
    return {e: confidence(v, measure) for e, v in logits.items()}


def exit_correct(logits: Mapping[int, np.ndarray], labels: np.ndarray) -> dict[int, np.ndarray]:
    return {e: (np.asarray(v).argmax(axis=-1) == labels) for e, v in logits.items()}


def calibrate_thresholds(
    spec: CisSpec, conf: Mapping[int, np.ndarray], seed: int = 0, measure: str | None = None, rates: Rates | None = None
) -> ExitPolicy:
    """Per-node thresholds that make each node serve its target share on this (validation) data: the served
    fraction f_i of the spec's calculus, or of ``rates`` (measured ones: ``cis export --rates-from``)."""
    n = len(next(iter(conf.values())))
    routing = route(spec, conf, assign_entries(spec, n, seed), quota_decider(spec, rates))
    thresholds = {node.id: routing.boundary.get(node.id, math.inf) for node in spec.nodes}
    thresholds[spec.root.id] = -math.inf
    return ExitPolicy(measure or spec.confidence, thresholds)


@dataclass
class CisEvaluation:
    accuracy: float
    exit_shares: dict[int, float]
    node_shares: dict[str, float]
    exit_accuracy: dict[int, float]

    def to_json(self) -> dict:
        return {
            "cis_accuracy": self.accuracy,
            "served_share_per_exit": {str(k): v for k, v in self.exit_shares.items()},
            "served_share_per_node": self.node_shares,
            "exit_accuracy": {str(k): v for k, v in self.exit_accuracy.items()},
        }


def evaluate_cis(
    spec: CisSpec,
    logits: Mapping[int, np.ndarray],
    labels: np.ndarray,
    policy: ExitPolicy | None = None,
    measure: str | None = None,
    seed: int = 0,
) -> CisEvaluation:
    """CIS accuracy of per-exit logits under a spec: by quota (Table 1), or by a policy's thresholds."""
    measure = measure or (policy.measure if policy else spec.confidence)
    conf = exit_confidences(logits, measure)
    correct = exit_correct(logits, labels)
    decide = threshold_decider(policy) if policy else quota_decider(spec)
    routing = route(spec, conf, assign_entries(spec, len(labels), seed), decide)
    return CisEvaluation(
        accuracy=routing.accuracy(correct),
        exit_shares=routing.exit_shares(spec.num_exits),
        node_shares=routing.node_shares(),
        exit_accuracy={e: float(c.mean()) for e, c in correct.items()},
    )


def evaluate_patience(
    spec: CisSpec, logits: Mapping[int, np.ndarray], labels: np.ndarray, patience: int, seed: int = 0
) -> CisEvaluation:
    """CIS accuracy under the patience rule: each request is served at its patience exit.

    Every path from a leaf to the root passes the exits in order (each node runs
    its stages up to its own exit), so the exit a request takes is
    :func:`cis.core.policy.patience.exit_points` whatever node it enters at; a node serves
    what reaches patience at one of its exits (the root: the rest). Transfer
    caps are not modelled here (the runtime and the simulator apply them).
    """
    exits = sorted(logits)
    at = patience_rule.exit_points([logits[e] for e in exits], patience)
    correct = exit_correct(logits, labels)
    table = np.stack([correct[e] for e in exits])
    node_exit = {n.id: n.exit for n in spec.nodes}

    def decide(node_id: str, idx: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.where(at[idx] <= node_exit[node_id], w, 0.0)

    routing = route(spec, exit_confidences(logits, "max_softmax"), assign_entries(spec, len(labels), seed), decide)
    n = max(len(labels), 1)
    return CisEvaluation(
        accuracy=float(table[at - exits[0], np.arange(len(labels))].mean()) if len(labels) else 0.0,
        exit_shares={e: float((at == e).sum() / n) for e in range(1, spec.num_exits + 1)},
        node_shares=routing.node_shares(),
        exit_accuracy={e: float(c.mean()) for e, c in correct.items()},
    )
