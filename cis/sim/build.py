"""Building the SimPy model of a plan (:func:`build`: stations, uplinks, arrival streams, every random stream
seeded from the config) and running it (:func:`run_model`). The model's parts and the story of one request
are :mod:`cis.sim.model`'s."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import simpy
from simpy.core import EmptySchedule
from tqdm import tqdm

from cis.core.policy.transfer_cap import TokenBucket
from cis.core.spec import CisSpec, Node
from cis.core.streams import indices, spawn, uniforms, unit_exponentials
from cis.sim.arrivals import deterministic, mmpp, poisson, read_trace
from cis.sim.config import SimConfig, run_heartbeat_timeout
from cis.sim.cores import Machine
from cis.sim.links import Uplink
from cis.sim.model import EVENTS_PER_UPDATE, LOOPBACK, Model, Plan, source
from cis.sim.spans import SpanLog
from cis.sim.station import Station


def build(plan: Plan) -> tuple[Model, list[tuple[Station, Iterator[float], Iterator[int]]]]:
    """Stations, uplinks and the arrival streams of every node, all seeded from the config."""
    spec, config = plan.spec, plan.config
    env = simpy.Environment()
    rngs = iter(spawn(config.seed, 4 * len(spec.nodes) + 1))
    trace = (
        read_trace(config.trace, {n.id: n.arrival_rate for n in spec.nodes}, next(rngs))
        if config.arrivals == "trace" and config.trace is not None  # SimConfig: a trace names its file
        else None
    )
    stations: dict[str, Station] = {}
    feeds = []
    machine = None
    if spec.hosts or config.interference:  # the nodes' batches share cores, or slow each other
        machine = Machine(env, {h.id: h.cores for h in spec.hosts}, config.interference)
    for index, node in enumerate(spec.nodes):
        arrival_rng, service_rng, decision_rng, row_rng = (next(rngs) for _ in range(4))
        station = _station(plan, env, (node, index), (service_rng, decision_rng), machine)
        stations[node.id] = station
        if plan.rows is not None:  # replay: this node's arrivals take these rows, in order
            rows = iter(plan.rows.get(node.id, []))
        else:
            rows = indices(row_rng, plan.profile.samples) if plan.profile is not None else itertools.repeat(-1)
        times = _times(node, config, arrival_rng, trace)
        if times is not None:
            feeds.append((station, times, rows))
    _connect(spec, config, stations)
    if config.spans:
        for st in stations.values():
            st.admitted = {}
    correct = None
    if plan.profile is not None:
        correct = {e: plan.profile.correct[:, e - 1].astype(np.int8).tolist() for e in range(1, spec.num_exits + 1)}
    limit = config.requests if config.requests is not None else math.inf
    horizon = config.duration if config.duration is not None else math.inf
    hops, entries = _messaging(config, len(spec.nodes))
    messages = plan.messages if plan.messages is not None else plan.payloads
    model = Model(
        env, stations, machine, messages, plan.reply_bytes, correct, limit, horizon, hops, plan.exit_at,
        config.forward_timeout, run_heartbeat_timeout(config), SpanLog() if config.spans else None, entries,
    )
    return model, feeds


def _station(plan: Plan, env: simpy.Environment, where: tuple[Node, int], rngs: tuple, machine: Machine | None):
    """One node's station (``where``: the node and its index; ``rngs``: its service and decision streams)."""
    config, (node, index) = plan.config, where
    service_rng, decision_rng = rngs
    return Station(
        env,
        node,
        index,
        plan.stage_tables[node.id],
        _units(config, service_rng),
        _keeper(plan, node.id, decision_rng),
        _bucket(node, config.burst),
        config.visit_overhead,
        config.max_batch or 1,
        _slowdown(config.idle_slowdown),
        machine,
        _batch_work(config.batch_overhead.get(node.id, config.batch_overhead.get("*"))),
        bool(config.service_spread),
        config.message_work,
    )


def _messaging(config: SimConfig, n_nodes: int) -> tuple[Iterator[float] | None, Iterator[float] | None]:
    """The per-request messaging draws: a node visit's round trip (--visit-cost) and the client's
    (--entry-cost), each from its own stream, spawned after the others so runs without them keep their
    numbers (None: no such cost)."""
    hops = None
    if config.hop_rtt:
        hop_rng = spawn(config.seed, 4 * n_nodes + 2)[-1]
        hops = (
            itertools.repeat(config.hop_rtt[0])
            if len(config.hop_rtt) == 1
            else (config.hop_rtt[i] for i in indices(hop_rng, len(config.hop_rtt)))
        )
    entries = None
    if config.entry_rtt:
        entry_rng = spawn(config.seed, 4 * n_nodes + 4)[-1]
        entries = (config.entry_rtt[i] for i in indices(entry_rng, len(config.entry_rtt)))
    return hops, entries


