"""``cis deploy``: Kubernetes manifests validated against the Kubernetes API schema (kubernetes-validate, offline),
read back with PyYAML, and wired as the spec says; systemd units checked by ``systemd-analyze verify`` and their
environment files serving a real tree (each node ``cis serve BUNDLE`` with its file's variables, as the unit's
ExecStart runs it); bad input one line and exit 2, nothing written."""

from __future__ import annotations

import configparser
import dataclasses
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from cis.cli.commands import serve_config
from cis.cli.commands.deploy.kubernetes import IMAGE_UID, KubeOptions, manifests
from cis.cli.commands.deploy.plan import endpoints
from cis.cli.commands.deploy.resources import node_resources
from cis.cli.commands.deploy.yaml_text import dump_all
from cis.core import logs
from cis.core.bundle import load_bundle
from cis.core.spec import load_spec, spec_to_dict, write_spec

kubernetes_validate = pytest.importorskip("kubernetes_validate")
pytest.importorskip("torch")  # the fixture bundle is trained and exported here

from cli_process import start, stop  # noqa: E402

# the oldest and the newest Kubernetes whose API schema the package holds (every object must pass both)
KUBE_VERSIONS = ("1.29", kubernetes_validate.latest_version())


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("deploy"), steps=20)


def _spec(bundle: Path, path: Path, edit=None) -> Path:
    """The bundle's own spec (paper-7 with loopback addresses), changed by ``edit(dict)``, written to ``path``."""
    from cis.core.spec import parse_spec

    data = spec_to_dict(load_bundle(bundle).spec)
    if edit is not None:
        edit(data)
    write_spec(parse_spec(data, str(path)), path)
    return path


def _node(data: dict, node_id: str) -> dict:
    return next(n for n in data["nodes"] if n["id"] == node_id)


def _fleet(data: dict) -> None:
    """Three cloud replicas on a GPU, busy devices (so the CPU rule rises above its floor)."""
    _node(data, "cloud").update(replicas=3, provider="cuda", address="tcp://127.0.0.1:5600")  # 5600-5602: clear of
    # the other nodes' ports (replica i binds the node's port + i)
    for n in data["nodes"]:
        if n["exit"] == 1:
            n["arrival_rate"] = 4000.0
            n["max_transfer_rate"] = 1500.0
        elif n["exit"] == 2:
            n["max_transfer_rate"] = 1000.0


def _objects(out: Path) -> dict[str, list[dict]]:
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted(out.glob("*.yaml"))}


def _deploy(run_cli, *args):
    res = run_cli("deploy", *args, "--json")
    assert res.code == 0, res.err
    return res.json()


@pytest.mark.parametrize("volume", ["image", "pvc", "hostpath"])
def test_every_manifest_validates_against_the_kubernetes_api_schema(run_cli, bundle, tmp_path, volume):
    spec = _spec(bundle, tmp_path / "spec.toml", _fleet)
    out = tmp_path / "k8s"
    result = _deploy(run_cli, "kubernetes", spec, bundle, "-o", out, "--bundle-volume", volume,
                     "--node-selector", "1:kubernetes.io/arch=arm64", "--node-selector", "cloud:gpu=h200",
                     "--set", "http_port=8000", "--set", "http_host=0.0.0.0", "--set", "max_batch=16")
    objects = _objects(out)
    kinds = sorted(d["kind"] for docs in objects.values() for d in docs)
    assert kinds == ["ConfigMap", *["Deployment"] * 7, "Namespace", *["Service"] * 7]
    assert sorted(result["files"]) == sorted(str(p) for p in out.iterdir())
    for docs in objects.values():
        for doc in docs:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)  # raises on any field the API lacks
    assert (out / "Dockerfile.bundle").is_file() == (volume == "image")


