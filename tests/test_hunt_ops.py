"""What a newcomer's hunt of the deploy, testbed and closed-loop docs found, each pinned to its doc.

- ``cis spec update DESIGN -o DESIGN`` is refused: DESIGN itself is left as it is (docs/closed-loop.md);
- ``cis deploy kubernetes --set provider=cuda`` makes every node a GPU node (image, GPU, toleration), as the
  spec's provider would (docs/deploy.md, *GPU*);
- ``--cluster-domain`` must be a DNS name ("" included); a parent at ``tcp://[::]:PORT`` only binds and is
  refused as ``*`` and ``0.0.0.0`` are; a front door that ``--set`` opens but that binds loopback gets a note;
- ``cis testbed --subnet`` is refused where it overlaps a local-table route (loopback), and a testbed without an
  onnxruntime says so in serve's one line before any namespace is made.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cis.cli.commands.deploy.plan import Endpoint
from cis.core.errors import CisError
from cis.core.spec import CisSpec, write_spec
from cis.core.topologies import make_spec
from cis.runtime.testbed import net
from cis.runtime.testbed.plan import overlaps, plan_network

ROOT = Path(__file__).resolve().parents[1]


def _addressed(spec: CisSpec, cloud_host: str = "127.0.0.1") -> CisSpec:
    """paper-7 with every node at a loopback port (the cloud at ``cloud_host``)."""
    nodes = (
        dataclasses.replace(n, address=f"tcp://{cloud_host if n.id == 'cloud' else '127.0.0.1'}:{5550 + i}")
        for i, n in enumerate(spec.nodes)
    )
    return spec.replace_nodes(nodes)


def _one_line(res, *words: str) -> None:
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1, res.err
    assert all(w in lines[0] for w in words), lines[0]


# ---------------------------------------------------------------- 3: cis spec update -o DESIGN


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, Path]:
    """A paper-7 design and a requests file the simulator wrote for it (no bundle: the spec's own rates)."""
    from cis.cli.main import main

    tmp = tmp_path_factory.mktemp("update")
    write_spec(make_spec("paper-7", "80-15-5", total_rate=40.0), tmp / "design.toml")
    assert main(["simulate", "--spec", str(tmp / "design.toml"), "--requests", "200", "--out", str(tmp / "sim"),
                 "--json"]) == 0  # fmt: skip
    return {"design": tmp / "design.toml", "requests": tmp / "sim" / "requests.csv"}


def test_spec_update_refuses_to_write_over_its_design(measured, run_cli, tmp_path):
    design = tmp_path / "design.toml"
    shutil.copy(measured["design"], design)
    before = design.read_bytes()
    (tmp_path / "link.toml").symlink_to(design)
    for out in (design, tmp_path / "sub" / ".." / "design.toml", tmp_path / "link.toml"):
        res = run_cli("spec", "update", design, "--rates-from", measured["requests"], "-o", out)
        _one_line(res, f"-o {out}", "is the design", "leaves as it is")
        assert design.read_bytes() == before
    res = run_cli("spec", "update", design, "--rates-from", measured["requests"], "-o", tmp_path / "measured.toml")
    assert res.code == 0, res.err
    assert design.read_bytes() == before and "-measured" in (tmp_path / "measured.toml").read_text()


# ---------------------------------------------------------------- 11: a parent that only binds


@pytest.mark.parametrize("host", ["*", "0.0.0.0", "[::]", "[0:0::0]", "::", ""])
def test_an_unspecified_address_only_binds(host):
    assert not Endpoint(host, 5550).connectable


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "cloud.example.net", "10.0.0.7"])
def test_a_reachable_address_connects(host):
    assert Endpoint(host, 5550).connectable


def test_systemd_refuses_a_parent_at_the_ipv6_any_address(run_cli, tmp_path):
    spec = tmp_path / "spec.toml"
    write_spec(_addressed(make_spec("paper-7", "80-15-5"), "[::]"), spec)
    _one_line(run_cli("deploy", "systemd", spec, "-o", tmp_path / "out"), "tcp://[::]:5550 only binds", "reach")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 4, 8, 11: cis deploy kubernetes


