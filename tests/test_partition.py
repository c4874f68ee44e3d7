from types import SimpleNamespace

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.training.data.partition import format_partition_report, layer_shares, node_sizes, partition, partition_report


def paper7():
    """Stand-in for the paper's 7-node tree: 4 devices, 2 edges, 1 root."""
    exits = {"d1": 1, "d2": 1, "d3": 1, "d4": 1, "e1": 2, "e2": 2, "root": 3}
    return [SimpleNamespace(id=i, exit=e) for i, e in exits.items()]


LABELS = np.random.default_rng(0).integers(0, 10, size=7000)


def layer_totals(parts, nodes):
    totals = {}
    for n in nodes:
        totals[n.exit] = totals.get(n.exit, 0) + len(parts[n.id])
    return [totals[e] for e in sorted(totals)]


@pytest.mark.parametrize(
    "scheme, shares",
    [
        ("equal", [1 / 3] * 3),
        ("biased", [0.143, 0.286, 0.571]),
        ("highly-biased", [0.034, 0.199, 0.767]),
        ([1, 1, 2], [0.25, 0.25, 0.5]),
    ],
)
@pytest.mark.parametrize("alpha", [None, 0.3])
def test_layer_shares_and_cover(scheme, shares, alpha):
    nodes = paper7()
    parts = partition(LABELS, nodes, scheme, dirichlet_alpha=alpha, seed=1)
    everything = np.concatenate(list(parts.values()))
    assert len(everything) == len(LABELS) == len(np.unique(everything))  # disjoint and covering
    totals = layer_totals(parts, nodes)
    assert np.allclose(np.array(totals) / len(LABELS), shares, atol=1e-3)
    for exit_ in (1, 2):  # even split within a layer
        sizes = [len(parts[n.id]) for n in nodes if n.exit == exit_]
        assert max(sizes) - min(sizes) <= 1
    assert {k: len(v) for k, v in parts.items()} == node_sizes(len(LABELS), nodes, scheme)


@pytest.mark.parametrize("alpha", [None, 0.5])
def test_deterministic_under_seed(alpha):
    a = partition(LABELS, paper7(), "biased", alpha, seed=3)
    b = partition(LABELS, paper7(), "biased", alpha, seed=3)
    c = partition(LABELS, paper7(), "biased", alpha, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def top_class_share(parts):
    return np.mean([np.bincount(LABELS[idx], minlength=10).max() / len(idx) for idx in parts.values()])


def test_dirichlet_skews_labels_while_keeping_sizes():
    iid = partition(LABELS, paper7(), "equal", seed=0)
    skewed = partition(LABELS, paper7(), "equal", dirichlet_alpha=0.1, seed=0)
    assert top_class_share(iid) < 0.15
    assert top_class_share(skewed) > 0.3
    assert {k: len(v) for k, v in iid.items()} == {k: len(v) for k, v in skewed.items()}
    assert top_class_share(partition(LABELS, paper7(), "equal", dirichlet_alpha=100.0, seed=0)) < 0.15


def test_real_spec_nodes_work_when_available():
    topologies = pytest.importorskip("cis.core.topologies")
    spec = topologies.builtin_spec("paper-7")
    parts = partition(LABELS, spec.nodes, "highly-biased")
    assert sorted(parts) == sorted(n.id for n in spec.nodes)
    assert np.allclose(np.array(layer_totals(parts, spec.nodes)) / len(LABELS), [0.034, 0.199, 0.767], atol=1e-3)


def test_two_layer_network():
    nodes = [SimpleNamespace(id="dev", exit=1), SimpleNamespace(id="srv", exit=2)]
    assert layer_shares("equal", 2) == [0.5, 0.5]
    parts = partition(np.arange(10) % 3, nodes, [30, 70])
    assert (len(parts["dev"]), len(parts["srv"])) == (3, 7)
    with pytest.raises(CisError, match="expected 3"):
        partition(np.arange(10) % 3, nodes, "biased")


def test_report_and_table():
    parts = partition(LABELS, paper7(), "biased", seed=0)
    report = partition_report(LABELS, parts, 10)
    assert report["root"]["size"] == len(parts["root"]) == sum(report["root"]["histogram"])
    assert abs(sum(r["share"] for r in report.values()) - 1) < 1e-9
    table = format_partition_report(report)
    assert table.splitlines()[0].split()[:3] == ["node", "size", "share"]
    assert len(table.splitlines()) == 8
    labels = np.arange(700) % 100
    wide = format_partition_report(partition_report(labels, partition(labels, paper7()), 100))
    assert "top class" in wide.splitlines()[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scheme": "skewed"},
        {"scheme": [0.5, 0.5]},
        {"scheme": [0.5, -0.1, 0.6]},
        {"scheme": [0.5, "a", 0.6]},
        {"dirichlet_alpha": 0},
        {"dirichlet_alpha": -1.0},
        {"labels": np.zeros((4, 2), np.int64)},
        {"labels": np.zeros(10, np.float32)},
        {"labels": np.arange(5)},  # too few samples: some device gets none
        {"nodes": []},
        {"nodes": [SimpleNamespace(id="a", exit=1), SimpleNamespace(id="a", exit=2)]},
        {"nodes": [SimpleNamespace(id="a", exit=0)]},
    ],
)
def test_bad_input_raises_cis_error(kwargs):
    args = {"labels": LABELS, "nodes": paper7(), **kwargs}
    with pytest.raises(CisError):
        partition(**args)
