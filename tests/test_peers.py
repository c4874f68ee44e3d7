"""Issue 34: the same CIS as a Ray Serve app answers exactly what cis answers, and the peers benchmark runs.

- ``cis serve --all`` and the Ray Serve app of bench/peers/ray_serve_cis.py (a deployment per tier,
  DeploymentHandles between tiers, ``@serve.batch``), on the same digits bundle, thresholds and samples, sent
  one at a time to the same entry nodes: the same class, exit and serving node for every sample, and both
  forward some samples (the comparison covers the handles between tiers, not only the devices): the quick
  run's agreement, asserted with its result;
- with every threshold below the root at inf (the p50 headline's 'forced' runs), every request is served at the
  cloud by both (the runs' ``served_at``);
- ``bench/peers/run.py --quick`` (what CI smoke-runs) writes its result with every section, the missing
  peers reported as such, no timing asserted.

Skipped where ray[serve] (or tritonclient, for the smoke run) is not installed: ``pip install '.[peers]'``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")


REPO = Path(__file__).resolve().parents[1]

from bench.peers.systems import missing_peers  # noqa: E402 (Ray on loopback: before ray is imported)

if missing_peers(http=False):
    pytest.skip("ray[serve] is not installed (pip install '.[peers]')", allow_module_level=True)


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
        forced = native["light_forced"]
        assert forced["served_at"] == {"cloud": forced["requests"]}, "forced: every request through three tiers"
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
