"""The spec: load, write back, and one clear error for every kind of mistake."""

from __future__ import annotations

import textwrap

import pytest

from cis.core.errors import SpecError
from cis.core.spec import load_spec, parse_spec, write_spec
from cis.core.topologies import make_spec

GOOD = """
[cis]
exits = 3
classes = 10

[[nodes]]
id = "root"
exit = 3

[[nodes]]
id = "edge"
parent = "root"
exit = 2
max_transfer_rate = 2.0
link = { bandwidth = 1e6, latency = 0.01 }

[[nodes]]
id = "leaf"
parent = "edge"
exit = 1
arrival_rate = 10.0
max_transfer_rate = 5.0
"""


def write(tmp_path, text):
    p = tmp_path / "spec.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_load_good_spec(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.ids == ["root", "edge", "leaf"]
    assert spec.root.id == "root"
    assert spec.node("edge").link.bandwidth == 1e6
    assert [n.id for n in spec.bottom_up()] == ["leaf", "edge", "root"]


def test_round_trip(tmp_path):
    spec = make_spec("paper-17", "60-30-10")
    path = tmp_path / "out.toml"
    write_spec(spec, path)
    assert load_spec(path) == spec


BAD = {
    "unknown parent": (GOOD.replace('parent = "edge"', 'parent = "edgy"'), "unknown parent 'edgy'"),
    "cycle": (GOOD.replace('id = "root"\nexit = 3', 'id = "root"\nparent = "leaf"\nexit = 3'), "cycle"),
    "two roots": (GOOD.replace('id = "edge"\nparent = "root"', 'id = "edge"'), "2 roots"),
    "exit not larger": (
        GOOD.replace('id = "edge"\nparent = "root"\nexit = 2', 'id = "edge"\nparent = "root"\nexit = 1'),
        "not larger than child",
    ),
    "exit out of range": (GOOD.replace('id = "root"\nexit = 3', 'id = "root"\nexit = 4'), "expected 1..3"),
    "exit zero": (GOOD.replace("exit = 1", "exit = 0"), "'exit' is 0"),
    "negative rate": (GOOD.replace("arrival_rate = 10.0", "arrival_rate = -1.0"), "'arrival_rate' is -1.0"),
    "non-numeric rate": (GOOD.replace("arrival_rate = 10.0", 'arrival_rate = "fast"'), "'arrival_rate' is 'fast'"),
    "bool rate": (GOOD.replace("max_transfer_rate = 5.0", "max_transfer_rate = true"), "'max_transfer_rate' is True"),
    "duplicate id": (GOOD.replace('id = "leaf"', 'id = "edge"'), "duplicate id"),
    "unknown node key": (GOOD.replace("arrival_rate = 10.0", "arival_rate = 10.0"), "unknown key 'arival_rate'"),
    "unknown cis key": (GOOD.replace("classes = 10", "clases = 10"), "unknown key 'clases'"),
    "unknown link key": (GOOD.replace("latency = 0.01", "latncy = 0.01"), "unknown key 'latncy'"),
    "bad confidence": (GOOD.replace("classes = 10", 'classes = 10\nconfidence = "vibes"'), "confidence is 'vibes'"),
    "no nodes": ("[cis]\nexits = 3\n", "no [[nodes]]"),
    "no cis table": ('[[nodes]]\nid = "a"\nexit = 1\n', "missing [cis]"),
    "missing exit": (
        GOOD.replace('id = "leaf"\nparent = "edge"\nexit = 1', 'id = "leaf"\nparent = "edge"'),
        "missing 'exit'",
    ),
    "not toml": ("[cis\nexits=", "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_validation_errors(tmp_path, case):
    text, expected = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert str(path) in message


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "nope.toml")


def test_error_names_the_node(tmp_path):
    with pytest.raises(SpecError, match="node 'leaf'"):
        load_spec(write(tmp_path, GOOD.replace("arrival_rate = 10.0", "arrival_rate = -1.0")))


def test_parse_spec_rejects_non_table():
    with pytest.raises(SpecError):
        parse_spec([], "x")


def test_provider_per_node_is_checked_and_round_trips(tmp_path):
    data = {
        "cis": {"exits": 2},
        "nodes": [{"id": "root", "exit": 2, "provider": "cuda"}, {"id": "leaf", "parent": "root", "exit": 1}],
    }
    spec = parse_spec(data, "t.toml")
    assert spec.node("root").provider == "cuda" and spec.node("leaf").provider is None
    write_spec(spec, tmp_path / "s.toml")
    assert load_spec(tmp_path / "s.toml").node("root").provider == "cuda"
    data["nodes"][0]["provider"] = "gpu"
    with pytest.raises(SpecError, match="'root': field 'provider' is 'gpu'; expected one of cpu, cuda, tensorrt, auto"):
        parse_spec(data, "t.toml")
