"""The twin's per-visit spans (queue, compute, forward, request; cis/sim/spans.py), the node work per batch, and
how a measured spread of single calls carries over to a batch. Simulated time only: exact relations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.spec import CisSpec, Link, Node, validate
from cis.sim import SimConfig, simulate
from cis.sim.spans import KINDS, read_spans, span_columns, span_records, span_summary, write_spans

STAGE = 0.010  # seconds of each stage, any batch size up to 8 twice that
PROFILE = {1: {1: STAGE, 8: 2 * STAGE}, 2: {1: STAGE, 8: 2 * STAGE}}


FIVE_MS = Link(math.inf, 0.005)


def leaf_root(link: Link = FIVE_MS) -> CisSpec:
    return validate(CisSpec((
        Node("root", 2),
        Node("leaf", 1, parent="root", arrival_rate=1.0, max_transfer_rate=1e9, link=link),
    ), 2))


def replay(tmp_path, times, **config):
    trace = tmp_path / "trace.csv"
    trace.write_text("".join(f"leaf,{t}\n" for t in times))
    cfg = SimConfig(arrivals="trace", trace=str(trace), requests=len(times), shares={"leaf": 0.0},
                    service="deterministic", latency_profile=PROFILE, spans=True, **config)
    result = simulate(leaf_root(), cfg)
    return result, span_columns(span_records(result.spans, ["root", "leaf"]))


def by_parent(records: list[dict], rec: dict) -> dict:
    return next(r for r in records if r["span_id"] == rec["parent_id"])


def spans_of(cols, rid: int) -> dict[tuple[str, str], tuple[float, float]]:
    trace = f"{rid + 1:032x}"
    return {(n, k): (s, e) for n, k, s, e, t in zip(cols["node"], cols["kind"], cols["start"], cols["end"],
                                                     cols["trace_id"]) if t == trace}


def test_one_forwarded_request_has_every_span_where_its_time_went(tmp_path):
    """Arrives at 1.0 at the leaf: one stage (10 ms), a forward over a 5 ms link, the root's stage (10 ms), back."""
    result, cols = replay(tmp_path, [1.0])
    got = spans_of(cols, 0)
    assert got[("leaf", "queue")] == pytest.approx((1.0, 1.0))
    assert got[("leaf", "compute")] == pytest.approx((1.0, 1.010))
    assert got[("root", "queue")] == pytest.approx((1.015, 1.015))
    assert got[("root", "compute")] == pytest.approx((1.015, 1.025))
    assert got[("root", "request")] == pytest.approx((1.015, 1.025))
    assert got[("leaf", "forward")] == pytest.approx((1.010, 1.025))  # replies travel free on a payload wire
    assert got[("leaf", "request")] == pytest.approx((1.0, 1.025))
    assert result.requests["finish"][0] == pytest.approx(1.025)
    stages = {k: (f, t) for (n, k), f, t in zip(zip(cols["node"], cols["kind"]), cols["stage_from"],
                                                 cols["stage_to"]) if n == "root"}
    assert stages["compute"] == (2, 2) and stages["request"] == (2, 2)


def test_a_request_that_comes_during_a_batch_is_stamped_as_the_runtime_stamps_it(tmp_path):
    """The runtime's node reads its socket between batches and stamps what it reads after a batch with the time
    it last found the socket empty, just before that batch: the second request, there at 1.004 during the first
    batch (1.000-1.010), is admitted at 1.000 and waits until 1.010; the third, with batches of one, waits for
    the second's batch too."""
    _, cols = replay(tmp_path, [1.0, 1.004])
    second = spans_of(cols, 1)
    assert second[("leaf", "queue")] == pytest.approx((1.0, 1.010))
    assert second[("leaf", "compute")] == pytest.approx((1.010, 1.020))
    assert second[("leaf", "request")][0] == pytest.approx(1.0)
    third = spans_of(replay(tmp_path, [1.0, 1.004, 1.005], max_batch=1)[1], 2)
    assert third[("leaf", "queue")] == pytest.approx((1.0, 1.020))