def test_the_validator_refuses_a_broken_manifest(run_cli, bundle, tmp_path):
    """The check above can fail: a misspelt field and a wrong type are refused by the same schema."""
    _deploy(run_cli, "kubernetes", _spec(bundle, tmp_path / "spec.toml"), bundle, "-o", tmp_path / "k8s")
    deployment = _objects(tmp_path / "k8s")["node-cis-cloud.yaml"][0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    container["readinessProbe"] = container.pop("readinesProbe")
    deployment["spec"]["replicas"] = "3"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_manifests_wire_the_tree_as_the_spec_says(run_cli, bundle, tmp_path):
    spec_path = _spec(bundle, tmp_path / "spec.toml", _fleet)
    out = tmp_path / "k8s"
    result = _deploy(run_cli, "kubernetes", spec_path, bundle, "-o", out, "--namespace", "edge-ai", "--name", "paper7",
                     "--node-selector", "1:kubernetes.io/arch=arm64", "--set", "grpc_port=8001")
    spec, objects = load_spec(spec_path), _objects(out)
    ends = endpoints(spec, "spec")
    known = serve_config.ENV_NAMES | {logs.ENV_FORMAT}
    for n in spec.nodes:
        deployment, service = objects[f"node-paper7-{n.id}.yaml"]
        pod = deployment["spec"]["template"]
        container = pod["spec"]["containers"][0]
        env = _env(container)
        assert deployment["spec"]["replicas"] == n.replicas
        assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "edge-ai"
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert set(env) <= known, set(env) - known  # every variable is one cis serve reads
        assert env["CIS_NODE"] == n.id and env["CIS_SPEC"] == "/etc/cis/spec.toml"
        assert env["CIS_BIND"] == f"tcp://*:{ends[n.id].port}"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"zmq": ends[n.id].port, "metrics": 9100, "grpc": 8001}
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9100"
        assert annotations["cis-inference.io/bundle-sha256"] == load_bundle(bundle).sha256
        assert pod["spec"]["securityContext"]["runAsUser"] == IMAGE_UID
        assert pod["spec"]["enableServiceLinks"] is False
        if n.parent is None:
            assert "CIS_PARENT" not in env
        else:  # the parent's Service, at the parent's port, in the namespace's DNS
            parent = objects[f"node-paper7-{n.parent}.yaml"][1]
            zmq_port = next(p["port"] for p in parent["spec"]["ports"] if p["name"] == "zmq")
            assert env["CIS_PARENT"] == f"tcp://{parent['metadata']['name']}.edge-ai.svc.cluster.local:{zmq_port}"
            assert result["nodes"][n.parent]["address"] == env["CIS_PARENT"]
        tier = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert tier["preference"]["matchExpressions"][0]["values"] == [str(n.exit)]
        assert pod["spec"].get("nodeSelector") == ({"kubernetes.io/arch": "arm64"} if n.exit == 1 else None)
        assert ("podAntiAffinity" in pod["spec"]["affinity"]) == (n.replicas > 1)
        gpu = container["resources"]["limits"].get("nvidia.com/gpu")
        assert gpu == (1 if n.provider == "cuda" else None)
        assert container["image"] == ("cis-inference:0.1.0-gpu" if gpu else "cis-inference:0.1.0-cpu")
    config = objects["01-spec.yaml"][0]
    (tmp_path / "from-configmap.toml").write_text(config["data"]["spec.toml"])
    served = load_spec(tmp_path / "from-configmap.toml")  # the pods serve the spec given, each node one process:
    assert served == spec.replace_nodes(dataclasses.replace(n, replicas=1) for n in spec.nodes)  # a pod, a replica
    assert spec.node("cloud").replicas == 3 and served.node("cloud").replica_ids == ["cloud"]  # --node cloud serves


def test_resources_follow_the_documented_rule(run_cli, bundle, tmp_path):
    """CPU: headroom x (requests the calculus sends x batch-1 seconds of the stages they run) / replicas, read
    here straight from profiles/latency.json; memory: 128 MiB + 3 x weights + (batch + queue) x largest tensor."""
    spec_path = _spec(bundle, tmp_path / "spec.toml", _fleet)
    result = _deploy(run_cli, "kubernetes", spec_path, bundle, "-o", tmp_path / "k8s", "--headroom", "3")
    t = {int(k): v["1"] for k, v in json.loads((bundle / "profiles/latency.json").read_text())["stages"].items()}
    # every device gets 4000/s and forwards 1500/s; each edge takes 3000/s and forwards 1000/s; the cloud 2000/s
    edge = 3000 * (t[2])
    cloud = 2000 * t[3]
    device = 4000 * t[1]
    nodes = result["nodes"]
    for node_id, load, replicas in (("device0", device, 1), ("edge0", edge, 1), ("cloud", cloud, 3)):
        assert nodes[node_id]["load_cores"] == pytest.approx(load, rel=1e-4)
        assert nodes[node_id]["cpu"] == f"{max(100, math.ceil(3 * load / replicas * 1000))}m"
    assert nodes["cloud"]["gpus"] == 1 and nodes["edge0"]["gpus"] == 0
    assert any("no cuda latency profile" in n for n in result["notes"])  # the cloud's load came from the cpu profile
    manifest = json.loads((bundle / "manifest.json").read_text())
    weights = sum(s["bytes"] for s in manifest["stages"])
    largest = max(int(np.prod(x["shape"][1:])) * np.dtype(x["dtype"]).itemsize
                  for s in manifest["stages"] for x in (*s["inputs"], *s["outputs"]))
    memory = 128 * 2**20 + 3 * weights + (32 + 1024) * largest
    assert nodes["cloud"]["memory"] == f"{math.ceil(memory / 2**20)}Mi"
    assert nodes["cloud"]["memory_limit"] == f"{2 * math.ceil(memory / 2**20)}Mi"


