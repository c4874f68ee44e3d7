"""What a live CIS measures, read back (cis.runtime.measure, ``cis rates --measured``, ``cis spec update``).

A real paper-7 digits tree (one process per node, ZeroMQ on loopback, /metrics on) is measured
over a window while cis.Client sends requests through the leaves: per node the served counts
equal the replies' ``served_by`` tally and the arrivals what was sent there, per exit the shares
are within 1 point of the tally; through each node's status and through its /metrics. Then a
requests file of ``cis infer --out``, a saved measurement and the spec they update.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import read_until, start  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.policy.exit_policy import assign_entries  # noqa: E402
from cis.core.rates import compute_rates  # noqa: E402
from cis.core.spec import CisSpec, Node, load_spec, validate, write_spec  # noqa: E402
from cis.runtime.client import Client, infer_spread  # noqa: E402
from cis.runtime.launcher import launch  # noqa: E402
from cis.runtime.measure import measure, read_requests_file  # noqa: E402

WINDOW = 8.0  # seconds between the two snapshots; the load below takes well under one


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A live paper-7 tree (60-30-10 caps, 100 requests/s designed) with a log folder and /metrics."""
    from cis.exporter.fixture_bundle import make_demo_bundle

    tmp = tmp_path_factory.mktemp("measured")
    bundle_dir = make_demo_bundle(tmp, steps=300)
    spec = load_bundle(bundle_dir).spec
    design = tmp / "design.toml"
    write_spec(spec, design)
    logs = tmp / "logs"
    cluster = launch(bundle_dir, spec, spec_file=str(design), free_ports=True, log_dir=str(logs), metrics_port=0)
    live = spec.replace_nodes(replace(n, address=cluster.addresses[n.id]) for n in spec.nodes)
    live_file = tmp / "live.toml"
    write_spec(live, live_file)
    try:
        yield {"spec": spec, "design": design, "logs": logs, "live": live_file, "cluster": cluster, "tmp": tmp}
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def digits():
    from cis.training.data.loading import load_dataset

    return load_dataset("digits", seed=0).test


def send(tree, x, seed: int):
    """Each sample to the leaf assign_entries gives it; (replies, entries)."""
    spec = tree["spec"]
    entries = assign_entries(spec, len(x), seed)
    clients = {nid: Client(tree["cluster"].addresses[nid], timeout=20) for nid in entries}
    try:
        results = infer_spread(clients, x, entries, window=8, timeout=20)
    finally:
        for c in clients.values():
            c.close()
    assert all(r is not None and r.error is None for r in results)
    return results, entries


def test_a_window_counts_what_the_client_sent_through_status_and_metrics(tree, digits):
    spec = tree["spec"]
    urls = [a for nid in spec.ids for a in ("--connect", tree["cluster"].metrics[nid])]
    by_status = start("rates", "--measured", tree["logs"], "--window", WINDOW, "--json")
    by_metrics = start("rates", tree["design"], *urls, "--window", WINDOW, "--json")
    by_metrics_alone = start("rates", *urls, "--window", WINDOW, "--json")  # the tree from cis_build_info
    procs = (by_status, by_metrics, by_metrics_alone)
    for proc in procs:
        read_until(proc.stderr, proc, "first snapshot")
    results, entries = send(tree, digits.x[:240], seed=3)
    tally = Counter(r.served_by[0] for r in results)
    exit_of = {n.id: n.exit for n in spec.nodes}
    exit_tally = Counter(exit_of[nid] for nid in (r.served_by[0] for r in results))
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        got = json.loads(out)
        assert (got["design"] is None) == (proc is by_metrics_alone)
        assert {i: n["parent"] for i, n in got["nodes"].items()} == {n.id: n.parent for n in spec.nodes}
        for nid in spec.ids:
            row = got["nodes"][nid]
            assert row["served"] == tally[nid], (got["measurement"]["kind"], nid)
            assert row["arrived"] == len(entries.get(nid, ())), (got["measurement"]["kind"], nid)
            assert row["measured"]["serving_rate"] == pytest.approx(row["served"] / got["measurement"]["seconds"])
        assert got["measurement"]["served"] == len(results)
        for e in range(1, spec.num_exits + 1):
            share = got["exits"][str(e)]["measured"]["share"]
            assert abs(share - exit_tally[e] / len(results)) <= 0.01
            if got["design"] is not None:
                assert got["exits"][str(e)]["spec"]["share"] == pytest.approx(compute_rates(spec).exit_share[e])
        assert got["measurement"]["seconds"] >= WINDOW  # the second snapshot never comes early


