"""The cores of one machine slowing each other (``SimConfig.interference``, cis.sim.cores.Machine): while m other cores
run batches, a batch advances 1 + interference * m times slower; batches time-sliced on one core do not count."""

from __future__ import annotations

import json
import pathlib

import pytest
import simpy

from cis.core.errors import CisError
from cis.core.spec import CisSpec, Host, Node, validate, write_spec
from cis.sim import SimConfig, simulate
from cis.sim.cores import Machine


def finish_times(machine: Machine, jobs) -> dict:
    env, done = machine.env, {}

    def job(name, start, work, host):
        yield env.timeout(start)
        yield machine.run(work, host)
        done[name] = env.now

    for name, start, work, host in jobs:
        env.process(job(name, start, work, host))
    env.run()
    return done


def test_two_busy_cores_slow_each_other_by_the_interference():
    # both on cores of their own at 1 / 1.5: y's 1 s takes 1.5 s (x has 1 s left), then x alone at full speed
    done = finish_times(Machine(simpy.Environment(), interference=0.5), [("x", 0, 2.0, None), ("y", 0, 1.0, None)])
    assert done == {"x": pytest.approx(2.5), "y": pytest.approx(1.5)}
    alone = finish_times(Machine(simpy.Environment()), [("x", 0, 2.0, None), ("y", 0, 1.0, None)])
    assert alone == {"x": pytest.approx(2.0), "y": pytest.approx(1.0)}


def test_batches_sliced_on_one_core_do_not_interfere():
    # one busy core: processor sharing alone (each at 1/2), no interference
    done = finish_times(Machine(simpy.Environment(), {"box": 1}, 0.5), [("x", 0, 1.0, "box"), ("y", 0, 1.0, "box")])
    assert done == {"x": pytest.approx(2.0), "y": pytest.approx(2.0)}
    # two cores busy on a 2-core host: each at 1 / 1.5
    done = finish_times(Machine(simpy.Environment(), {"box": 2}, 0.5), [("x", 0, 1.0, "box"), ("y", 0, 1.0, "box")])
    assert done == {"x": pytest.approx(1.5), "y": pytest.approx(1.5)}


def test_a_late_batch_slows_a_running_one_only_while_it_runs():
    # x alone 1 s (1 s left), then with y at 1/1.25 until y's 0.5 s is done (0.625 s), then x's 0.5 s left alone
    done = finish_times(Machine(simpy.Environment(), interference=0.25), [("x", 0, 2.0, None), ("y", 1.0, 0.5, None)])
    assert done["y"] == pytest.approx(1.625)
    assert done["x"] == pytest.approx(1.625 + 0.5)


def two_leaves() -> CisSpec:
    return validate(CisSpec((
        Node("root", 2),
        Node("a", 1, parent="root", arrival_rate=1.0),
        Node("b", 1, parent="root", arrival_rate=1.0),
    ), 2))


def test_the_model_stretches_batches_that_run_beside_other_nodes_batches(tmp_path):
    """A burst of 200 requests at each leaf, 10 ms each: 2 s on their own; with interference 0.5, both leaves busy
    the whole time, 3 s; a config without interference is as before."""
    trace = tmp_path / "burst.csv"
    trace.write_text("".join(f"{leaf},0.0\n" for leaf in ("a", "b") for _ in range(200)))
    cfg = dict(requests=400, shares={"a": 1.0, "b": 1.0}, service="deterministic", service_mean=0.01,
               arrivals="trace", trace=str(trace))
    apart = simulate(two_leaves(), SimConfig(**cfg)).summary
    slowed = simulate(two_leaves(), SimConfig(interference=0.5, **cfg)).summary
    assert apart["makespan_s"] == pytest.approx(2.0)
    assert slowed["makespan_s"] == pytest.approx(3.0)
    assert slowed["latency"]["mean_s"] == pytest.approx(1.5 * apart["latency"]["mean_s"], rel=0.01)
    assert slowed["config"]["interference"] == 0.5


def test_interference_and_hosts_together_share_then_slow(tmp_path):
    """Each leaf on a 1-core host of its own: the two hosts' cores slow each other; the same on one 1-core host:
    one busy core, no interference, the 4 s of processor sharing."""
    trace = tmp_path / "burst.csv"
    trace.write_text("".join(f"{leaf},0.0\n" for leaf in ("a", "b") for _ in range(200)))
    cfg = dict(requests=400, shares={"a": 1.0, "b": 1.0}, service="deterministic", service_mean=0.01,
               arrivals="trace", trace=str(trace), interference=0.5)

    def on(hosts, where):
        spec = two_leaves()
        nodes = tuple(Node(**{**n.__dict__, "host": where.get(n.id)}) for n in spec.nodes)
        return validate(CisSpec(nodes, 2, hosts=hosts))

    two = simulate(on((Host("x", 1), Host("y", 1)), {"a": "x", "b": "y"}), SimConfig(**cfg)).summary
    one = simulate(on((Host("x", 1),), {"a": "x", "b": "x"}), SimConfig(**cfg)).summary
    assert two["makespan_s"] == pytest.approx(3.0)
    assert one["makespan_s"] == pytest.approx(4.0)
    assert one["hosts"]["x"]["utilisation"] == pytest.approx(1.0)


def test_a_negative_interference_is_refused():
    with pytest.raises(CisError, match="interference"):
        simulate(two_leaves(), SimConfig(requests=10, interference=-0.1))


def test_the_latency_profile_file_carries_the_interference(run_cli, tmp_path):
    spec = tmp_path / "two.toml"
    write_spec(two_leaves(), spec)
    profile = tmp_path / "latency.json"
    profile.write_text(json.dumps({"stages": {"1": {"1": 0.002}, "2": {"1": 0.003}}, "interference": 0.25}))
    data = run_cli("simulate", "--spec", spec, "--requests", 200, "--loopback", "--service", "deterministic",
                   "--latency-profile", profile, "--json").json()
    assert data["config"]["interference"] == 0.25
    pathlib.Path(profile).write_text(json.dumps({"stages": {"1": {"1": 0.002}}, "interference": "lots"}))
    bad = run_cli("simulate", "--spec", spec, "--requests", 200, "--latency-profile", profile)
    assert bad.code == 2 and "--latency-profile" in bad.err
