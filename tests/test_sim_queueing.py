"""The simulator against queueing theory and the rate calculus.

Tolerances come from the measured spread of the estimators, not from a lucky
seed. Over 20 seeds of 100,000 requests each, the relative error of the mean
time in system had a standard deviation of 1.0 % (M/M/1, rho 0.5), 2.3 %
(M/M/1, rho 0.8) and 1.6 % (M/D/1, rho 0.8): a single 100k run at rho 0.8 would
miss 3 % about one time in five. So each check averages k independent runs of
100,000 requests (seeds 0..k-1, every one of them kept), with k chosen so that
3 % is at least 3.3 standard deviations of that average.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cis.core.rates import compute_rates
from cis.core.spec import CisSpec, Node, validate
from cis.core.topologies import make_spec
from cis.sim import SimConfig, simulate


def single_node(rate: float, **node) -> CisSpec:
    return validate(CisSpec((Node("solo", 1, arrival_rate=rate, **node),), 1))


def mean_time_in_system(rate: float, service: str, runs: int, requests: int = 100_000) -> float:
    """Average over ``runs`` independent seeds of the mean end-to-end latency, service mean 1 s."""
    spec = single_node(rate)
    means = [
        simulate(spec, SimConfig(requests=requests, seed=seed, service=service, service_mean=1.0)).summary["latency"][
            "mean_s"
        ]
        for seed in range(runs)
    ]
    return float(np.mean(means))


@pytest.mark.parametrize("rho, runs", [(0.5, 2), (0.8, 6)])
def test_one_node_with_exponential_service_is_mm1(rho, runs):
    expected = 1.0 / (1.0 - rho)  # 1 / (mu - lambda) with mu = 1
    assert mean_time_in_system(rho, "exponential", runs) == pytest.approx(expected, rel=0.03)


def test_deterministic_service_matches_md1_pollaczek_khinchine():
    rho = 0.8
    expected = 1.0 + rho / (2.0 * (1.0 - rho))  # service + P-K mean wait, mu = 1
    assert mean_time_in_system(rho, "deterministic", runs=3) == pytest.approx(expected, rel=0.03)


def test_queue_limit_drops_like_mm1k():
    rho, limit = 0.8, 4
    capacity = limit + 1  # the waiting room plus the one in service
    expected = (1 - rho) * rho**capacity / (1 - rho ** (capacity + 1))
    summary = simulate(
        single_node(rho, queue_limit=limit), SimConfig(requests=50_000, seed=0, service_mean=1.0)
    ).summary
    assert summary["drop_share"] == pytest.approx(expected, rel=0.10)  # measured spread: 2.4 % per 50k run
    assert summary["nodes"]["solo"]["max_queue"] == limit
    assert summary["requests"]["dropped"] == summary["nodes"]["solo"]["dropped"] > 0


def test_two_workers_match_erlang_c():
    lam, c = 1.0, 2  # mu = 1 per worker, utilisation 0.5
    a = lam
    tail = a**c / math.factorial(c) / (1 - a / c)
    wait_prob = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    expected = wait_prob / (c - lam) + 1.0
    summary = simulate(single_node(lam, workers=c), SimConfig(requests=50_000, seed=0, service_mean=1.0)).summary
    assert summary["latency"]["mean_s"] == pytest.approx(expected, rel=0.05)  # measured spread: 1.1 % per 50k run
    assert summary["nodes"]["solo"]["utilisation"] == pytest.approx(lam / c, rel=0.03)


def test_served_shares_per_exit_match_the_rate_calculus():
    # The policy's default bucket (10 s of each cap) is deep enough that the shares
    # come from the nodes' served fractions f_i; the next test shows a shallow one.
    spec = make_spec("paper-7", "60-30-10")
    summary = simulate(spec, SimConfig(requests=50_000, seed=0)).summary
    rates = compute_rates(spec)
    for e, x in summary["exits"].items():
        assert x["share"] == pytest.approx(x["calculus_share"], abs=0.01)
        assert x["rate"] == pytest.approx(rates.exit_serving_rate[int(e)], rel=0.03)
    for node_id, n in summary["nodes"].items():
        assert n["served_rate"] == pytest.approx(rates.serving_rate[node_id], rel=0.04)


def two_tier(arrival: float, cap: float) -> CisSpec:
    return validate(
        CisSpec((Node("root", 2), Node("leaf", 1, parent="root", arrival_rate=arrival, max_transfer_rate=cap)), 2)
    )


@pytest.mark.parametrize("keep, expected", [(0.8, 10 / (1 + 10 / 10)), (0.0, 50 / (1 + 50 / 10))])
def test_one_token_bucket_is_an_md11_loss_system(keep, expected):
    # Cap 10/s with a one-token bucket (burst 0.1 s of the cap): a forward takes the
    # token, the next one is ready 1/cap later, so Poisson forwards at rate x get
    # through at x / (1 + x / cap). Departures of an M/M/1 node are Poisson (Burke).
    spec = two_tier(50.0, 10.0)
    summary = simulate(spec, SimConfig(duration=400.0, seed=0, shares={"leaf": keep}, burst=0.1)).summary
    assert summary["nodes"]["leaf"]["forwarded_rate"] == pytest.approx(expected, rel=0.03)


def test_saturated_transfer_cap_forwards_at_the_cap():
    spec = two_tier(50.0, 10.0)
    summary = simulate(spec, SimConfig(duration=400.0, seed=0, shares={"leaf": 0.0}, burst=1.0)).summary
    leaf = summary["nodes"]["leaf"]
    assert leaf["forwarded_rate"] == pytest.approx(10.0, rel=0.01)
    assert leaf["served_rate"] == pytest.approx(40.0, rel=0.02)
    assert leaf["capped_rate"] == pytest.approx(leaf["served_rate"])  # everything kept was refused a token