def _connect(spec: CisSpec, config: SimConfig, stations: dict[str, Station]) -> None:
    """Every child's uplink (loopback: no bandwidth, no latency), its heartbeat phase and its scheduled faults."""
    phases = uniforms(spawn(config.seed, 4 * len(spec.nodes) + 3)[-1])  # its own stream: runs without faults keep
    for node in spec.nodes:
        if node.parent is None:
            continue
        link = LOOPBACK if config.loopback else node.link
        st = stations[node.id]
        st.parent, st.tiers_above = stations[node.parent], max(1, spec.depth(node.id))
        st.uplink = Uplink.make(
            link.bandwidth, link.latency, config.link_burst, heartbeat=config.heartbeat,
            phase=next(phases) * config.heartbeat, rto=config.rto,
        )
    for fault in config.faults:
        up = stations[fault.node].uplink
        assert up is not None  # cis.core.faults refuses a fault on the root's (absent) uplink
        if fault.action == "down":
            up.go_down(fault.at)
        elif fault.action == "up":
            up.come_up(fault.at)
        else:
            assert fault.value is not None  # a bandwidth change carries its rate
            up.up.set_rate(fault.at, fault.value)
            up.down.set_rate(fault.at, fault.value)


def _units(config: SimConfig, rng: np.random.Generator) -> Iterator[float]:
    """Multipliers of each batch's stage time: a measured spread, exponential draws, or 1."""
    if config.service_spread:
        spread = config.service_spread
        return (spread[i] for i in indices(rng, len(spread)))
    return unit_exponentials(rng) if config.service == "exponential" else itertools.repeat(1.0)


def _batch_work(value) -> Callable[[float], float] | None:
    """A node's work per batch by how long it idled before it: a constant, or a table (linear, flat beyond)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return lambda _idle: float(value)
    return _slowdown(tuple((float(g), float(w)) for g, w in value))


def _slowdown(table: tuple[tuple[float, float], ...]) -> Callable[[float], float] | None:
    """Idle seconds -> extra seconds of the next batch, linear between the table's points (flat beyond them)."""
    if not table:
        return None
    gaps, extra = zip(*sorted(table))
    return lambda idle: float(np.interp(idle, gaps, extra))


def _keeper(plan: Plan, node_id: str, rng: np.random.Generator) -> Callable[[int], bool]:
    """With a profile, the policy's precomputed decision per row; without, a draw against the node's share."""
    if plan.masks is not None:
        return plan.masks[node_id].__getitem__
    assert plan.shares is not None  # no profile: the plan has the shares
    share, draws = plan.shares[node_id], uniforms(rng)
    return lambda _row: next(draws) < share


def _bucket(node: Node, burst_seconds: float | None) -> TokenBucket:
    burst = None if burst_seconds is None else max(1.0, node.max_transfer_rate * burst_seconds)
    return TokenBucket(node.max_transfer_rate, burst)


def _times(
    node: Node, config: SimConfig, rng: np.random.Generator, trace: dict[str, list[float]] | None
) -> Iterator[float] | None:
    if trace is not None:
        return iter(trace[node.id]) if trace[node.id] else None
    if node.arrival_rate <= 0:
        return None
    if config.arrivals == "deterministic":
        return deterministic(node.arrival_rate)
    if config.arrivals == "mmpp":
        return mmpp(node.arrival_rate, config.mmpp_ratio, config.mmpp_dwell, rng)
    return poisson(node.arrival_rate, rng)


def run_model(plan: Plan) -> Model:
    """Build the model, run it until every request is served or dropped, and return it."""
    model, feeds = build(plan)
    env = model.env
    for station, times, rows in feeds:
        env.process(source(env, model, station, times, rows))
    if not plan.config.progress:
        env.run()
        return model
    by_requests = plan.config.requests is not None
    total = plan.config.requests if by_requests else plan.config.duration
    assert total is not None  # a request count or a duration bounds every run (SimConfig)
    with tqdm(total=total, unit="req" if by_requests else "s", desc="simulate", leave=False, disable=None) as bar:
        try:
            while True:
                for _ in range(EVENTS_PER_UPDATE):
                    env.step()
                bar.update(min(model.arrived if by_requests else env.now, total) - bar.n)
        except EmptySchedule:
            pass
    return model