def test_yaml_reads_back_as_the_objects(bundle, tmp_path):
    spec = load_spec(_spec(bundle, tmp_path / "spec.toml", _fleet))
    b = load_bundle(bundle)
    tricky = "a: b\n  indented\n# not a comment\ntrue\n"
    options = KubeOptions(sets={"model_name": "on", "spans_file": "/var/log/{node} x.jsonl"})
    resources, _ = node_resources(spec, b, 2.0, {})
    objects = manifests(spec, tricky, b.sha256, endpoints(spec, "spec"), resources, options)
    for docs in objects.values():
        assert list(yaml.safe_load_all(dump_all(docs))) == docs
    odd = [{"k": ["1", "0x1F", "yes", "~", "-", "*x", "a #b", "", "é", "line\n", " lead\nx\n", "x\n\n"], "on": {}}]
    assert list(yaml.safe_load_all(dump_all(odd))) == odd


def _free_ports(count: int) -> list[int]:
    """``count`` consecutive loopback ports that are free now."""
    from cis.runtime.ports import free_port

    for _ in range(50):
        base = free_port()
        ports = list(range(base, base + count))
        try:
            for p in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return ports
    raise AssertionError("no run of free ports")


def _env_file(path: Path) -> dict[str, str]:
    """An EnvironmentFile as systemd reads the lines cis deploy writes: comments, KEY=VALUE, "quoted" values."""
    out = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"').replace("\\$", "$").replace("\\\\", "\\")
        out[key] = value
    return out


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, f"node exited {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready")


def _until_parents_up(client, x, seconds: float = 60.0) -> None:
    """Ready is per node: a child may not have heard its parent's heartbeat yet (a loaded machine), and then
    answers degraded. Wait until one batch goes through undegraded (a wrong parent address never does)."""
    end = time.monotonic() + seconds
    while client.infer(x).degraded.any():
        assert time.monotonic() < end, "the tree never answered undegraded: a parent address is wrong"
        time.sleep(0.5)


@pytest.mark.slow
def test_systemd_env_files_serve_the_tree(run_cli, bundle, tmp_path):
    """Each node started as the unit starts it (``cis serve $BUNDLE`` with its EnvironmentFile's variables):
    requests entering at the devices are answered by every tier, none degraded, so every parent address is right."""
    from cis.runtime.client import Client
    from cis.training.data.loading import load_dataset

    zmq_ports, metrics = _free_ports(7), _free_ports(7)

    def loopback(data):
        for n, p in zip(data["nodes"], zmq_ports):
            n["address"] = f"tcp://127.0.0.1:{p}"

    spec = load_spec(_spec(bundle, tmp_path / "design.toml", loopback))
    out = tmp_path / "etc-cis"
    _deploy(run_cli, "systemd", tmp_path / "design.toml", bundle, "-o", out, "--env-dir", out,
            "--bundle-path", bundle, "--metrics-port", metrics[0], "--set", "max_wait=0.002")
    procs = {}
    try:
        for n in spec.nodes:
            env = _env_file(out / f"{n.id}.env")
            assert env["CIS_SPEC"] == str(out / "spec.toml") and env["CIS_MAX_WAIT"] == "0.002"
            procs[n.id] = start("serve", env.pop("BUNDLE"), env={**serve_config.child_env(), **env}, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / f"{n.id}.log").open("w"))
        for i, n in enumerate(spec.nodes):
            _wait_ready(f"http://127.0.0.1:{metrics[i]}/readyz", procs[n.id])
        x = load_dataset("digits", seed=0).test.x[:64]
        served = set()
        for leaf in spec.leaves:
            with Client(leaf.address, timeout=30) as client:
                _until_parents_up(client, x[:16])
                for i in range(0, len(x), 16):
                    res = client.infer(x[i : i + 16])
                    assert not res.degraded.any()
                    served |= set(res.served_by)
        assert {spec.node(s).exit for s in served} == {1, 2, 3}, served
    finally:
        for p in procs.values():
            stop(p)