def test_counters_since_start_add_up_and_the_tree_comes_from_the_nodes(tree, digits):
    spec = tree["spec"]
    send(tree, digits.x[:60], seed=4)
    addresses = [tree["cluster"].addresses[nid] for nid in spec.ids]
    m = measure(connect=addresses)  # no spec: the parents from the status replies
    assert m.kind == "status" and m.seconds > 0
    assert {i: n.parent for i, n in m.nodes.items()} == {n.id: n.parent for n in spec.nodes}
    leaves_sent = sum(n.arrived for n in m.nodes.values())
    assert leaves_sent == m.served  # every sample answered: what arrived was served somewhere
    rates = m.rates()
    for nid in spec.ids:  # the calculus' identity: what reaches a node is served or forwarded
        assert rates.incoming[nid] == pytest.approx(rates.serving_rate[nid] + rates.transfer_rate[nid])


def test_a_requests_file_of_cis_infer_reads_back_and_updates_the_design(tree, run_cli, tmp_path):
    csv_file = tmp_path / "requests.csv"
    r = run_cli("infer", "--spec", tree["live"], "--dataset", "digits", "--n", "150", "--out", csv_file, "--json")
    assert r.code == 0, r.err
    rows = list(__import__("csv").DictReader(open(csv_file)))
    assert len(rows) == 150 and all(row["entry"] and row["sent_s"] for row in rows)
    r = run_cli("rates", tree["design"], "--measured", csv_file, "--json")
    assert r.code == 0, r.err
    got = r.json()
    served, arrived = Counter(row["node"] for row in rows), Counter(row["entry"] for row in rows)
    assert {i: n["served"] for i, n in got["nodes"].items()} == {i: served[i] for i in got["nodes"]}
    assert {i: n["arrived"] for i, n in got["nodes"].items()} == {i: arrived[i] for i in got["nodes"]}
    sent = np.array([float(row["sent_s"]) for row in rows])
    assert got["measurement"]["seconds"] == pytest.approx(sent.max() - sent.min())

    saved = tmp_path / "measured.json"
    saved.write_text(r.out)
    text = run_cli("rates", tree["design"], "--measured", csv_file).out
    assert "(requests)" in text and "share diff" in text and all(nid in text for nid in got["nodes"])
    again = run_cli("rates", tree["design"], "--measured", saved, "--json").json()
    assert again["nodes"] == got["nodes"] and again["measurement"]["kind"] == "saved"

    updated = tmp_path / "updated.toml"
    r = run_cli("spec", "update", tree["design"], "--rates-from", saved, "-o", updated)
    assert r.code == 0, r.err
    text = updated.read_text()
    assert text.startswith("# A CIS spec updated from a measurement") and str(csv_file) in text
    new, design = load_spec(updated), tree["spec"]
    for n, d in zip(new.nodes, design.nodes):
        assert n.arrival_rate == pytest.approx(got["nodes"][n.id]["measured"]["arrival_rate"], abs=1e-6)
        assert n.max_transfer_rate == d.max_transfer_rate and n.exit == d.exit and n.parent == d.parent
    r = run_cli("spec", "update", tree["design"], "--rates-from", saved, "--caps", "--json")
    capped = r.json()["spec"]["nodes"]
    for n in capped:
        if n.get("parent"):
            assert n["max_transfer_rate"] == pytest.approx(got["nodes"][n["id"]]["measured"]["transfer_rate"], abs=1e-6)


# ---------------------------------------------------------------- files and mistakes, no processes


def chain() -> CisSpec:
    return validate(CisSpec((
        Node("root", 3), Node("mid", 2, parent="root", max_transfer_rate=1.0),
        Node("leaf", 1, parent="mid", arrival_rate=4.0, max_transfer_rate=2.0),
        Node("side", 2, parent="root", arrival_rate=1.0, max_transfer_rate=0.5),
    ), 3, name="chain"))


