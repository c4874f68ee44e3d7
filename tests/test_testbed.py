"""The testbed: nodes in network namespaces behind tbf-shaped links (cis testbed, cis link, cis.runtime.testbed).

The plan (names, addresses) is checked everywhere; what needs namespaces (root, ip, tc) skips cleanly where
they cannot be made. On a testbed: a forwarded request's latency grows with its message size over the link's
bandwidth, a partition is answered degraded and heals, ``cis link`` changes a running testbed, and nothing is
left behind (not even by a testbed that was killed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.spec import CisSpec, Link, Node, validate, write_spec
from cis.core.topologies import make_spec
from cis.runtime.testbed import net
from cis.runtime.testbed.plan import IFNAME_MAX, plan_network


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = f"cistb-test-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


needs_namespaces = pytest.mark.skipif(not _can_make_namespaces(), reason="needs root, ip and tc (network namespaces)")
SLOW = 20_000.0  # bytes/s: a 4 kB carry takes ~0.2 s


def three_tiers(leaf_bandwidth: float = SLOW) -> CisSpec:
    return validate(
        CisSpec(
            (
                Node("root", 3),
                Node("edge", 2, parent="root", link=Link(1e7, 0.02)),
                Node("leaf", 1, parent="edge", arrival_rate=1.0, link=Link(leaf_bandwidth, 0.005)),
            ),
            3,
            name="three",
        )
    )


# ---------------------------------------------------------------- the plan (no root needed)


def test_the_plan_gives_every_node_a_namespace_an_address_and_every_child_a_link():
    spec = make_spec("paper-17", "60-30-10")
    plan = plan_network(spec, "4194303")
    assert len(plan.nodes) == 17 and set(plan.links) == {n.id for n in spec.nodes if n.parent}
    addresses = [n.address for n in plan.nodes.values()]
    assert len(set(addresses)) == 17 and all(a.startswith("tcp://10.213.") and a.endswith(":5555") for a in addresses)
    ips = [ip for n in plan.nodes.values() for ip in (n.caller_ip, n.node_ip)]
    ips += [ip for link in plan.links.values() for ip in (link.child_ip, link.parent_ip)]
    assert len(set(ips)) == len(ips)
    assert all(len(n.access_if) <= IFNAME_MAX for n in plan.nodes.values())
    assert {n.namespace for n in plan.nodes.values()} == {f"cistb-4194303-{i}" for i in range(17)}
    link = plan.links["device0"]
    assert (link.parent, link.bandwidth, link.latency) == ("edge0", 2.5e6, 0.005)
    assert plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_plan_that_cannot_work_is_one_line():
    spec = make_spec("paper-7", "60-30-10")
    with pytest.raises(CisError, match="--subnet 10.0.0.0/29 has 8 addresses; expected at least 56"):
        plan_network(spec, "1", "10.0.0.0/29")
    with pytest.raises(CisError, match="--subnet 'ten'"):
        plan_network(spec, "1", "ten")


def test_without_root_or_tools_the_testbed_stops_with_one_line(run_cli, monkeypatch, tmp_path):
    monkeypatch.setattr(net.os, "geteuid", lambda: 1000)
    with pytest.raises(CisError, match="needs root"):
        net.require_tools()
    res = run_cli("testbed", tmp_path / "spec.toml", tmp_path / "bundle")
    assert res.code == 2 and "needs root" in res.err and len(res.err.strip().splitlines()) == 1
    monkeypatch.setattr(net.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    res = run_cli("link", "show")
    assert res.code == 2 and "needs the 'tc' command (iproute2)" in res.err


# ---------------------------------------------------------------- on a testbed


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("testbed"), steps=20)  # thresholds are forced: untrained is fine


def _median_latency(address: str, x: np.ndarray, n: int = 5) -> tuple[float, list]:
    from cis.runtime.client import Client

    with Client(address, timeout=15) as c:
        results = [c.infer(x[i : i + 1]) for i in range(n)]
    return float(np.median([r.latency for r in results])), results


@needs_namespaces
def test_a_forward_takes_its_size_over_the_bandwidth_and_a_partition_is_answered_degraded(bundle_dir, tmp_path):
    from cis.core.bundle import load_bundle
    from cis.runtime.testbed.bed import start
    from cis.sim.links import wire_bytes

    spec = three_tiers()
    write_spec(spec, tmp_path / "three.toml")
    x = np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32)
    carry = load_bundle(bundle_dir).stage(1).carry_bytes_per_sample()
    forced = {"leaf": ["--threshold", "inf"], "edge": ["--threshold", "inf"]}
    bed = start(bundle_dir, spec, str(tmp_path / "three.toml"), node_args=forced,
                extra_args=["--no-cap", "--heartbeat", "0.1", "--forward-timeout", "0.5"])
    namespaces = {n.namespace for n in bed.plan.nodes.values()}
    try:
        assert namespaces <= set(net.run("ip", "netns", "list").split())
        assert bed.describe("leaf")["link"] == {"bandwidth": SLOW, "latency": 0.0 if not bed.netem else 0.005}
        slow, results = _median_latency(bed.addresses["leaf"], x)
        assert all(r.served_by == ["root"] and int(r.exit[0]) == 3 for r in results)
        assert slow >= carry / SLOW  # the carry alone takes this long on the leaf's link
        assert slow < 1.5 * wire_bytes(carry + 1000) / SLOW + 0.1  # and not much more: headers, segments, stages
        bed.set_bandwidth("leaf", 100 * SLOW)
        fast, _ = _median_latency(bed.addresses["leaf"], x)
        assert fast < slow - 0.8 * carry / SLOW  # the difference is the transfer

        bed.link_down("edge")  # the edge's uplink: the root is out of reach
        time.sleep(1.5)  # the edge notices (heartbeats every 0.1 s, down after 1 s without)
        _, cut = _median_latency(bed.addresses["leaf"], x)
        assert all(r.error is None and int(r.exit[0]) == 2 and r.degraded[0] for r in cut)
        bed.link_up("edge")
        end, back = time.monotonic() + 15, None
        while time.monotonic() < end:  # TCP retries after its backoff; then the root answers again
            _, (back,) = _median_latency(bed.addresses["leaf"], x, 1)
            if int(back.exit[0]) == 3:
                break
            time.sleep(0.2)
        assert int(back.exit[0]) == 3 and not back.degraded[0]
    finally:
        bed.stop()
    assert not namespaces & set(net.run("ip", "netns", "list").split())
    assert not (net.STATE_DIR / f"{bed.run}.json").exists()


@needs_namespaces
def test_cis_testbed_and_cis_link_from_the_command_line(bundle_dir, tmp_path, run_cli):
    from cli_process import start, started_nodes, stop

    spec_file = tmp_path / "three.toml"
    write_spec(three_tiers(leaf_bandwidth=1e6), spec_file)
    faults = tmp_path / "faults.txt"
    faults.write_text("0.5 bandwidth leaf 50000\n")
    proc = start("testbed", spec_file, bundle_dir, "--json", "--faults", faults, "--no-cap", "--threshold", "inf")
    try:
        nodes = started_nodes(proc)
        assert set(nodes) == {"root", "edge", "leaf"}
        assert nodes["leaf"]["namespace"].startswith("cistb-") and nodes["leaf"]["link"]["bandwidth"] == 1e6
        assert nodes["root"]["link"] is None and nodes["leaf"]["address"].startswith("tcp://10.213.")
        time.sleep(1.0)  # the scheduled fault is due
        shown = run_cli("link", "show", "--json").json()
        assert shown["links"]["leaf"]["up_bytes_per_s"] == 50000 and shown["links"]["edge"]["state"] == "up"
        down = run_cli("link", "down", "edge", "--json").json()
        assert down["state"] == "down" and down["parent"] == "root"
        assert run_cli("link", "up", "edge", "--json").json()["state"] == "up"
        reshaped = run_cli("link", "set", "leaf", "--bandwidth", "2e5", "--json").json()
        assert reshaped["up_bytes_per_s"] == reshaped["down_bytes_per_s"] == 200000
        bad = run_cli("link", "down", "root")
        assert bad.code == 2 and "node 'root' has no link; expected one of edge, leaf" in bad.err
        assert run_cli("link", "set", "leaf").code == 2
    finally:
        assert stop(proc) == 0
    run_id = nodes["leaf"]["namespace"].split("-")[1]
    assert not [ns for ns in net.run("ip", "netns", "list").split() if ns.startswith(f"cistb-{run_id}-")]
    res = run_cli("link", "show")
    assert res.code == 2 and "no testbed is running" in res.err


@needs_namespaces
def test_what_a_killed_testbed_left_is_removed_at_the_next_start():
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    stale = f"cistb-{gone.pid}-0"
    net.run("ip", "netns", "add", stale)
    try:
        assert stale in net.remove_stale()
        assert stale not in net.run("ip", "netns", "list").split()
    finally:
        net.run("ip", "netns", "del", stale, check=False)
