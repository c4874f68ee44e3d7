"""The twin's calibration from a light load's spans (cis.sim.twin_batches): the interference of the machine's cores
(``SimConfig.interference``) and a woken node's reading of its message counted as batch work."""

from __future__ import annotations

import numpy as np
import pytest

from cis.core.spec import CisSpec, Node, validate
from cis.sim.twin_batches import batch_overheads, interference, stage_speed

PROFILE = {1: {1: 0.001}, 2: {1: 0.010}}  # seconds per call at batch 1


def spec() -> CisSpec:
    return validate(CisSpec((Node("cloud", 2), Node("dev", 1, parent="cloud", arrival_rate=1.0)), 2))


def columns(batches: list[tuple[str, float, float, float, int]]) -> dict:
    """Span columns (cis.sim.spans.span_columns' layout) of one-request batches: (node, woke, start, end, stage_from);
    each batch's answer goes at its end."""
    rows = []
    for k, (node, woke, start, end, stage_from) in enumerate(batches):
        req = f"r{k}"
        rows += [(node, "request", req, "", woke, end, stage_from),
                 (node, "queue", f"q{k}", req, woke, start, stage_from),
                 (node, "compute", f"c{k}", req, start, end, stage_from)]
    cols = {key: np.array([r[j] for r in rows], dtype=object)
            for j, key in enumerate(("node", "kind", "span_id", "parent_id"))}
    cols["start"] = np.array([r[4] for r in rows], float)
    cols["end"] = np.array([r[5] for r in rows], float)
    cols["stage_from"] = np.array([r[6] for r in rows], np.int64)
    cols["samples"] = np.ones(len(rows), np.int64)
    cols["seconds"] = cols["end"] - cols["start"]
    return cols


def overlap(a: tuple[float, float], others: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], e) - max(a[0], s)) for s, e in others)


def interfering_batches(c: float, n: int = 300, seed: int = 0) -> list:
    """A cloud batch every 20 ms and a device batch at a random moment: each takes its profiled time, 0.4 ms
    of node work and ``c`` seconds per second the other ran beside it (solved by fixed-point iteration)."""
    rng = np.random.default_rng(seed)
    cloud = [(0.02 * k, 0.010) for k in range(n)]
    dev = [(0.02 * k + rng.uniform(-0.004, 0.012), 0.001) for k in range(n)]
    c_end = [s + w + 0.0004 for s, w in cloud]
    d_end = [s + w + 0.0004 for s, w in dev]
    for _ in range(30):
        c_iv, d_iv = list(zip([s for s, _ in cloud], c_end)), list(zip([s for s, _ in dev], d_end))
        c_end = [s + w + 0.0004 + c * overlap(iv, d_iv) for (s, w), iv in zip(cloud, c_iv)]
        d_end = [s + w + 0.0004 + c * overlap(iv, c_iv) for (s, w), iv in zip(dev, d_iv)]
    return ([("cloud", s, s, e, 2) for (s, _), e in zip(cloud, c_end)]
            + [("dev", s, s, e, 1) for (s, _), e in zip(dev, d_end)])


@pytest.mark.parametrize("c", [0.0, 0.2])
def test_the_interference_is_the_slope_of_extra_time_on_time_beside_another_busy_core(c):
    cols = columns(interfering_batches(c))
    got = interference(cols, PROFILE, spec(), (-1.0, 100.0))
    assert got["interference"] == pytest.approx(c, abs=0.02)
    assert got["batches"] >= 590  # idle-time groups of fewer than 5 batches are left out


def test_a_woken_node_pays_its_reading_as_batch_work():
    """A device that idles 50 ms between batches, woken 0.3 ms before each batch starts (its queue span), each
    batch 0.2 ms beyond the profile: its work after idling is 0.5 ms; a busy node's queue span is a wait."""
    idle = [("dev", 0.05 * k, 0.05 * k + 0.0003, 0.05 * k + 0.0003 + 0.0012, 1) for k in range(40)]
    tables, means = batch_overheads(columns(idle), PROFILE, spec(), (-1.0, 100.0))
    assert tables["dev"][-1][1] == pytest.approx(0.0005, abs=1e-6)
    assert means["dev"] == pytest.approx(0.0005, abs=1e-6)
    # back to back: each batch admitted while the one before ran (its queue span starts before that one ended)
    busy = [("dev", 0.0012 * k - 0.0006, 0.0012 * k, 0.0012 * (k + 1), 1) for k in range(40)]
    tables, _ = batch_overheads(columns(busy), PROFILE, spec(), (-1.0, 100.0))
    assert tables["dev"][0][1] == pytest.approx(0.0002, abs=1e-6)


def test_stage_speed_is_the_median_batch_time_over_its_profile_where_the_stages_dominate():
    """Cloud batches (stage 2, 10 ms profiled) that took 9.5 ms in the window and 12 ms outside it; the device's
    1 ms stage is shorter than the 2 ms floor, so it is not reported; a node with fewer than 20 batches neither."""
    batches = [("cloud", 0.1 * k, 0.1 * k, 0.1 * k + (0.0095 if k < 30 else 0.012), 2) for k in range(60)]
    batches += [("dev", 0.1 * k + 0.05, 0.1 * k + 0.05, 0.1 * k + 0.053, 1) for k in range(60)]
    got = stage_speed(columns(batches), PROFILE, spec(), (0.0, 2.95))
    assert got == {"cloud": pytest.approx(0.95)}
    assert stage_speed(columns(batches), PROFILE, spec(), (0.0, 1.0)) == {}  # 10 batches: too few to tell
