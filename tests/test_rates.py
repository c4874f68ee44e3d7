"""The rate calculus on hand-worked trees, and the x-y-z serving settings."""

from __future__ import annotations

import pytest

from cis.core.errors import CisError
from cis.core.rates import compute_rates
from cis.core.spec import CisSpec, Node
from cis.core.topologies import apply_serving, builtin_spec, make_spec, parse_serving


def tree(*nodes: Node, exits: int = 3) -> CisSpec:
    from cis.core.spec import validate

    return validate(CisSpec(tuple(nodes), exits))


def test_paper_figure_two_style_tree_with_binding_cap_and_local_arrivals():
    # Two leaves and a non-leaf with local arrivals; leaf b's cap binds, a's does not.
    spec = tree(
        Node("root", 2, arrival_rate=3.0),
        Node("a", 1, parent="root", arrival_rate=4.0, max_transfer_rate=10.0),
        Node("b", 1, parent="root", arrival_rate=6.0, max_transfer_rate=2.0),
        exits=2,
    )
    r = compute_rates(spec)
    assert r.transfer_rate == {"root": 0.0, "a": 4.0, "b": 2.0}
    assert r.serving_rate == {"root": 3.0 + 4.0 + 2.0, "a": 0.0, "b": 4.0}
    assert r.exit_serving_rate == {1: 4.0, 2: 9.0}
    assert r.total == pytest.approx(13.0)
    assert r.exit_share[1] == pytest.approx(4 / 13)
    assert r.served_fraction("b") == pytest.approx(4 / 6)


def test_three_level_chain_with_middle_arrivals():
    # leaf (5 r/s, cap 3) -> mid (2 r/s local, cap 4) -> root
    spec = tree(
        Node("root", 3),
        Node("mid", 2, parent="root", arrival_rate=2.0, max_transfer_rate=4.0),
        Node("leaf", 1, parent="mid", arrival_rate=5.0, max_transfer_rate=3.0),
    )
    r = compute_rates(spec)
    assert r.incoming == {"root": 4.0, "mid": 5.0, "leaf": 5.0}
    assert r.transfer_rate == {"root": 0.0, "mid": 4.0, "leaf": 3.0}
    assert r.serving_rate == {"root": 4.0, "mid": 1.0, "leaf": 2.0}
    assert r.exit_serving_rate == {1: 2.0, 2: 1.0, 3: 4.0}


def test_exit_without_nodes_has_zero_rate():
    spec = tree(Node("root", 3), Node("leaf", 1, parent="root", arrival_rate=1.0, max_transfer_rate=0.5))
    assert compute_rates(spec).exit_serving_rate == {1: 0.5, 2: 0.0, 3: 0.5}


@pytest.mark.parametrize("topology", ["paper-7", "paper-17"])
@pytest.mark.parametrize(
    "setting", ["80-15-5", "60-30-10", "45-35-20", "33-33-33", "20-35-45", "5-15-80", "100-0-0", "0-0-100"]
)
def test_serving_settings_reproduce_their_shares(topology, setting):
    spec = make_spec(topology, setting, total_rate=120.0)
    rates = compute_rates(spec)
    shares = parse_serving(setting)
    assert rates.total == pytest.approx(120.0)
    for e in (1, 2, 3):
        assert rates.exit_share[e] == pytest.approx(shares[e - 1], abs=1e-9)


def test_builtin_topology_shapes():
    p7, p17 = builtin_spec("paper-7"), builtin_spec("paper-17")
    assert [sum(n.exit == e for n in p7.nodes) for e in (1, 2, 3)] == [4, 2, 1]
    assert [sum(n.exit == e for n in p17.nodes) for e in (1, 2, 3)] == [12, 4, 1]
    assert all(n.arrival_rate == 0 for n in p7.nodes if n.exit > 1)


@pytest.mark.parametrize("bad", ["80-15", "a-b-c", "-5-5-100", "0-0-0"])
def test_bad_serving_setting(bad):
    with pytest.raises(CisError, match="serving setting"):
        parse_serving(bad, 3)


def test_apply_serving_wrong_length():
    with pytest.raises(CisError):
        apply_serving(builtin_spec(), [0.5, 0.5])


def test_cli_rates_json(tmp_path, run_cli):
    path = tmp_path / "s.toml"
    assert run_cli("spec", "new", "--topology", "paper-7", "--serving", "80-15-5", "-o", path).code == 0
    res = run_cli("rates", path, "--json")
    assert res.code == 0
    data = res.json()
    assert data["exits"]["1"]["share"] == pytest.approx(0.8)
    assert data["nodes"]["device0"] == {"exit": 1, "arrival_rate": 25.0, "transfer_rate": 5.0, "serving_rate": 20.0}
    human = run_cli("rates", path)
    assert "80.0%" in human.out


def test_cli_bad_spec_is_one_line(tmp_path, run_cli):
    path = tmp_path / "bad.toml"
    path.write_text("[cis]\nexits = 3\n[[nodes]]\nid='x'\nexit=9\n")
    res = run_cli("rates", path)
    assert res.code == 2
    assert res.err.count("\n") == 1 and "expected 1..3" in res.err
    assert "Traceback" not in res.err