def test_systemd_unit_and_env_files(run_cli, bundle, tmp_path):
    spec = _spec(bundle, tmp_path / "spec.toml")
    spans = "spans_file=/var/log/cis/{node}.jsonl"
    result = _deploy(run_cli, "systemd", spec, "-o", tmp_path / "units", "--set", spans)
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((tmp_path / "units" / "cis-node@.service").read_text())
    service = unit["Service"]
    assert service["EnvironmentFile"] == "/etc/cis/%i.env"
    assert service["ExecStart"] == "/opt/cis/bin/cis serve ${BUNDLE}"
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert service["User"] == "cis" and unit["Install"]["WantedBy"] == "multi-user.target"
    env = _env_file(tmp_path / "units" / "device0.env")
    assert env == {"BUNDLE": "/srv/cis/bundle", "CIS_NODE": "device0", "CIS_SPEC": "/etc/cis/spec.toml",
                   "CIS_BIND": "tcp://127.0.0.1:5553", "CIS_PARENT": "tcp://127.0.0.1:5551",
                   "CIS_METRICS_PORT": str(9100 + 3), "CIS_SPANS_FILE": "/var/log/cis/{node}.jsonl"}
    assert sorted(Path(f).name for f in result["files"]) == sorted(
        ["cis-node@.service", "spec.toml", "deploy.json", *(f"{n}.env" for n in result["nodes"])]
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(run_cli, bundle, tmp_path):
    """systemd's own parser on every instance; it checks that ExecStart's command exists, so the unit names
    this venv's cis. A misspelt key is reported, so the check can fail."""
    import sys

    cis = Path(sys.executable).with_name("cis")
    out = tmp_path / "units"
    _deploy(run_cli, "systemd", _spec(bundle, tmp_path / "spec.toml"), "-o", out, "--cis", cis, "--env-dir", out)
    for node in ("cloud", "device3"):
        res = subprocess.run(["systemd-analyze", "verify", f"{out}/cis-node@{node}.service"], capture_output=True,
                             text=True, cwd=out, timeout=60)
        assert res.returncode == 0 and res.stderr == "", res.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "cis-node@.service").write_text((out / "cis-node@.service").read_text().replace("Restart=", "Restrat="))
    res = subprocess.run(["systemd-analyze", "verify", f"{broken}/cis-node@cloud.service"], capture_output=True,
                         text=True, cwd=broken, timeout=60)
    assert "Restrat" in res.stderr


def _one_line(res, *words):
    assert res.code == 2, (res.code, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cis deploy: error: "), res.err
    assert all(w in lines[0] for w in words), lines[0]


def test_bad_input_is_one_line_and_writes_nothing(run_cli, bundle, tmp_path):
    spec = _spec(bundle, tmp_path / "spec.toml")
    out = tmp_path / "out"

    def no_address(data):
        del _node(data, "edge1")["address"]

    def only_binds(data):
        _node(data, "cloud")["address"] = "tcp://*:5550"

    cases = [
        (("deploy", "nomad", spec, bundle, "-o", out), ("unknown target 'nomad'", "kubernetes, systemd")),
        (("deploy", "kubernetes", _spec(bundle, tmp_path / "a.toml", no_address), bundle, "-o", out),
         ("node 'edge1' has no address", "tcp://HOST:PORT")),
        (("deploy", "systemd", _spec(bundle, tmp_path / "a.toml", no_address), "-o", out), ("'edge1'", "address")),
        (("deploy", "kubernetes", spec, tmp_path / "nowhere", "-o", out), ("nowhere", "manifest.json")),
        (("deploy", "kubernetes", spec, "-o", out), ("needs the bundle",)),
        (("deploy", "systemd", spec, "-o", out, "--namespace", "x"), ("--namespace", "kubernetes")),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--env-dir", "x"), ("--env-dir", "systemd")),
        (("deploy", "systemd", spec, "-o", out, "--set", "max_bach=3"), ("max_bach", "did you mean max_batch")),
        (("deploy", "systemd", spec, "-o", out, "--set", "max_batch=lots"), ("max_batch", "an integer")),
        (("deploy", "systemd", spec, "-o", out, "--set", "node=edge0"), ("node is set by cis deploy",)),
        (("deploy", "systemd", spec, "-o", out, "--set", "log_dir=/tmp"), ("log_dir belongs to cis serve --all",)),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--node-selector", "4:a=b"), ("selector", "exit 1..3")),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--bundle-claim", "c"), ("--bundle-volume pvc",)),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--name", "My_CIS"), ("--name 'My_CIS'", "DNS label")),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--namespace", "Edge"), ("--namespace 'Edge'", "DNS label")),
        (("deploy", "kubernetes", spec, bundle, "-o", out, "--set", "http_port=0"), ("http_port=0", "1..65535")),
        (("deploy", "systemd", _spec(bundle, tmp_path / "b.toml", only_binds), "-o", out), ("tcp://*:5550", "reach")),
    ]
    for argv, words in cases:
        _one_line(run_cli(*argv), *words)
        assert not out.exists(), argv
    _one_line(run_cli("deploy", "kubernetes", _spec(bundle, tmp_path / "c.toml", _rename), bundle, "-o", out),
              "node 'gateway' is not in bundle")
    assert not out.exists()


