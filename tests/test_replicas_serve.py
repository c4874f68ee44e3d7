"""Replicas through the commands (issue 41 item 3): ``cis serve --all`` starts every replica, each its own process
and address, and gives every child all of its parent's; ``cis status --cluster`` and ``--spec`` show one row per
replica; ``--node`` names a replica or says which exist; a replica that cannot start is one line; ``cis testbed``
puts each replica on its own host, with a shaped link from each child to each replica."""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import start, started_nodes, stop  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.spec import Link, write_spec  # noqa: E402
from cis.core.topologies import make_spec  # noqa: E402
from cis.runtime.client import Client  # noqa: E402
from cis.runtime.ports import free_port  # noqa: E402
from cis.runtime.testbed.plan import link_names, plan_network  # noqa: E402

FAST = ("--heartbeat", "0.1", "--forward-timeout", "0.5", "--no-cap", "--threshold", "inf")


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("replicas"), steps=20)  # forced thresholds: untrained is fine


def _two_cloud(bundle_dir: Path, folder: Path, **cloud) -> Path:
    """cloud (2 replicas) with device0 under it, at free ports unless ``cloud`` names addresses."""
    spec = load_bundle(bundle_dir).spec
    nodes = {n.id: n for n in spec.nodes}
    port = free_port()
    c = dataclasses.replace(nodes["cloud"], replicas=2, address=None, **cloud)
    d = dataclasses.replace(nodes["device0"], parent="cloud", address=f"tcp://127.0.0.1:{port}")
    path = folder / "two.toml"
    write_spec(spec.replace_nodes([c, d]), path)
    return path


def test_serve_all_starts_every_replica_and_status_shows_each(bundle_dir, tmp_path, run_cli):
    spec = _two_cloud(bundle_dir, tmp_path, addresses=tuple(f"tcp://127.0.0.1:{free_port()}" for _ in range(2)))
    logs = tmp_path / "logs"
    proc = start("serve", bundle_dir, "--all", "--spec", spec, "--json", "--log-dir", logs, *FAST,
                 "--spans-file", logs / "{node}.spans.jsonl")
    try:
        nodes = started_nodes(proc)
        assert set(nodes) == {"cloud#0", "cloud#1", "device0"}
        assert nodes["cloud#1"]["node"] == "cloud" and nodes["cloud#0"]["pid"] != nodes["cloud#1"]["pid"]
        x = np.random.default_rng(0).standard_normal((40, 1, 8, 8)).astype(np.float32)
        with Client(nodes["device0"]["address"], timeout=20) as c:
            results = c.infer_many(x, window=1)
        assert all(r.error is None and r.served_by == ["cloud"] and not r.degraded.any() for r in results)
        cluster = json.loads((logs / "cluster.json").read_text())["nodes"]
        assert cluster["cloud#1"]["address"] == nodes["cloud#1"]["address"] and cluster["cloud#1"]["node"] == "cloud"
        st = run_cli("status", "--cluster", str(logs), "--json").json()["nodes"]
        assert st["cloud#0"]["replica"] == "cloud#0" and st["cloud#1"]["replica"] == "cloud#1"
        assert st["cloud#0"]["served"] > 0 and st["cloud#1"]["served"] > 0  # device0 spread its forwards
        assert st["cloud#0"]["served"] + st["cloud#1"]["served"] == 40
        assert [p["up"] for p in st["device0"]["parents"]] == [True, True]
        by_spec = run_cli("status", "--spec", str(spec))
        assert by_spec.code == 0 and "cloud#1" in by_spec.out and "parents up 2/2" in by_spec.out
        assert (logs / "cloud#1.log").is_file()
        np.savez(tmp_path / "x.npz", x=x[:6])  # --out names each sample's entry: one node's replicas only
        both = f"{nodes['cloud#0']['address']},{nodes['cloud#1']['address']}"
        res = run_cli("infer", "--connect", both, "--dataset", str(tmp_path / "x.npz"), "--out", tmp_path / "r.csv")
        with (tmp_path / "r.csv").open() as rows:
            assert res.code == 0 and {row["entry"] for row in csv.DictReader(rows)} == {"cloud"}, res.err
        mixed = f"{nodes['device0']['address']},{nodes['cloud#0']['address']}"
        res = run_cli("infer", "--connect", mixed, "--dataset", str(tmp_path / "x.npz"), "--out", tmp_path / "m.csv")
        assert res.code == 2 and "the addresses are nodes device0, cloud;" in res.err, res.err
        assert not (tmp_path / "m.csv").exists()
    finally:
        assert stop(proc) == 0
    for rid in ("cloud#0", "cloud#1"):  # each replica its own spans file (one file shared by two writers tears lines)
        spans = [json.loads(line) for line in (logs / f"{rid}.spans.jsonl").read_text().splitlines()]
        assert spans and {s["node"] for s in spans} == {"cloud"}  # the spans name the node, as results do
    assert not (logs / "cloud.spans.jsonl").exists()


