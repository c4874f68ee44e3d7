"""One simulation run: resolve spec + config + bundle into a plan, run the model, summarise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cis.core.bundle import Bundle
from cis.core.errors import CisError
from cis.core.spec import CisSpec
from cis.sim.build import run_model
from cis.sim.config import SimConfig, check_config
from cis.sim.model import Plan
from cis.sim.service import (
    Profile,
    bundle_carries,
    bundle_payloads,
    bundle_policy,
    bundle_profile,
    check_stage_profiles,
    node_stage_profiles,
    profile_decisions,
    served_shares,
    stage_tables,
    state_payload,
    tcp_messages,
)
from cis.sim.spans import span_columns, span_records, span_summary
from cis.sim.summary import summarise

Rows = dict[str, list[int]] | None  # per node, the profile rows its arrivals take in order (a replay), or None


@dataclass
class SimResult:
    summary: dict  # the --json result
    requests: dict[str, np.ndarray]  # one entry per request, ordered by id (see cis.sim.model.Log)
    spans: dict[str, np.ndarray] | None = None  # with SimConfig.spans: one row per span (cis.sim.spans.SpanLog)


def plan_run(
    spec: CisSpec,
    config: SimConfig,
    bundle: Bundle | None = None,
    profile: Profile | None = None,
    rows: Rows = None,
) -> Plan:
    """Everything the model needs, checked: service means, payloads and the exit decision.

    With a bundle, ``profile`` replaces the bundle's validation confidence profile
    (e.g. the profile of the samples a runtime run replays), and ``rows`` makes
    each node's arrivals take those profile rows in order instead of random ones
    (a node's arrivals stop when its rows run out): the same requests as that run.
    """
    config = check_config(config, spec, bundle is not None)
    if (profile is not None or rows is not None) and bundle is None:
        raise CisError("simulate: a replayed profile or rows need a bundle (thresholds, service times, payloads)")
    if bundle is None:
        per_stage = _measured(spec, config) or {n.id: [{1: config.service_mean}] * spec.num_exits for n in spec.nodes}
        payloads = {k: config.payload_bytes for k in range(1, spec.num_exits + 1)}
        carries = {k: {"carry": np.zeros((1, config.payload_bytes), np.uint8)} for k in range(1, spec.num_exits)}
        return Plan(
            spec, config, stage_tables(spec, per_stage, config.max_batch or 1), payloads,
            *_wire(spec, config, carries), shares=served_shares(spec, config.shares),
        )
    profile = profile if profile is not None else bundle_profile(bundle, spec.num_exits)
    if rows is not None:
        bad = [r for rs in rows.values() for r in rs if not 0 <= r < profile.samples]
        if bad:
            raise CisError(f"simulate: replay row {bad[0]} is outside the profile's {profile.samples} samples")
    payloads = bundle_payloads(bundle, spec.num_exits)
    tables = stage_tables(spec, _measured(spec, config) or node_stage_profiles(spec, bundle), config.max_batch or 1)
    policy = bundle_policy(spec, bundle, profile, config.calibrate, config.seed, config.threshold)
    payloads = {k: b + state_payload(policy) for k, b in payloads.items()}
    masks, exit_at = profile_decisions(spec, policy, profile)
    return Plan(
        spec,
        config,
        tables,
        payloads,
        *_wire(spec, config, bundle_carries(bundle, spec.num_exits, policy)),
        masks=masks,
        profile=profile,
        policy=policy,
        rows=rows,
        exit_at=exit_at,
    )


def _measured(spec: CisSpec, config: SimConfig) -> dict[str, list[dict[int, float]]] | None:
    """Every node's stage times from ``config.latency_profile`` (measured where the nodes run), if given."""
    if config.latency_profile is None:
        return None
    stages = check_stage_profiles(config.latency_profile, spec.num_exits, "simulate: --latency-profile")
    return {n.id: stages for n in spec.nodes}


def _wire(spec: CisSpec, config: SimConfig, carries: dict[int, dict[str, np.ndarray]]) -> tuple[dict | None, int]:
    """(bytes of a forward on the wire per stage, of a reply): the payload alone, or TCP's view."""
    return tcp_messages(spec, carries) if config.wire == "tcp" else (None, 0)


def simulate(
    spec: CisSpec, config: SimConfig, bundle: Bundle | None = None, profile: Profile | None = None, rows: Rows = None
) -> SimResult:
    """Run one simulation; identical inputs (seed included) give identical results."""
    plan = plan_run(spec, config, bundle, profile, rows)
    model = run_model(plan)
    requests = model.log.arrays()
    summary = summarise(plan, model, requests)
    summary["bundle"] = None if bundle is None else str(Path(bundle.root))
    spans = None if model.spans is None else model.spans.arrays()
    if spans is not None:
        summary["spans"] = span_summary(span_columns(span_records(spans, spec.ids)))
    return SimResult(summary, requests, spans)
