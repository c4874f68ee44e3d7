"""Issue 34: the same CIS as a Ray Serve app answers exactly what cis answers, and the peers benchmark runs.

- ``cis serve --all`` and the Ray Serve app of bench/peers/ray_serve_cis.py (a deployment per tier,
  DeploymentHandles between tiers, ``@serve.batch``), on the same digits bundle, thresholds and samples, sent
  one at a time to the same entry nodes: the same class, exit and serving node for every sample, and both
  forward some samples (the comparison covers the handles between tiers, not only the devices): the quick
  run's agreement, asserted with its result;
- with every threshold below the root at inf, every sample is served at the cloud by both;
- ``bench/peers/run.py --quick`` (what CI smoke-runs) writes its result with every section, the missing
  peers reported as such, no timing asserted.

Skipped where ray[serve] (or tritonclient, for the smoke run) is not installed: ``pip install '.[peers]'``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")


REPO = Path(__file__).resolve().parents[1]

from bench.peers.systems import RayServer, cis_tree, missing_peers  # noqa: E402 (Ray on loopback: before ray is imported)

if missing_peers(http=False):
    pytest.skip("ray[serve] is not installed (pip install '.[peers]')", allow_module_level=True)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from cis.exporter.fixture_bundle import make_demo_bundle

    folder = tmp_path_factory.mktemp("peers")
    make_demo_bundle(folder, steps=300)
    return folder / "bundle"


# First in the file: the module-scoped Ray app below would otherwise run beside the benchmark's own Ray.
@pytest.mark.slow
@pytest.mark.skipif(bool(missing_peers()), reason="tritonclient[http] is not installed")
def test_quick_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "peers.json"
    cmd = [sys.executable, "-m", "bench.peers", "--quick", "--work", str(tmp_path / "work"),
           "--out", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["quick"] is True and r["versions"]["ray"]
    for system in ("cis", "ray"):
        t = r["tree"][system]
        assert t["startup_s"] > 0 and t["rss_rest"]["processes"] >= 1
        native = t["paths"]["native"]
        assert native["light_forced"]["answered"] == native["light_forced"]["requests"] > 0
        assert native["sweep"]["steps"], "the sweep ran"
    assert r["tree"]["cis"]["rss_rest"]["processes"] == 8  # the launcher and seven nodes
    agree = r["tree"]["ray"]["agreement"]["digits"]  # cis and the Ray app, sample by sample
    assert agree["identical"] and agree["answered_both"] == agree["samples"] > 0
    assert agree["max_confidence_gap"] < 1e-5
    assert len(agree["served_share_per_exit"]) >= 2, "some samples were forwarded through the handles"
    door = r["tree"]["cis"]["paths"]["http"]
    assert ("pending" in door) != ("light_forced" in door)  # measured, or said to be pending: never faked
    for key in ("kserve", "mlserver_workers0"):
        assert key in r["single"]
    assert set(r["headline"]) >= {"p50_three_tiers", "largest_rate", "memory", "startup"}


@pytest.fixture(scope="module")
def ray_app(digits, tmp_path_factory):
    server = RayServer(digits, tmp_path_factory.mktemp("ray") / "ray.log", [])
    yield server
    server.stop()


def _samples(n: int):
    from cis.training.data.loading import load_dataset

    return load_dataset("digits").test.x[:n].astype("float32")


@pytest.mark.slow
def test_forced_thresholds_serve_everything_at_the_cloud(digits, ray_app, tmp_path):
    from bench.peers.loadgen import CisNative, RayHandle
    from bench.peers.run import entry_nodes, run_load

    x = _samples(12)
    nodes = entry_nodes(digits, len(x))
    ray_app.redeploy(digits, threshold=math.inf)
    theirs = run_load(lambda: RayHandle(ray_app.handle), x, nodes, None, timeout=10, keep=True).outcomes
    tree = cis_tree(digits, tmp_path, ["--no-cap", "--threshold", "inf"], http=False)
    try:
        ours = run_load(lambda: CisNative({n: tree.address(n) for n in tree.nodes}), x, nodes, None, 10, True).outcomes
    finally:
        tree.stop()
    for a, b in zip(ours, theirs):
        assert a.answer is not None and b.answer is not None
        assert a.answer["node"] == b.answer["node"] == ["cloud"]
        assert a.answer["exit"] == b.answer["exit"] == [3]
        assert a.answer["cls"] == b.answer["cls"]
