"""The twin's calibration on a live cluster (cis.sim.twin_calibration, cis.sim.twin_stages: once bench/_twin.py):

- the figures of a runtime load (summarise_runtime) from the load generator's result, windowed, errors by class;
- the slowdown after idling: each idle bin's excess over the shortest idle times', never decreasing;
- the in-process stage timing on the cores (profile, spread, a busy core beside, the work per message);
- calibrate() on a real ``cis serve --all`` of the digits bundle with spans on: the root's node work, the idle
  table, each node's batch work and the client's messaging, matched request by request to the spans.
"""

from __future__ import annotations

import numpy as np
import pytest

from cis.runtime.load_transports import Answer
from cis.runtime.loadgen import LoadResult
from cis.sim.twin_calibration import idle_slowdown, summarise_runtime


def a_load(errors: list, exits: list, latency: list) -> LoadResult:
    n = len(errors)
    answers = [None if e else Answer(0, x, "cloud", 1 if x == 1 else 0) for e, x in zip(errors, exits)]
    return LoadResult("zmq", "poisson", 10.0, ["a"], ["dev"] * n, np.arange(n) * 0.1, np.arange(n) * 0.1,
                      np.array([np.nan if e else v for e, v in zip(errors, latency)]), errors, answers, n * 0.1)


def test_runtime_figures_are_the_answered_requests_of_the_window():
    load = a_load([None, None, "overloaded", None, "timeout", None], [1, 2, 0, 2, 0, 1], [1, 2, 3, 4, 5, 6])
    figs = summarise_runtime(load, 2)
    assert figs["arrived"] == 6 and figs["answered"] == 4
    assert figs["errors"] == {"overloaded": 1, "timeout": 1}
    assert figs["shares"] == {"1": 0.5, "2": 0.5} and figs["degraded_share"] == 0.5
    assert figs["latency"]["mean"] == pytest.approx((1 + 2 + 4 + 6) / 4)
    windowed = summarise_runtime(load, 2, (0.15, 0.45))  # requests due at 0.2, 0.3, 0.4
    assert windowed["arrived"] == 3 and windowed["answered"] == 1 and windowed["errors"] == {"overloaded": 1,
                                                                                            "timeout": 1}


def test_the_slowdown_after_idling_is_each_bins_excess_and_never_falls():
    rng = np.random.default_rng(0)
    rows = []
    for idle, extra in ((0.001, 0.0), (0.03, 0.002), (0.15, 0.001), (0.5, 0.004)):  # the 0.15 bin dips
        rows += [(idle * rng.uniform(0.9, 1.1), 0.010, 0.010 + 0.0005 + extra, 1) for _ in range(10)]
    table, costs = idle_slowdown(rows, work=0.0)
    assert table[0] == (0.0, 0.0)
    extras = [e for _, e in table]
    assert extras == sorted(extras) and extras[1] == pytest.approx(0.002) and extras[-1] == pytest.approx(0.004)
    # what stays per visit is messaging: 0.5 ms after the shortest idle times (less the table's slope there), and
    # never below 0 (the dip's requests took less than the table says)
    assert len(costs) == 40 and all(0.0004 < c <= 0.0005 for c in costs[:10]) and min(costs) == 0.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from cis.exporter.fixture_bundle import make_demo_bundle
    from cis.training.data.loading import load_dataset

    bundle = make_demo_bundle(tmp_path_factory.mktemp("twin"), steps=150)
    return bundle, load_dataset("digits", seed=0).test.x[:64].astype(np.float32)


def test_stage_timing_on_the_cores(digits):
    from cis.sim.twin_stages import beside_busy_core, message_work, profile_stages, spread

    bundle, x = digits
    cores = {1: 0, 2: 0, 3: 0}
    profile = profile_stages(bundle, cores, x, batches=(1, 4), repeats=2, min_seconds=0.02)
    assert set(profile) == {1, 2, 3} and all(set(p) == {1, 4} and min(p.values()) > 0 for p in profile.values())
    ratios = spread(bundle, 3, 0, x, calls=50)
    assert len(ratios) == 50 and np.mean(ratios) == pytest.approx(1.0) and min(ratios) > 0
    beside = beside_busy_core(bundle, 3, 0, 1, 0, x, batch=4, rounds=2, seconds=0.05)
    assert beside["interference"] >= 0 and len(beside["ratios"]) == 2
    probe = message_work(bundle, 3, 3, 0, 0, x, batch=4, rate=500.0, rounds=2, seconds=0.1)
    assert probe["message_work"] >= 0 and len(probe["reading"]) == 2 and probe["rate"] == 500.0


def test_calibrate_on_a_live_cluster_with_spans(digits, tmp_path):
    from cis.core.topologies import make_spec
    from cis.runtime.launcher import launch
    from cis.sim.spans import read_spans
    from cis.sim.twin_calibration import calibrate

    bundle, x = digits
    spec = make_spec("paper-7", "60-30-10")
    spans = tmp_path / "spans"
    spans.mkdir()
    cluster = launch(bundle, spec, free_ports=True, extra_args=["--spans-file", str(spans / "{node}.spans.jsonl")])
    try:
        stage_s = {k: 0.0002 for k in (1, 2, 3)}

        def read() -> dict:
            return read_spans(sorted(spans.glob("*.spans.jsonl")))

        profile = {k: {1: 0.0002, 32: 0.002} for k in (1, 2, 3)}
        cal = calibrate(cluster.addresses, x, spec, stage_s, rate=40.0, n=80, seed=1, back_to_back=20, spans=read,
                        profile=profile)  # fmt: skip
    finally:
        cluster.stop()
    assert cal["requests"] == 80 and cal["root_back_to_back_mean_s"] > 0
    assert cal["visit_overhead_s"] == 0.0  # with spans: the node work is each node's batch work
    assert set(cal["batch_overhead_s"]) <= set(spec.ids) and cal["batch_overhead_s"]
    assert len(cal["entry_rtt_s"]) >= 60  # the load's requests found in their entry nodes' spans, one by one
    assert all(v >= 0 for v in cal["entry_rtt_s"]) and cal["hop_rtt_s"]
    assert sum(cal["idle_bins"]) >= 60 and cal["interference"] >= 0