def _rename(data):
    for n in data["nodes"]:
        if n["id"] == "device3":
            n["id"] = "gateway"


def test_a_rerun_replaces_its_files_and_refuses_a_foreign_folder(run_cli, bundle, tmp_path):
    out = tmp_path / "k8s"
    _deploy(run_cli, "kubernetes", _spec(bundle, tmp_path / "spec.toml"), bundle, "-o", out)
    assert (out / "node-cis-device3.yaml").is_file()

    def fewer(data):
        data["nodes"] = [n for n in data["nodes"] if n["id"] != "device3"]

    result = _deploy(run_cli, "kubernetes", _spec(bundle, tmp_path / "fewer.toml", fewer), bundle, "-o", out)
    assert not (out / "node-cis-device3.yaml").exists()  # no stale manifest for kubectl apply -f to pick up
    assert sorted(str(p) for p in out.iterdir()) == sorted(result["files"])
    (out / "mine.txt").write_text("x")
    _one_line(run_cli("deploy", "kubernetes", tmp_path / "fewer.toml", bundle, "-o", out), "mine.txt")
    assert (out / "node-cis-cloud.yaml").is_file()  # nothing removed when refused


def test_human_summary_lists_every_node(run_cli, bundle, tmp_path):
    res = run_cli("deploy", "kubernetes", _spec(bundle, tmp_path / "spec.toml", _fleet), bundle, "-o", tmp_path / "k")
    assert res.code == 0, res.err
    rows = {line.split()[0]: line.split() for line in res.out.splitlines()[2:9]}
    assert set(rows) == {"cloud", "edge0", "edge1", "device0", "device1", "device2", "device3"}
    assert rows["cloud"][1] == "3" and rows["cloud"][-1] == "cis-inference:0.1.0-gpu"
    assert "wrote 11 files to" in res.out and "note: node 'cloud' runs on cuda" in res.out


def test_every_flag_and_json_key_is_documented(run_cli, bundle, tmp_path):
    import argparse

    from cis.cli.commands import deploy

    sub = argparse.ArgumentParser().add_subparsers()
    deploy.add_parser(sub)
    parser = sub.choices["deploy"]
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--log-level",
                                                                                              "--log-format"}
    text = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    assert {f for f in flags if f"`{f}" not in text} == set()
    spec = _spec(bundle, tmp_path / "spec.toml")
    for target, extra in (("kubernetes", [bundle]), ("systemd", [])):
        result = _deploy(run_cli, target, spec, *extra, "-o", tmp_path / target)
        keys = set(result) | {k for node in result["nodes"].values() for k in node}
        assert {k for k in keys if f"`{k}`" not in text} == set(), target


def test_a_node_given_an_addresses_list_is_deployed_at_the_first(run_cli, bundle, tmp_path):
    def listed(data):  # docs/spec.md: addresses = [...] instead of address, one per replica
        cloud = _node(data, "cloud")
        del cloud["address"]
        cloud.update(replicas=2, addresses=["tcp://10.0.0.5:5560", "tcp://10.0.0.6:5560"])

    spec = _spec(bundle, tmp_path / "spec.toml", listed)
    k8s = _deploy(run_cli, "kubernetes", spec, bundle, "-o", tmp_path / "k8s")
    assert k8s["nodes"]["cloud"]["replicas"] == 2 and k8s["nodes"]["cloud"]["address"].endswith(":5560")
    units = _deploy(run_cli, "systemd", spec, "-o", tmp_path / "units")
    assert units["nodes"]["cloud"]["bind"].endswith(":5560")
    assert any("'cloud' has replicas = 2" in note for note in units["notes"])
    deployed = load_spec(tmp_path / "units" / "spec.toml").node("cloud")
    assert deployed.replicas == 1 and deployed.address == "tcp://10.0.0.5:5560" and deployed.addresses is None