def write_sim_requests(path, rows) -> None:
    """The simulator's layout (cis.core.records.REQUEST_COLUMNS): (entry, node, exit, arrive_s)."""
    from cis.core.records import write_requests

    write_requests(path, {
        "id": list(range(len(rows))), "entry": [r[0] for r in rows], "node": [r[1] for r in rows],
        "exit": [r[2] for r in rows], "outcome": ["served" if r[1] else "dropped" for r in rows],
        "arrive_s": [r[3] for r in rows],
    })


def test_requests_file_forwarding_follows_the_path_and_the_window_takes_the_last_seconds(tmp_path):
    rows = [("leaf", "leaf", 1, 0.0), ("leaf", "mid", 2, 1.0), ("leaf", "root", 3, 2.0), ("side", "side", 2, 3.0),
            ("side", "root", 3, 4.0), ("leaf", "", None, 5.0)]
    f = tmp_path / "requests.csv"
    write_sim_requests(f, rows)
    m = read_requests_file(f, chain())
    assert m.seconds == 5.0
    assert {i: (n.arrived, n.served, n.forwarded) for i, n in m.nodes.items()} == {
        "root": (0, 2, 0), "mid": (0, 1, 1), "leaf": (3, 1, 2), "side": (2, 1, 1)
    }
    assert m.rates().exit_serving_rate == {1: 0.2, 2: 0.4, 3: 0.4}
    last = read_requests_file(f, chain(), window=2.5)  # arrivals at t >= 2.5: rows 4-6 (the drop not served)
    assert last.seconds == 2.5 and last.served == 2 and last.nodes["side"].arrived == 2


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("nowhere", "root", 3, 0.0), ("leaf", "leaf", 1, 1.0)], "entry 'nowhere' is not a node"),
        ([("side", "mid", 2, 0.0), ("leaf", "leaf", 1, 1.0)], "not on its way to the root"),
        ([("leaf", "", None, 0.0), ("side", "", None, 1.0)], "no request was served"),
        ([("leaf", "leaf", 1, 2.0)], "spread over time"),
    ],
)
def test_bad_requests_files_are_one_line(tmp_path, run_cli, rows, message):
    f, spec = tmp_path / "requests.csv", tmp_path / "chain.toml"
    write_sim_requests(f, rows)
    write_spec(chain(), spec)
    r = run_cli("rates", spec, "--measured", f)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1


def test_user_mistakes_are_one_line_exit_2(tmp_path, run_cli):
    spec = tmp_path / "chain.toml"
    write_spec(chain(), spec)
    f = tmp_path / "old.csv"
    f.write_text("sample,exit,node\n0,1,leaf\n")
    saved = tmp_path / "m.json"
    saved.write_text("{}")
    for argv, message in (
        (("rates",), "nothing to compute"),
        (("rates", "--measured", f), "pass the spec"),
        (("rates", spec, "--measured", f), "no column 'entry'"),
        (("rates", spec, "--measured", saved), "not a saved measurement"),
        (("rates", spec, "--measured", saved, "--window", "3"), "keeps its own window"),
        (("rates", spec, "--measured", tmp_path / "missing.csv"), "not found"),
        (("rates", spec, "--measured", tmp_path), "cluster.json"),
        (("rates", "--connect", "http://127.0.0.1:9/metrics"), "pass --window"),
        (("rates", spec, "--measured", spec, "--window", "-1"), "--window is -1"),
        (("spec", "update", spec, "--rates-from", saved), "not a saved measurement"),
    ):
        r = run_cli(*argv)
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, (argv, r.err)


def test_a_measurement_of_other_nodes_does_not_update_a_design(tmp_path, run_cli):
    f = tmp_path / "requests.csv"
    write_sim_requests(f, [("leaf", "leaf", 1, 0.0), ("leaf", "root", 3, 1.0)])
    spec, other = tmp_path / "chain.toml", tmp_path / "other.toml"
    write_spec(chain(), spec)
    r = run_cli("rates", spec, "--measured", f, "--json")
    saved = tmp_path / "m.json"
    saved.write_text(r.out)
    small = validate(CisSpec((Node("root", 3), Node("leaf", 1, parent="root", arrival_rate=1.0)), 3, name="small"))
    write_spec(small, other)
    r = run_cli("spec", "update", other, "--rates-from", saved)
    assert r.code == 2 and "has node 'mid', which the spec lacks" in r.err
    assert math.isclose(json.loads(saved.read_text())["measurement"]["seconds"], 1.0)