def test_spans_cost_nothing_when_off_and_round_trip_through_the_file_format(tmp_path):
    off = simulate(leaf_root(), SimConfig(requests=50, seed=3, shares={"leaf": 0.5}))
    on = simulate(leaf_root(), SimConfig(requests=50, seed=3, shares={"leaf": 0.5}, spans=True))
    assert off.spans is None and "spans" not in off.summary
    assert off.summary["latency"] == on.summary["latency"]  # recording changes nothing
    assert set(on.summary["spans"]) == {"root", "leaf"} and set(on.summary["spans"]["leaf"]) <= set(KINDS)
    records = list(span_records(on.spans, ["root", "leaf"], {"root": None, "leaf": "root"}))
    up = [r for r in records if r["kind"] == "request" and r["node"] == "root"]
    assert up and all(by_parent(records, r)["kind"] == "forward" for r in up)  # a forward parents the root's
    assert write_spans(tmp_path / "twin.jsonl", records) == len(records) == len(on.spans["req"])
    back = read_spans([tmp_path / "twin.jsonl"])
    cols = span_columns(records)
    assert all(np.array_equal(back[k], cols[k]) for k in ("node", "kind", "req_id", "batch", "trace_id"))
    assert np.allclose(back["seconds"], cols["seconds"])
    first = json.loads((tmp_path / "twin.jsonl").read_text().splitlines()[0])
    assert set(first) == {"trace_id", "span_id", "parent_id", "node", "kind", "start", "end", "req_id", "samples",
                          "batch", "stage_from", "stage_to"}
    assert len(first["trace_id"]) == 32 and len(first["span_id"]) == 16
    by_id = {r["span_id"]: r for r in records}
    children = [r for r in records if r["kind"] != "request"]
    assert children and all(by_id[r["parent_id"]]["kind"] == "request" for r in children)
    summary = span_summary(cols)
    assert summary["leaf"]["compute"]["count"] == int(np.sum((cols["node"] == "leaf") & (cols["kind"] == "compute")))


def test_the_runtimes_reader_reads_the_twins_file_and_a_missing_file_is_one_line(tmp_path):
    """One format, one reader: the runtime's (a line a killed node cut short is skipped)."""
    from cis.runtime.spans import read_spans as runtime_reader

    result, _ = replay(tmp_path, [1.0])
    write_spans(tmp_path / "twin.jsonl", span_records(result.spans, ["root", "leaf"]))
    with open(tmp_path / "twin.jsonl", "a") as f:
        f.write('{"trace_id": "00')  # cut short
    assert len(runtime_reader(tmp_path / "twin.jsonl")) == len(result.spans["req"])
    assert len(read_spans([tmp_path / "twin.jsonl"])["node"]) == len(result.spans["req"])
    with pytest.raises(CisError, match=r"spans .*nothing.jsonl: cannot read \(FileNotFoundError\); expected a spans"):
        read_spans([tmp_path / "nothing.jsonl"])


def test_node_work_is_paid_once_per_batch_not_per_request(tmp_path):
    """Eight requests at once at the leaf: the first wakes it and runs with what is there, the rest in a second
    batch; each batch takes its stages' time (T(n), linear from 10 ms at 1 to 20 ms at 8) and 3 ms of node work
    once, not 3 ms per request."""
    _, cols = replay(tmp_path, [1.0] * 8, max_batch=8, batch_overhead={"leaf": 0.003})
    leaf = (cols["node"] == "leaf") & (cols["kind"] == "compute")
    n = cols["batch"][leaf]
    assert np.allclose(cols["seconds"][leaf], STAGE * (1 + (n - 1) / 7) + 0.003) and n.sum() > len(set(n))
    root = (cols["node"] == "root") & (cols["kind"] == "compute")
    m = cols["batch"][root]
    assert np.allclose(cols["seconds"][root], STAGE * (1 + (m - 1) / 7))  # "*" is not set: the root pays none
    every = replay(tmp_path, [1.0], batch_overhead={"*": 0.003})[1]
    assert np.allclose(every["seconds"][every["kind"] == "compute"], STAGE + 0.003)


def test_a_single_calls_spread_shrinks_over_a_batch_as_the_square_root_of_its_length(tmp_path):
    """Multipliers 0.5 and 1.5 of single calls: a batch of n takes T(n) = T(1) (1 + (n - 1) / 7) by the profile,
    so its multiplier is 1 -/+ 0.5 x sqrt(T(1) / T(n)) (at 8: 1 -/+ 0.5 x sqrt(1/2))."""
    _, single = replay(tmp_path, [1.0, 2.0, 3.0, 4.0], service_spread=(0.5, 1.5))
    alone = single["seconds"][(single["node"] == "leaf") & (single["kind"] == "compute")]
    assert set(np.round(alone / STAGE, 6)) <= {0.5, 1.5}
    _, cols = replay(tmp_path, [1.0] * 8 + [2.0] * 8 + [3.0] * 8, max_batch=8, service_spread=(0.5, 1.5))
    at = (cols["node"] == "leaf") & (cols["kind"] == "compute")
    n = cols["batch"][at]
    t = 1 + (n - 1) / 7
    unit = cols["seconds"][at] / (STAGE * t)
    assert np.allclose(np.abs(unit - 1), 0.5 * np.sqrt(1 / t)) and n.max() > 1


def test_cli_writes_spans_and_takes_node_work_per_batch(run_cli, tmp_path):
    from cis.core.spec import write_spec

    write_spec(leaf_root(Link(1e7, 0.001)), tmp_path / "spec.toml")
    res = run_cli("simulate", "--spec", tmp_path / "spec.toml", "--requests", "200", "--share", "leaf=0.5",
                  "--spans", "--batch-overhead", "0.001", "--batch-overhead", "root=0.002", "--out", tmp_path / "o",
                  "--json")
    assert res.code == 0, res.err
    out = res.json()
    assert out["config"]["batch_overhead"] == {"*": 0.001, "root": 0.002}
    assert out["spans"]["root"]["compute"]["count"] > 0
    assert len(read_spans([tmp_path / "o" / "spans.jsonl"])["node"]) > 200
    bad = run_cli("simulate", "--spec", tmp_path / "spec.toml", "--requests", "10", "--batch-overhead", "cloud=1")
    assert bad.code == 2 and "--batch-overhead cloud=1.0: no node 'cloud'" in bad.err
    worse = run_cli("simulate", "--spec", tmp_path / "spec.toml", "--requests", "10", "--batch-overhead", "soon")
    assert worse.code == 2 and "expected SECONDS or NODE=SECONDS" in worse.err


