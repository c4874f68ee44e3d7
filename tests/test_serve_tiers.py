"""cis serve on real tiers, with a paper-7 digits bundle and real processes:

- ``serve --all --metrics-port 0``: every node's /metrics (the documented names, values that move
  with requests and with a parent that stops answering) and /healthz;
- ``--provider``: cuda and tensorrt refuse in one line where they cannot run (here: no GPU),
  ``auto`` falls back to the CPU and says so, ``cpu`` serves; the spec's ``provider`` field, which
  the flag overrides;
- the simulator takes each node's stage times from its backend's latency profile, or says it has none.

GPU tests (``-m gpu``) run the CUDA provider and TensorRT engines where they exist; they skip elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("prometheus_client")

from cli_process import cis_argv, read_until, start, started_nodes, stop  # noqa: E402
from test_runtime_metrics import REQUIRED, health, names, scrape  # noqa: E402

from cis.core.bundle import load_bundle, write_manifest  # noqa: E402
from cis.core.errors import CisError  # noqa: E402
from cis.core.spec import Node  # noqa: E402
from cis.runtime.client import Client  # noqa: E402
from cis.runtime.factory import build_node  # noqa: E402
from cis.runtime.launcher import plan_metrics  # noqa: E402

FAST = ["--forward-timeout", "0.5", "--heartbeat", "0.1"]


def _ort_has(provider: str) -> bool:
    import onnxruntime as ort

    return provider in ort.get_available_providers()


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("tiers"), steps=150)


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test.x[:40]


def cis(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cis_argv(*args), capture_output=True, text=True, timeout=timeout)


def one_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    return lines[0]


# ---------------------------------------------------------------- metrics on a live cluster


def test_serve_all_metrics_port_0_every_node_answers_metrics_and_healthz(bundle_dir, digits):
    spec = load_bundle(bundle_dir).spec
    proc = start(
        "serve", bundle_dir, "--all", "--free-ports", "--metrics-port", 0, "--json", "--no-cap",
        "--threshold", "inf", "--provider", "cpu", *FAST,
    )  # fmt: skip
    stopped = None
    try:
        nodes = started_nodes(proc)
        urls = {nid: n["metrics"] for nid, n in nodes.items()}
        assert set(urls) == set(spec.ids) and all(u.endswith("/metrics") for u in urls.values())
        assert len({u for u in urls.values()}) == len(urls)  # a port of its own per node
        for nid, url in urls.items():
            assert health(url) == (200, {"node": nid, "state": "serving"})
            assert set(REQUIRED) <= names(url)
            assert scrape(url)[("cis_node_info", (("backend", "onnxruntime CPUExecutionProvider"),
                                                  ("exit", str(nodes[nid]["exit"])), ("node", nid),
                                                  ("parent", nodes[nodes[nid]["parent"]]["address"]
                                                   if nodes[nid]["parent"] else ""),
                                                  ("provider", "cpu"), ("replica", nid)))] == 1  # fmt: skip
        leaf = next(nid for nid, n in nodes.items() if n["exit"] == 1)
        edge = nodes[leaf]["parent"]
        root = spec.root.id
        before = {nid: scrape(u) for nid, u in urls.items()}
        with Client(nodes[leaf]["address"], timeout=20) as c:
            r = c.infer(digits[:10])  # threshold inf below the root: all of it goes up
        assert r.exit.tolist() == [3] * 10 and not r.degraded.any()
        after = {nid: scrape(u) for nid, u in urls.items()}

        def moved(nid: str, key: tuple) -> float:
            return after[nid].get(key, 0.0) - before[nid].get(key, 0.0)

        ok = {kind: ("cis_requests_total", (("kind", kind), ("outcome", "ok"))) for kind in ("infer", "forward")}
        assert moved(leaf, ok["infer"]) == 1 and moved(edge, ok["forward"]) == 1 and moved(root, ok["forward"]) == 1
        assert moved(edge, ok["infer"]) == 0 and moved(root, ok["infer"]) == 0  # one request counted once per kind
        assert moved(leaf, ("cis_request_latency_seconds_count", ())) == 1
        assert moved(leaf, ("cis_forwarded_total", ())) == 10 and moved(edge, ("cis_forwarded_total", ())) == 10
        assert moved(root, ("cis_samples_total", (("exit", "3"),))) == 10
        assert moved(leaf, ("cis_samples_total", (("exit", "1"),))) == 0
        assert after[leaf][("cis_parent_up", ())] == 1 and after[leaf][("cis_queue_depth", ())] == 0

        # the leaf's parent stops answering: parent_up drops, and what the leaf would forward is degraded
        stopped = nodes[edge]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        end = time.monotonic() + 10
        while scrape(urls[leaf])[("cis_parent_up", ())] != 0 and time.monotonic() < end:
            time.sleep(0.1)
        assert scrape(urls[leaf])[("cis_parent_up", ())] == 0
        assert health(urls[leaf])[0] == 200  # degraded service is still service
        with Client(nodes[leaf]["address"], timeout=20) as c:
            r = c.infer(digits[:5])
        assert r.degraded.all()
        assert scrape(urls[leaf])[("cis_degraded_total", ())] - before[leaf].get(("cis_degraded_total", ()), 0) == 5
        os.kill(stopped, signal.SIGCONT)
        stopped = None
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        code = stop(proc)
    assert code == 0, proc.stderr.read()[-3000:]


def test_a_metrics_port_gives_node_i_port_plus_i(bundle_dir):
    spec = load_bundle(bundle_dir).spec
    addresses = {n.id: f"tcp://127.0.0.1:{6000 + i}" for i, n in enumerate(spec.nodes)}
    ports, urls = plan_metrics(spec, addresses, 9300)
    assert [ports[n.id] for n in spec.nodes] == list(range(9300, 9300 + len(spec.nodes)))
    assert urls[spec.nodes[1].id] == "http://127.0.0.1:9301/metrics"
    assert plan_metrics(spec, addresses, None) == ({}, {})


# ---------------------------------------------------------------- providers without a GPU


@pytest.mark.skipif(_ort_has("CUDAExecutionProvider"), reason="onnxruntime has CUDA here; see the gpu tests")
def test_cuda_and_tensorrt_refuse_in_one_line_without_a_gpu(bundle_dir, tmp_path):
    line = one_line(cis("serve", bundle_dir, "--node", "cloud", "--bind", "tcp://127.0.0.1:0", "--provider", "cuda"))
    assert line.startswith("cis serve: error: node 'cloud': provider cuda (--provider): ")
    assert "CUDAExecutionProvider" in line and "auto" in line
    line = one_line(cis("serve", bundle_dir, "--node", "cloud", "--provider", "tensorrt", "--metrics-port", 0))
    assert "provider tensorrt (--provider): the bundle has no TensorRT engine for stage 1" in line
    assert "TensorrtExecutionProvider" in line
    # --all checks before it starts any node: one line, not one per node
    line = one_line(cis("serve", bundle_dir, "--all", "--free-ports", "--provider", "cuda", "--log-dir", tmp_path))
    assert "provider cuda (--provider)" in line
    assert not list(tmp_path.glob("*.log"))


@pytest.mark.skipif(_ort_has("CUDAExecutionProvider"), reason="onnxruntime has CUDA here: auto takes it")
def test_auto_falls_back_to_the_cpu_and_says_so(bundle_dir, digits):
    proc = start("serve", bundle_dir, "--node", "cloud", "--bind", "tcp://127.0.0.1:0", "--provider", "auto",
                 "--metrics-port", 0)  # fmt: skip
    try:
        lines = read_until(proc.stderr, proc, "metrics http")
        note = [x for x in lines if "provider auto:" in x]
        assert len(note) == 1 and "CUDAExecutionProvider" in note[0] and note[0].rstrip().endswith("on the CPU")
        assert "stages on onnxruntime CPUExecutionProvider" in lines[-1]
        url = lines[-1].rsplit("metrics ", 1)[1].strip()
        info = [k for k in scrape(url) if k[0] == "cis_node_info"]
        assert ("provider", "cpu") in info[0][1]
    finally:
        assert stop(proc) == 0


def test_the_spec_provider_field_and_the_flag_that_overrides_it(bundle_dir):
    bundle = load_bundle(bundle_dir)
    spec = bundle.spec.replace_nodes(
        Node(**{**n.__dict__, "provider": "cuda" if n.parent is None else None}) for n in bundle.spec.nodes
    )
    root = spec.root.id
    if not _ort_has("CUDAExecutionProvider"):
        with pytest.raises(CisError, match=f"node '{root}': provider cuda \\(the spec's provider\\): "):
            build_node(bundle, root, spec, bind="tcp://127.0.0.1:0")
    node = build_node(bundle, root, spec, bind="tcp://127.0.0.1:0", provider="cpu")
    assert node.cfg.backend.provider == "cpu" and not node.cfg.backend.engines
    leaf = spec.leaves[0].id
    assert build_node(bundle, leaf, spec, bind="tcp://127.0.0.1:0", parent="tcp://127.0.0.1:1").cfg.backend.provider \
        == "cpu"  # no provider anywhere: the cpu


# ---------------------------------------------------------------- the simulator's stage times per backend


def test_the_simulator_takes_each_nodes_backend_profile(bundle_dir, tmp_path, run_cli):
    import shutil

    from cis.sim.config import SimConfig
    from cis.sim.simulation import plan_run

    bundle = load_bundle(bundle_dir)
    spec = bundle.spec
    spec_file = tmp_path / "spec.toml"
    from cis.core.spec import write_spec

    write_spec(spec, spec_file)
    res = run_cli("simulate", "--spec", spec_file, "--bundle", bundle_dir, "--requests", 50, "--provider", "cuda")
    assert res.code == 2 and "no latency profile for backend 'cuda' (it has cpu)" in res.err
    assert len(res.err.strip().splitlines()) == 1
    # a bundle with a cuda profile (10x faster stages), as an export on a GPU machine writes it
    gpu = tmp_path / "gpu-bundle"
    shutil.copytree(bundle_dir, gpu)
    doc = json.loads((gpu / "profiles/latency.json").read_text())
    assert doc["backend"] == "cpu"
    cpu = bundle.latency_profile("cpu")
    doc["backends"] = {"cuda": {"stages": {str(k): {str(b): s / 10 for b, s in v.items()} for k, v in cpu.items()}}}
    (gpu / "profiles/latency.json").write_text(json.dumps(doc))
    write_manifest(gpu, {k: v for k, v in bundle.manifest.items() if k not in ("schema_version", "files")})
    gpu_bundle = load_bundle(gpu)
    assert gpu_bundle.latency_profile("cuda")[2][1] == pytest.approx(cpu[2][1] / 10)
    mixed = spec.replace_nodes(
        Node(**{**n.__dict__, "provider": "cuda" if n.parent is None else "auto"}) for n in spec.nodes
    )
    plan = plan_run(mixed, SimConfig(requests=10), gpu_bundle)
    root, leaf = spec.root, spec.leaves[0]
    assert plan.visit_means[root.id][0] == pytest.approx(sum(cpu[k][1] for k in (1, 2, 3)) / 10 / root.speed)
    assert plan.visit_means[leaf.id][0] == pytest.approx(cpu[1][1] / leaf.speed)  # auto is simulated as cpu
    ok = run_cli("simulate", "--spec", spec_file, "--bundle", gpu, "--requests", 50, "--provider", "cuda", "--json")
    assert ok.code == 0, ok.err


# ---------------------------------------------------------------- tracing: one trace across the tiers


def test_a_forwarded_request_is_one_trace_with_spans_from_device_edge_and_cloud(bundle_dir, digits, tmp_path):
    """Issue 33's "Done when": a request sent with a traceparent to a device whose thresholds forward it to the
    cloud is one trace, in the spans files and through a real OTLP/HTTP receiver: device, edge and cloud each
    a request span with its queue, compute (and forward) spans, each node's request span the child of the
    node below's forward span."""
    pytest.importorskip("opentelemetry.sdk")
    from otlp_receiver import OtlpReceiver

    from cis.runtime.spans import read_spans

    trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    receiver = OtlpReceiver()
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    proc = start(
        "serve", bundle_dir, "--all", "--free-ports", "--json", "--no-cap", "--threshold", "inf", "--provider", "cpu",
        "--spans-file", tmp_path / "{node}.spans.jsonl", "--otlp-endpoint", receiver.url, *FAST, env=env,
    )  # fmt: skip
    try:
        nodes = started_nodes(proc)
        device = sorted(nid for nid, n in nodes.items() if n["exit"] == 1)[0]
        edge = nodes[device]["parent"]
        cloud = nodes[edge]["parent"]
        with Client(nodes[device]["address"], timeout=20) as c:
            traced = c.infer(digits[:4], traceparent=f"00-{trace}-{client_span}-01")
            plain = c.infer(digits[:4])
        services = {f"cis-{n}" for n in (device, edge, cloud)}
        exported = receiver.wait(lambda s: len([x for x in s if x["trace_id"] == trace]) >= 11)
    finally:
        assert stop(proc) == 0
        receiver.close()
    assert traced.exit.tolist() == [3] * 4 and traced.served_by == [cloud] * 4
    for a in ("cls", "confidence", "exit", "flags", "served_by"):  # a trace context changes no answer
        assert np.array_equal(getattr(traced, a), getattr(plain, a)), a

    spans = [s for nid in (device, edge, cloud) for s in read_spans(tmp_path / f"{nid}.spans.jsonl")]
    mine = [s for s in spans if s.trace_id == trace]
    kinds = {(s.node, s.kind): s for s in mine}
    assert len(kinds) == len(mine) == 11 and {n for n, _ in kinds} == {device, edge, cloud}
    parent = client_span
    for nid, stages, last in ((device, (1, 1), False), (edge, (2, 2), False), (cloud, (3, 3), True)):
        req = kinds[(nid, "request")]
        assert req.parent_id == parent and req.samples == 4 and (req.stage_from, req.stage_to) == stages
        for kind in ("queue", "compute") + (() if last else ("forward",)):
            s = kinds[(nid, kind)]
            assert s.parent_id == req.span_id and req.start <= s.start <= s.end <= req.end and s.samples == 4
        assert kinds[(nid, "compute")].batch == 4 and kinds[(nid, "queue")].end <= kinds[(nid, "compute")].start
        if not last:
            parent = kinds[(nid, "forward")].span_id
    assert (cloud, "forward") not in kinds
    for below, above in ((device, edge), (edge, cloud)):  # the parent's time lies inside the child's forward
        fwd, req = kinds[(below, "forward")], kinds[(above, "request")]
        assert fwd.start - 0.005 <= req.start and req.end <= fwd.end + 0.005
    assert len({s.trace_id for s in spans}) == 2  # the request without a context: a trace of its own

    otlp = [x for x in exported if x["trace_id"] == trace]
    assert {(x["span_id"], x["parent_id"], x["name"]) for x in otlp} == {(s.span_id, s.parent_id, s.kind) for s in mine}
    assert {x["service"] for x in otlp} == services
    for x in otlp:
        s = next(s for s in mine if s.span_id == x["span_id"])
        assert x["attributes"]["cis.node"] == s.node and x["attributes"]["cis.samples"] == s.samples
        assert abs(x["start"] / 1e9 - s.start) < 1e-6 and abs(x["end"] / 1e9 - s.end) < 1e-6
    answered = next(x for x in otlp if x["name"] == "request" and x["service"] == f"cis-{cloud}")
    assert answered["attributes"]["cis.exit"] == 3 and answered["attributes"]["cis.outcome"] == "ok"


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_cuda_provider_serves_the_same_classes_on_the_gpu(bundle_dir, digits):
    if not _ort_has("CUDAExecutionProvider"):
        pytest.skip("onnxruntime has no CUDAExecutionProvider here (pip install onnxruntime-gpu on a GPU machine)")
    from cis.core.stages.runner import StageRunner, run_chain

    bundle = load_bundle(bundle_dir)
    runners = [StageRunner(bundle, k, "cuda") for k in (1, 2, 3)]
    assert runners[0].session.get_providers()[0] == "CUDAExecutionProvider"
    gpu, cpu = run_chain(runners, digits), run_chain(bundle, digits)
    for e in cpu:
        assert np.mean(gpu[e].argmax(-1) == cpu[e].argmax(-1)) >= 0.98
    node = build_node(bundle, bundle.spec.root.id, bind="tcp://127.0.0.1:0", provider="cuda")
    assert node.cfg.backend.provider == "cuda"


@pytest.mark.gpu
def test_tensorrt_engines_serve_and_profile(bundle_dir, digits, tmp_path):
    from cis.core.stages.tensorrt_engines import runtime_missing

    if runtime_missing():
        pytest.skip(f"no TensorRT here: {runtime_missing()}")
    from cis.core.stages.backends import open_stages
    from cis.core.stages.runner import run_chain
    from cis.exporter import export_bundle

    out = tmp_path / "trt"
    export_bundle(bundle_dir.parent / "run", out, trt=True, latency_repeats=2)
    bundle = load_bundle(out)
    runners, backend = open_stages(bundle, [1, 2, 3], "tensorrt")
    assert backend.engines and backend.provider == "tensorrt"
    got, ref = run_chain([runners[k] for k in (1, 2, 3)], digits), run_chain(bundle, digits)
    for e in ref:
        assert np.mean(got[e].argmax(-1) == ref[e].argmax(-1)) >= 0.98
    assert bundle.latency_profile("tensorrt")[1][1] > 0
    assert bundle.manifest["tensorrt"]["device"]["compute_capability"]
