"""The simulator's model of the runtime where it is hard: micro-batches, refused forwards, bytes on a link,
link outages (heartbeats, forward timeouts, TCP retransmission), stages slower after idling, capacity search.

Each check is a relation the physics makes robust (no wall clock is involved: simulated time only)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cis.core.faults import Fault
from cis.core.spec import CisSpec, Link, Node, validate
from cis.sim import SimConfig, simulate
from cis.sim.links import MSS, SEGMENT_OVERHEAD, Outage, Uplink, Wire, wire_bytes
from cis.sim.service import batch_seconds
from cis.sim.sweep import sweep


def one_node(rate: float, queue_limit: int | None = None) -> CisSpec:
    return validate(CisSpec((Node("solo", 1, arrival_rate=rate, queue_limit=queue_limit),), 1))


FREE = Link(bandwidth=math.inf, latency=0.0)


def leaf_root(rate: float = 20.0, link: Link = FREE, root_queue=None) -> CisSpec:
    """A fast leaf (speed 10) forwarding to a root."""
    return validate(
        CisSpec(
            (
                Node("root", 2, queue_limit=root_queue),
                Node("leaf", 1, parent="root", arrival_rate=rate, max_transfer_rate=1e9, link=link, speed=10.0),
            ),
            2,
        )
    )


def test_batch_times_interpolate_the_profile_and_extend_its_last_slope():
    t = batch_seconds({1: 1.0, 8: 2.4, 32: 6.0}, 40)
    assert t[0] == 0 and t[1] == 1.0 and t[8] == pytest.approx(2.4) and t[32] == pytest.approx(6.0)
    assert t[4] == pytest.approx(1.0 + 3 * 1.4 / 7)
    assert t[40] == pytest.approx(6.0 + 8 * 3.6 / 24)
    assert batch_seconds({1: 0.5}, 3) == [0.0, 0.5, 1.0, 1.5]  # one size: in proportion


def test_micro_batches_carry_a_load_that_one_request_at_a_time_cannot():
    """Batch-1 service 10 ms, a batch of 8 takes 20 ms: 200 requests/s is twice the batch-1 capacity and half
    the batched one. Without batching the queue grows without bound; with it the node keeps up."""
    profile = {1: {1: 0.010, 8: 0.020}}
    base = dict(duration=30.0, seed=1, service="deterministic", latency_profile=profile)
    alone = simulate(one_node(200.0), SimConfig(**base, max_batch=1)).summary
    batched = simulate(one_node(200.0), SimConfig(**base, max_batch=8)).summary
    assert alone["latency"]["p50_s"] > 5.0  # ~half the run's backlog
    assert batched["latency"]["p99_s"] < 0.1
    node = batched["nodes"]["solo"]
    assert node["batches"] < 200 * 30 / 2  # most batches hold several requests
    assert node["utilisation"] < 1.0


def test_a_forward_a_full_parent_refuses_is_served_by_the_child_degraded():
    """The runtime answers a refused forward (overloaded) at the child's own exit, flagged degraded: nothing is
    dropped, and the root counts what it refused."""
    spec = leaf_root(rate=400.0, root_queue=1)
    config = SimConfig(requests=4000, seed=0, service="deterministic", service_mean=0.004, shares={"leaf": 0.0})
    result = simulate(spec, config)
    s, req = result.summary, result.requests
    assert s["requests"]["dropped"] == 0
    refused = s["nodes"]["root"]["refused"]
    assert refused > 0 and s["nodes"]["leaf"]["degraded"] == refused
    degraded = (req["flags"] & 1) > 0
    assert degraded.sum() == refused and (req["exit"][degraded] == 1).all()
    assert s["degraded_share"] == pytest.approx(refused / 4000)


def test_tcp_wire_bytes_and_a_token_bucket_wire():
    assert wire_bytes(MSS) == MSS + SEGMENT_OVERHEAD
    assert wire_bytes(MSS + 1) == MSS + 1 + 2 * SEGMENT_OVERHEAD
    wire = Wire(1000.0, burst=500.0)
    assert wire.send(10.0, 400) == 10.0  # the full bucket sends it at once
    assert wire.send(10.0, 600) == pytest.approx(10.0 + (600 - 100) / 1000)  # 100 bytes of tokens were left
    assert wire.send(20.0, 600) == pytest.approx(20.0 + 0.1)  # refilled to 500 while idle
    queued = Wire(1000.0)
    assert queued.send(0.0, 1000) == pytest.approx(1.0) and queued.send(0.5, 1000) == pytest.approx(2.0)  # FIFO


def test_a_forward_takes_its_message_size_over_the_bandwidth_on_a_tcp_wire():
    slow, fast = (leaf_root(rate=0.1, link=Link(bandwidth=bw, latency=0.0)) for bw in (20_000.0, 2_000_000.0))
    config = SimConfig(requests=100, seed=0, service="deterministic", service_mean=0.001, shares={"leaf": 0.0},
                       wire="tcp", payload_bytes=12_288)
    s_slow, s_fast = (simulate(spec, config) for spec in (slow, fast))
    link = s_slow.summary["links"]["leaf->root"]
    assert link["payload_bytes"] == 12_288 and link["wire_bytes"] > wire_bytes(12_288)  # the header goes too
    lat_slow = s_slow.requests["finish"] - s_slow.requests["arrive"]
    lat_fast = s_fast.requests["finish"] - s_fast.requests["arrive"]
    transfer = link["wire_bytes"] / 20_000.0
    assert lat_slow.min() >= transfer  # every request crosses the link, and its reply comes back over it
    assert transfer * 0.99 * 1.0 < lat_slow.min() - lat_fast.min() < transfer * 1.05


def test_a_bandwidth_fault_changes_the_transfer_time_mid_run():
    spec = leaf_root(rate=5.0, link=Link(bandwidth=1e6, latency=0.0))
    faults = (Fault(20.0, "bandwidth", "leaf", 10_000.0),)
    config = SimConfig(duration=40.0, seed=0, service="deterministic", service_mean=0.001, shares={"leaf": 0.0},
                       payload_bytes=1000, faults=faults)
    req = simulate(spec, config).requests
    lat = req["finish"] - req["arrive"]
    before, after = lat[req["arrive"] < 19.0], lat[req["arrive"] > 21.0]
    assert before.max() < 0.01 and after.min() > 0.09  # 1000 bytes at 1 MB/s, then at 10 kB/s


def test_retransmissions_back_off_from_the_first_send_into_an_outage():
    o = Outage(10.0, 15.0, child_first=10.1, rto=0.2, heartbeat=0.2, phase=0.15)  # next heartbeat: 10.15
    # 10.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2: the first retry after the link is back
    assert o.recovered() == pytest.approx(16.3)
    o.parent_first = 10.5  # the parent sent a reply into it too: its retries go 10.7, 11.1, 11.9, 13.5, 16.7
    assert o.recovered() == pytest.approx(16.7)
    assert Outage(10.0).recovered() == math.inf


def test_a_heartbeat_child_calls_its_parent_down_after_the_timeout_and_up_after_recovery():
    link = Uplink.make(math.inf, 0.0, heartbeat=0.2, phase=0.0)
    link.go_down(10.05)
    link.come_up(12.0)
    # the last heartbeat answered before the outage went at 10.0
    assert link.heard(10.9) == pytest.approx(10.0) and link.heard(11.1) == pytest.approx(10.0)
    recovered = link.outages[0].recovered()
    assert recovered > 12.0 and link.forward(recovered - 0.01, 100) is None
    assert link.forward(recovered + 0.01, 100) is not None
    assert link.heard(recovered + 0.05) == pytest.approx(recovered)


def test_a_partition_is_answered_degraded_and_nothing_is_lost():
    """Everything goes to the root; the leaf's uplink is down from 10 to 20 s. Forwards sent before the leaf
    notices (its first unanswered ping, at 10.2, 1 s old) wait the forward timeout; then the leaf answers at once;
    after the heal it forwards again once TCP retransmits."""
    spec = leaf_root(rate=50.0)
    faults = (Fault(10.0, "down", "leaf"), Fault(20.0, "up", "leaf"))
    config = SimConfig(duration=30.0, seed=0, service="deterministic", service_mean=0.001, shares={"leaf": 0.0},
                       faults=faults)
    s = simulate(spec, config)
    req = s.requests
    assert s.summary["requests"]["dropped"] == 0 and (req["exit"] > 0).all()
    degraded = (req["flags"] & 1) > 0
    lat = req["finish"] - req["arrive"]
    assert not degraded[req["arrive"] < 9.9].any()
    waited = degraded & (req["arrive"] >= 10.0) & (req["arrive"] < 10.7)  # before the leaf can notice
    assert waited.any() and lat[waited].min() >= 1.0 - 1e-9
    noticed = (req["arrive"] > 11.3) & (req["arrive"] < 19.9)
    assert degraded[noticed].all() and lat[noticed].max() < 0.01
    recovered = (req["arrive"] > 26.0)  # the last backoff before the heal ends by 10.2 + 12.6 at the latest
    assert not degraded[recovered].any()
    assert s.summary["degraded_share"] == pytest.approx(degraded.mean())
    assert 10 / 30 < degraded.mean() < 17 / 30


def test_a_node_that_idled_runs_its_next_batch_slower():
    spec = one_node(10.0)
    base = dict(requests=200, seed=0, arrivals="deterministic", service="deterministic", service_mean=0.010)
    cold = simulate(spec, SimConfig(**base, idle_slowdown=((0.0, 0.0), (0.05, 0.004)))).requests
    hot = simulate(spec, SimConfig(**base)).requests
    assert np.allclose(hot["finish"] - hot["arrive"], 0.010)
    assert np.allclose(cold["finish"] - cold["arrive"], 0.014)  # 90 ms idle: past the last point, +4 ms
    busy = simulate(spec, SimConfig(**{**base, "arrivals": "poisson"}, idle_slowdown=((0.0, 0.0), (0.05, 0.004))))
    assert (busy.requests["finish"] - busy.requests["arrive"]).min() < 0.0141  # shorter idles cost less


def test_a_capacity_search_finds_the_mm1_rate_for_a_p99_target():
    """M/M/1, service 1 ms: P(T > t) = exp(-(mu - lambda) t), so p99 <= 20 ms holds up to
    lambda = 1000 - ln(100) / 0.02 = 769.7 requests/s."""
    spec = one_node(100.0)
    config = SimConfig(requests=40_000, seed=0, service="exponential", service_mean=0.001)
    result = sweep(spec, config, (2.0, 9.5), slo_ms=20.0, jobs=2)
    expected = 1000 - math.log(100) / 0.02
    assert result["capacity"]["total_rate"] == pytest.approx(expected, rel=0.05)
    scales = [p["scale"] for p in result["points"]]
    assert scales == sorted(scales) and len(scales) > 4
    assert all(p["meets_slo"] == (p["scale"] <= result["capacity"]["scale"]) for p in result["points"])
