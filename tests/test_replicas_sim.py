"""The simulator knows replicas (issue 41 item 3): a node with N replicas is N servers (N x workers), its queue
limit each replica's, its utilisation over all of them; a tree whose cloud is the bottleneck serves more within a
p99 target with more cloud replicas, and ``cis simulate --json`` says how many each node has."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cis.core.spec import CisSpec, Node, validate, write_spec
from cis.core.topologies import make_spec
from cis.sim import SimConfig, simulate


def _one(rate: float, **node) -> CisSpec:
    return validate(CisSpec((Node("solo", 1, arrival_rate=rate, **node),), 1))


def test_two_replicas_are_two_servers_erlang_c():
    """M/M/2 with rho 0.75 (lambda 1.5, mu 1): mean time in system 1 + C(2, 1.5) / (2 - 1.5), C = 0.6428..."""
    a, c = 1.5, 2
    erlang_c = (a**c / math.factorial(c) * c / (c - a)) / (
        sum(a**k / math.factorial(k) for k in range(c)) + a**c / math.factorial(c) * c / (c - a)
    )
    expected = 1.0 + erlang_c / (c - a)
    means = [
        simulate(_one(a, replicas=2), SimConfig(requests=100_000, seed=s, service="exponential", service_mean=1.0))
        .summary["latency"]["mean_s"]
        for s in range(4)
    ]
    assert sum(means) / len(means) == pytest.approx(expected, rel=0.04)
    same = SimConfig(requests=20_000, seed=7, service="exponential", service_mean=1.0)
    assert simulate(_one(a, replicas=2), same).summary["latency"] == simulate(_one(a, workers=2), same).summary[
        "latency"
    ]  # the same servers: replicas x workers


def test_the_queue_limit_is_each_replicas_and_utilisation_is_over_all_servers():
    run = simulate(_one(1.0, replicas=2, queue_limit=3), SimConfig(requests=20_000, seed=0, service_mean=1.0))
    same = simulate(_one(1.0, workers=2, queue_limit=6), SimConfig(requests=20_000, seed=0, service_mean=1.0))
    assert run.summary["drop_share"] == same.summary["drop_share"]
    node = run.summary["nodes"]["solo"]
    assert node["replicas"] == 2 and node["utilisation"] == pytest.approx(0.5, abs=0.03)


def test_more_cloud_replicas_carry_more_within_a_p99_target():
    base = make_spec("paper-7", "5-15-80")
    p99 = {}
    for n in (1, 2, 3):
        spec = base.replace_nodes(dataclasses.replace(x, replicas=n, address=None) if x.id == "cloud" else x
                                  for x in base.nodes)
        config = SimConfig(requests=20_000, seed=0, service_mean=0.009, loopback=True)
        p99[n] = simulate(spec, config).summary["latency"]["p99_s"]
    assert p99[1] > p99[2] >= p99[3]


def test_cis_simulate_json_names_the_replicas(tmp_path, run_cli):
    base = make_spec("paper-7", "5-15-80")
    spec = base.replace_nodes(dataclasses.replace(x, replicas=3, address=None) if x.id == "cloud" else x
                              for x in base.nodes)
    write_spec(spec, tmp_path / "s.toml")
    out = run_cli("simulate", "--spec", str(tmp_path / "s.toml"), "--requests", "2000", "--json").json()
    assert out["nodes"]["cloud"]["replicas"] == 3 and out["nodes"]["edge0"]["replicas"] == 1


def test_two_servers_woken_at_once_by_one_batch_of_forwards():
    """A child's batch forwards its requests at one instant: each wakes a server of the replicated parent, the
    first takes them all, the second finds the queue empty and waits again (it crashed on an empty batch)."""
    spec = validate(CisSpec((Node("root", 2, replicas=2),
                             Node("leaf", 1, parent="root", arrival_rate=200.0, max_transfer_rate=1000.0)), 2))
    run = simulate(spec, SimConfig(requests=5000, seed=0, service_mean=0.004, max_batch=8, loopback=True,
                                   shares={"leaf": 0.0}))
    assert run.summary["requests"]["dropped"] == 0
    assert run.summary["nodes"]["root"]["served_rate"] > 0 and run.summary["nodes"]["root"]["batches"] < 5000
