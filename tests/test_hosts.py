"""Nodes that share a machine: the spec's ``host`` and ``[hosts]``, the simulator sharing a host's cores among
its nodes' batches, and the testbed pinning each host's nodes to that many cores (taskset)."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from cis.core.errors import CisError, SpecError
from cis.core.spec import CisSpec, Host, Node, load_spec, parse_spec, validate, write_spec
from cis.runtime.testbed.plan import core_sets
from cis.sim import SimConfig, simulate
from cis.sim.cores import Cores

SPEC = """
[cis]
exits = 2

[hosts]
box0 = { cores = 1 }
box1 = { cores = 2 }

[[nodes]]
id = "root"
exit = 2
host = "box1"

[[nodes]]
id = "a"
parent = "root"
exit = 1
arrival_rate = 5.0
host = "box0"

[[nodes]]
id = "b"
parent = "root"
exit = 1
arrival_rate = 5.0
host = "box0"
"""


def parse(text: str):
    from cis.core.spec_file import tomllib  # tomli on Python 3.10

    return parse_spec(tomllib.loads(textwrap.dedent(text)), "hosts.toml")


# ---------------------------------------------------------------- the spec


def test_hosts_are_read_written_back_and_name_their_nodes(tmp_path):
    spec = parse(SPEC)
    assert spec.hosts == (Host("box0", 1), Host("box1", 2))
    assert [n.id for n in spec.on_host("box0")] == ["a", "b"] and spec.node("root").host == "box1"
    write_spec(spec, tmp_path / "again.toml")
    assert load_spec(tmp_path / "again.toml") == spec
    assert spec.replace_nodes(spec.nodes).hosts == spec.hosts  # rebuilt specs keep their hosts
    alone = parse(SPEC.replace('host = "box0"', "").replace('host = "box1"', ""))
    assert all(n.host is None for n in alone.nodes)  # a host with no nodes is allowed; a node needs none


@pytest.mark.parametrize(
    "change, expected",
    [
        (('box0 = { cores = 1 }', 'box0 = { cores = 0 }'), "host 'box0': field 'cores' is 0; expected a value >= 1"),
        (('box0 = { cores = 1 }', 'box0 = { cores = 1.5 }'), "field 'cores' is 1.5; expected an integer >= 1"),
        (('box0 = { cores = 1 }', 'box0 = { cores = 1, ram = 4 }'), "host 'box0': unknown key 'ram'; expected one of"),
        (('box0 = { cores = 1 }', 'box0 = {}'), "host 'box0': missing 'cores'"),
        (('box0 = { cores = 1 }', 'box0 = 1'), "host 'box0' is 1; expected a table with 'cores'"),
        (('host = "box1"', 'host = "box9"'), "node 'root': field 'host' is 'box9'; expected one of box0, box1"),
        (('host = "box1"', 'host = 7'), "node 'root': field 'host' is 7; expected the name of a host"),
    ],
)
def test_a_bad_host_is_one_line_naming_the_file_and_field(change, expected):
    with pytest.raises(SpecError) as err:
        parse(SPEC.replace(*change, 1))
    assert expected in str(err.value) and str(err.value).startswith("hosts.toml") and "\n" not in str(err.value)


def test_a_node_on_a_host_needs_a_hosts_table():
    expected = "node 'root': field 'host' is 'box1'; expected a host of the \\[hosts\\] table"
    with pytest.raises(SpecError, match=expected):
        parse(SPEC.replace("[hosts]\nbox0 = { cores = 1 }\nbox1 = { cores = 2 }\n", ""))


# ---------------------------------------------------------------- the simulator


def two_leaves(hosts=(), on=None, rate: float = 40.0) -> CisSpec:
    """Two leaves that keep every request (shares 1) under a root: two independent queues, each on its host."""
    on = on or {}
    return validate(CisSpec((
        Node("root", 2, host=on.get("root")),
        Node("a", 1, parent="root", arrival_rate=rate, host=on.get("a")),
        Node("b", 1, parent="root", arrival_rate=rate, host=on.get("b")),
    ), 2, hosts=tuple(hosts)))


def test_processor_sharing_gives_each_running_batch_its_share_of_the_cores():
    import simpy

    env = simpy.Environment()
    cores, done = Cores(env, 1), {}

    def job(name, start, work):
        yield env.timeout(start)
        yield cores.run(work)
        done[name] = env.now

    for name, start, work in (("x", 0.0, 2.0), ("y", 1.0, 1.0)):
        env.process(job(name, start, work))
    env.run()
    # x alone for 1 s (1 s of work left), then both at half speed: y's 1 s takes 2 s, x finishes with it
    assert done == {"x": pytest.approx(3.0), "y": pytest.approx(3.0)}
    assert cores.busy == pytest.approx(3.0)


def test_two_nodes_on_one_core_take_twice_as_long_as_on_their_own_under_load():
    """A burst of 200 requests at each leaf at once, 10 ms each: on their own machines each leaf works 2 s; on one
    shared core both take 4 s, and the mean latency doubles. With two cores on the host nothing changes."""
    trace = "".join(f"{leaf},0.0\n" for leaf in ("a", "b") for _ in range(200))
    cfg = dict(requests=400, shares={"a": 1.0, "b": 1.0}, service="deterministic", service_mean=0.01)

    def run(hosts, on, tmp):
        tmp.write_text(trace)
        return simulate(two_leaves(hosts, on), SimConfig(arrivals="trace", trace=str(tmp), **cfg)).summary

    import pathlib
    import tempfile

    tmp = pathlib.Path(tempfile.mkdtemp()) / "burst.csv"
    apart = run((), {}, tmp)
    shared = run((Host("box", 1),), {"a": "box", "b": "box"}, tmp)
    roomy = run((Host("box", 2),), {"a": "box", "b": "box"}, tmp)
    assert apart["makespan_s"] == pytest.approx(2.0)
    assert shared["makespan_s"] == pytest.approx(4.0)
    assert shared["latency"]["mean_s"] == pytest.approx(2 * apart["latency"]["mean_s"], rel=0.01)
    assert roomy["latency"] == apart["latency"]
    assert shared["hosts"]["box"] == {"cores": 1, "nodes": ["a", "b"], "utilisation": pytest.approx(1.0)}


def test_a_shared_core_is_one_processor_sharing_queue_for_poisson_loads():
    """Each leaf an M/M/1 at utilisation 0.4 on its own (mean 1/(mu - lambda)); on one core the two are one
    processor-sharing server at 0.8, whose mean time in system is 1/(mu - 2 lambda) for every customer."""
    mu, lam = 100.0, 40.0
    cfg = dict(requests=60_000, shares={"a": 1.0, "b": 1.0}, service="exponential", service_mean=1 / mu)
    apart = [simulate(two_leaves(rate=lam), SimConfig(seed=s, **cfg)).summary["latency"]["mean_s"] for s in (0, 1)]
    shared = [
        simulate(two_leaves((Host("box", 1),), {"a": "box", "b": "box"}, lam), SimConfig(seed=s, **cfg)).summary
        for s in (0, 1)
    ]
    assert np.mean(apart) == pytest.approx(1 / (mu - lam), rel=0.05)
    assert np.mean([r["latency"]["mean_s"] for r in shared]) == pytest.approx(1 / (mu - 2 * lam), rel=0.08)
    assert shared[0]["nodes"]["a"]["utilisation"] == pytest.approx(0.4, abs=0.02)  # its own work, not the wait


# ---------------------------------------------------------------- the testbed


def test_each_host_gets_its_own_cores_in_order_and_unhosted_nodes_are_not_pinned():
    spec = parse(SPEC)
    assert core_sets(spec, [0, 1, 2, 3]) == {"a": [0], "b": [0], "root": [1, 2]}
    assert core_sets(spec, [5, 3, 4]) == {"a": [3], "b": [3], "root": [4, 5]}
    assert core_sets(parse(SPEC.replace('host = "box1"', "")), [0, 1, 2]) == {"a": [0], "b": [0]}
    with pytest.raises(CisError, match=r"\[hosts\] ask for 3 cores \(box0 1, box1 2\); this machine lets the "
                                       r"testbed use 2 \(0, 1\): expected at most 2 in all"):
        core_sets(spec, [0, 1])


def _can_make_namespaces() -> bool:
    from test_testbed import _can_make_namespaces as can

    return can()


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not _can_make_namespaces(), reason="needs root, ip, tc and two cores"
)
def test_a_testbed_pins_each_hosts_nodes_to_its_cores(tmp_path, bundle_dir):
    from cis.runtime.client import Client
    from cis.runtime.testbed import net
    from cis.runtime.testbed.bed import start

    cpus = sorted(os.sched_getaffinity(0))
    spec = validate(CisSpec((
        Node("root", 3, host="big"),
        Node("edge", 2, parent="root", host="small"),
        Node("leaf", 1, parent="edge", arrival_rate=1.0, host="small"),
    ), 3, hosts=(Host("small", 1), Host("big", 1))))
    write_spec(spec, tmp_path / "hosts.toml")
    bed = start(bundle_dir, spec, str(tmp_path / "hosts.toml"), extra_args=["--threshold", "inf", "--no-cap"])
    try:
        pinned = {nid: sorted(os.sched_getaffinity(p.pid)) for nid, p in bed.procs.items()}
        assert pinned == {"leaf": cpus[:1], "edge": cpus[:1], "root": cpus[1:2]}
        assert bed.describe("root")["cores"] == cpus[1:2]
        x = np.zeros((1, 1, 8, 8), np.float32)
        with Client(bed.addresses["leaf"], timeout=15) as c:
            assert c.infer(x).served_by == ["root"]  # pinned, and serving as ever
    finally:
        bed.stop()
    assert not [ns for ns in net.run("ip", "netns", "list").split() if ns.startswith(f"cistb-{bed.run}-")]


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("hosts"), steps=20)