def test_node_names_a_replica_and_a_replica_that_cannot_start_is_one_line(bundle_dir, tmp_path, run_cli):
    spec = _two_cloud(bundle_dir, tmp_path)
    for name, said in (("cloud#5", "node 'cloud' runs as 2 replicas: cloud#0, cloud#1; expected one of those, "
                                   "not 'cloud#5'"),
                       ("cloud", "node 'cloud' runs as 2 replicas"), ("cloud#x", "'cloud#x' is not a replica id")):
        res = run_cli("serve", str(bundle_dir), "--spec", str(spec), "--node", name)
        assert res.code == 2 and said in res.err and len(res.err.strip().splitlines()) == 1, res.err
    import zmq

    taken = zmq.Context.instance().socket(zmq.ROUTER)  # cloud#1's address is taken: it can never come up
    port = taken.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=30000)
    try:
        spec = _two_cloud(bundle_dir, tmp_path, addresses=(f"tcp://127.0.0.1:{free_port()}",
                                                           f"tcp://127.0.0.1:{port}"))
        res = run_cli("serve", str(bundle_dir), "--all", "--spec", str(spec), *FAST)
        assert res.code == 2 and "node 'cloud#1' exited with status" in res.err, res.err
        assert len(res.err.strip().splitlines()) == 1
    finally:
        taken.close(0)


def test_the_testbed_plan_gives_each_replica_a_host_and_each_child_a_link_to_each():
    spec = make_spec("paper-7", "60-30-10")
    spec = spec.replace_nodes(
        dataclasses.replace(n, replicas=3, address=None) if n.id == "cloud" else n for n in spec.nodes
    )
    plan = plan_network(spec, "77")
    assert set(plan.nodes) >= {"cloud#0", "cloud#1", "cloud#2"} and len(plan.nodes) == 9
    assert len({n.namespace for n in plan.nodes.values()}) == 9
    edge_links = link_names(plan, "edge0")
    assert edge_links == ["edge0>cloud#0", "edge0>cloud#1", "edge0>cloud#2"]
    assert [plan.links[k].child_if for k in edge_links] == ["uplink", "uplink1", "uplink2"]
    assert link_names(plan, "device0") == ["device0"] and plan.links["device0"].parent == "edge0"
    ips = [ip for link in plan.links.values() for ip in (link.child_ip, link.parent_ip)]
    assert len(set(ips)) == len(ips)


@pytest.mark.skipif(not __import__("test_testbed")._can_make_namespaces(), reason="needs root, ip and tc")
def test_on_a_testbed_a_partitioned_replica_is_skipped(bundle_dir, tmp_path):
    from cis.core.spec import CisSpec, Node, validate
    from cis.runtime.testbed.bed import start as start_bed

    spec = validate(CisSpec((Node("root", 3, replicas=2), Node("leaf", 1, parent="root", link=Link(1e7, 0.001))),
                            3, name="two"))
    write_spec(spec, tmp_path / "two.toml")
    bed = start_bed(bundle_dir, spec, str(tmp_path / "two.toml"), extra_args=list(FAST))
    try:
        assert bed.plan.nodes["root#0"].namespace != bed.plan.nodes["root#1"].namespace
        x = np.random.default_rng(0).standard_normal((20, 1, 8, 8)).astype(np.float32)
        with Client(bed.addresses["leaf"], timeout=15) as c:
            assert all(r.served_by == ["root"] for r in c.infer_many(x, window=1))
            bed.link_down("leaf>root#0")  # only the link to replica 0
            time.sleep(1.5)  # heartbeats every 0.1 s: down after 1 s without a pong
            cut = c.infer_many(x, window=1)
            st = c.status()
        assert all(r.error is None and r.served_by == ["root"] and not r.degraded.any() for r in cut)
        assert [p["up"] for p in st["parents"]] == [False, True]
    finally:
        bed.stop()


def test_launch_from_python_serves_the_spec_it_was_given_without_a_file(bundle_dir, tmp_path):
    """docs/runtime.md: ``launch(bundle, spec, free_ports=True)``. A spec that is not the bundle's (here cloud
    with 2 replicas) reaches the nodes as a file launch writes; before, they served the bundle's spec."""
    from cis.core.spec import load_spec
    from cis.runtime.launcher import launch, spec_for_nodes

    spec = load_spec(_two_cloud(bundle_dir, tmp_path))
    with launch(bundle_dir, spec, free_ports=True, extra_args=FAST) as cluster:
        assert set(cluster.procs) == {"cloud#0", "cloud#1", "device0"}
        written = Path(cluster.spec_file or "")
        assert load_spec(written) == spec
        x = np.random.default_rng(1).standard_normal((8, 1, 8, 8)).astype(np.float32)
        with Client(cluster.addresses["device0"], timeout=20) as c:
            assert all(r.error is None and r.served_by == ["cloud"] for r in c.infer_many(x, window=1))
    assert not written.exists()  # launch's own temporary file goes with the cluster
    assert spec_for_nodes(bundle_dir, load_bundle(bundle_dir).spec, None) is None  # the nodes read the bundle's


def test_a_node_whose_address_is_taken_says_so_in_one_line(bundle_dir, run_cli):
    import zmq

    taken = zmq.Context.instance().socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=30000)
    try:
        res = run_cli("serve", str(bundle_dir), "--node", "cloud", "--bind", f"tcp://127.0.0.1:{port}")
    finally:
        taken.close(0)
    said = f"cis serve: error: node cloud: cannot bind tcp://127.0.0.1:{port} (Address already in use)"
    assert res.code == 2 and res.err.strip().splitlines()[-1].startswith(said), res.err
    assert "Traceback" not in res.err


def test_serve_all_of_a_spec_the_bundle_does_not_fit_is_one_line_before_any_node_starts(bundle_dir, tmp_path, run_cli):
    spec = tmp_path / "p17.toml"
    write_spec(make_spec("paper-17", "60-30-10"), spec)
    res = run_cli("serve", str(bundle_dir), "--all", "--spec", str(spec), "--free-ports")
    (line,) = res.err.strip().splitlines()  # not a line from every node among their start and stop logs
    assert res.code == 2 and "has no threshold for it; expected a bundle exported for this spec" in line, res.err