def test_node_work_per_batch_grows_with_how_long_the_node_slept(tmp_path):
    """A table by idle time: 1 ms after no sleep, 3 ms after a second or more, linear between."""
    table = ((0.0, 0.001), (1.0, 0.003))
    _, cols = replay(tmp_path, [0.2, 0.2105, 0.6, 3.0], batch_overhead={"leaf": table})
    at = np.flatnonzero((cols["node"] == "leaf") & (cols["kind"] == "compute"))
    at = at[np.argsort(cols["start"][at])]
    ends = np.concatenate([[0.0], cols["end"][at][:-1]])
    idle = cols["start"][at] - ends
    assert np.allclose(cols["seconds"][at], STAGE + np.interp(idle, [0.0, 1.0], [0.001, 0.003]))
    assert idle.min() < 0.001 and idle.max() > 1.0  # both ends of the table were used


def test_a_client_pays_its_messaging_once_and_each_forward_a_hop(tmp_path):
    """A forwarded request visits two nodes: with hop costs alone it pays two (2 x 2 ms); with an entry cost its
    client's messaging (10 ms) replaces the entry visit's, and the forward pays one hop (2 ms)."""
    free = Link(math.inf, 0.0)
    spec = leaf_root(free)
    trace = tmp_path / "one.csv"
    trace.write_text("leaf,1.0\n")
    base = dict(arrivals="trace", trace=str(trace), requests=1, shares={"leaf": 0.0}, service="deterministic",
                latency_profile=PROFILE, spans=True)
    hops = simulate(spec, SimConfig(hop_rtt=(0.002,), **base))
    both = simulate(spec, SimConfig(hop_rtt=(0.002,), entry_rtt=(0.010,), **base))
    assert hops.requests["finish"][0] - 1.0 == pytest.approx(2 * STAGE + 2 * 0.002)
    assert both.requests["finish"][0] - 1.0 == pytest.approx(2 * STAGE + 0.010 + 0.002)
    cols = span_columns(span_records(both.spans, spec.ids))
    forward = cols["seconds"][(cols["node"] == "leaf") & (cols["kind"] == "forward")]
    assert forward == pytest.approx([STAGE + 0.002])  # the hop's two halves and the root's stage


def test_messages_that_come_during_a_batch_make_it_longer_by_their_work(tmp_path):
    """Arrivals at 1.0 (it wakes the idle leaf), 1.002 and 1.004 (during its 10 ms batch): that batch runs 2 x 1 ms
    longer; the next batch (the two, 11.43 ms by the profile) had no message during it, so it takes its stages'
    time. Without message_work the first batch takes its stages' time alone."""
    work = 0.001
    _, cols = replay(tmp_path, [1.0, 1.002, 1.004], max_batch=8, message_work=work)
    at = np.flatnonzero((cols["node"] == "leaf") & (cols["kind"] == "compute"))
    at = at[np.argsort(cols["start"][at])]
    first, second = cols["seconds"][at][0], cols["seconds"][at][-1]
    assert cols["batch"][at][0] == 1 and first == pytest.approx(STAGE + 2 * work)
    assert cols["batch"][at][-1] == 2 and second == pytest.approx(STAGE * (1 + 1 / 7))
    _, free = replay(tmp_path, [1.0, 1.002, 1.004], max_batch=8)
    leaf = (free["node"] == "leaf") & (free["kind"] == "compute")
    assert free["seconds"][leaf].min() == pytest.approx(STAGE)


def test_message_work_is_read_from_the_latency_profile_file_and_checked(run_cli, tmp_path):
    from cis.cli.commands.simulate import read_latency_profile
    from cis.core.spec import write_spec

    profile = tmp_path / "latency.json"
    profile.write_text(json.dumps({"stages": {"1": {"1": STAGE}, "2": {"1": STAGE}}, "message_work": 0.0002}))
    assert read_latency_profile(str(profile))["message_work"] == 0.0002
    write_spec(leaf_root(Link(1e7, 0.001)), tmp_path / "spec.toml")
    profile.write_text(json.dumps({"stages": {"1": {"1": STAGE}, "2": {"1": STAGE}}, "message_work": -1}))
    bad = run_cli("simulate", "--spec", tmp_path / "spec.toml", "--requests", "10", "--latency-profile", profile)
    assert bad.code == 2 and "message_work is -1.0; expected seconds >= 0" in bad.err