@pytest.fixture(scope="module")
def kube(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_bundle

    tmp = tmp_path_factory.mktemp("kube")
    bundle = make_demo_bundle(tmp / "b", steps=20)
    write_spec(_addressed(make_spec("paper-7", "80-15-5")), tmp / "spec.toml")
    return {"bundle": bundle, "spec": tmp / "spec.toml"}


def _kube(run_cli, kube, out: Path, *flags: str):
    res = run_cli("deploy", "kubernetes", kube["spec"], kube["bundle"], "-o", out, *flags, "--json")
    assert res.code == 0, res.err
    return res.json()


def test_set_provider_cuda_makes_every_node_a_gpu_node(run_cli, kube, tmp_path):
    out = tmp_path / "k8s"
    result = _kube(run_cli, kube, out, "--set", "provider=cuda", "--image-gpu", "reg/cis:gpu")
    assert {d["image"] for d in result["nodes"].values()} == {"reg/cis:gpu"}
    assert {d["gpus"] for d in result["nodes"].values()} == {1}
    for path in out.glob("node-*.yaml"):
        deployment = next(o for o in yaml.safe_load_all(path.read_text()) if o["kind"] == "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == "reg/cis:gpu", path.name
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"name": "CIS_PROVIDER", "value": "cuda"} in container["env"]
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    cpu = _kube(run_cli, kube, tmp_path / "cpu", "--set", "provider=cpu")
    assert {d["gpus"] for d in cpu["nodes"].values()} == {0}


@pytest.mark.parametrize("domain", ["bad domain", "", "cluster..local", "-x.local", "Cluster.Local", "a_b.local"])
def test_a_cluster_domain_that_is_not_a_dns_name_is_one_line(run_cli, kube, tmp_path, domain):
    out = tmp_path / "k8s"
    res = run_cli("deploy", "kubernetes", kube["spec"], kube["bundle"], "-o", out, f"--cluster-domain={domain}")
    _one_line(res, f"--cluster-domain {domain!r}", "DNS name")
    assert not out.exists()


def test_a_cluster_domain_goes_into_every_parent_address(run_cli, kube, tmp_path):
    out = tmp_path / "k8s"
    _kube(run_cli, kube, out, "--cluster-domain", "edge-1.example")
    text = (out / "node-cis-edge0.yaml").read_text()
    assert "tcp://cis-cloud.cis.svc.edge-1.example:5550" in text


def test_a_door_that_binds_loopback_in_its_pod_gets_a_note(run_cli, kube, tmp_path):
    notes = _kube(run_cli, kube, tmp_path / "a", "--set", "http_port=8000")["notes"]
    assert any("http_port=8000" in n and "http_host=0.0.0.0" in n for n in notes), notes
    res = run_cli("deploy", "kubernetes", kube["spec"], kube["bundle"], "-o", tmp_path / "h", "--set",
                  "grpc_port=8001")  # fmt: skip
    assert res.code == 0 and "note: --set grpc_port=8001: the door binds 127.0.0.1" in res.out, res.out
    reachable = _kube(run_cli, kube, tmp_path / "b", "--set", "http_port=8000", "--set", "http_host=0.0.0.0")
    assert not any("http_port" in n for n in reachable["notes"])


# ---------------------------------------------------------------- 7, 10: cis testbed


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs the ip command (iproute2)")
def test_the_caller_routes_include_the_local_table():
    routes = net.caller_routes()
    assert "127.0.0.0/8" in routes, routes
    plan = plan_network(make_spec("paper-7", "80-15-5"), "1", "127.0.0.0/16")
    assert overlaps(plan, routes) == "127.0.0.0/8"
    assert overlaps(plan_network(make_spec("paper-7", "80-15-5"), "1"), routes) is None  # the default subnet


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")),
                    reason="needs root, ip and tc")  # fmt: skip
def test_a_testbed_on_a_loopback_subnet_is_refused_before_anything_is_made():
    from cis.runtime.testbed.bed import start

    with pytest.raises(CisError, match=r"--subnet 127\.0\.0\.0/16 overlaps this machine's route to 127\.0\.0\.0/8"):
        start("nowhere", make_spec("paper-7", "80-15-5"), subnet="127.0.0.0/16")
    assert not [ns for ns in net.run("ip", "netns", "list").split("\n") if ns.startswith(f"cistb-{os.getpid()}-")]


def test_a_testbed_without_an_onnxruntime_says_serves_one_line(tmp_path):
    """As on a core install: onnxruntime cannot be imported. The line comes before root, tools or files."""
    code = "import sys; sys.modules['onnxruntime'] = None; from cis.cli.main import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    res = subprocess.run([sys.executable, "-c", code, "testbed", str(tmp_path / "spec.toml"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "cis testbed: needs the 'cpu' extra: pip install 'cis-inference[cpu]' (or 'cis-inference[gpu]' for "
        "onnxruntime-gpu on an NVIDIA GPU) (not installed: onnxruntime)"
    ]


@pytest.mark.parametrize("flag", ["--namespace", "--image-cpu", "--image-gpu"])
def test_an_empty_deploy_option_is_one_line_not_the_default(run_cli, kube, tmp_path, flag):
    out = tmp_path / "k8s"
    res = run_cli("deploy", "kubernetes", kube["spec"], kube["bundle"], "-o", out, f"{flag}=")
    _one_line(res, f"{flag} '' is empty", "expected a value")
    assert not out.exists()
