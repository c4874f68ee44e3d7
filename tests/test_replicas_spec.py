"""Replicas in the spec (issue 41 item 3): their ids and addresses, one rule in cis.core.replicas, and one line
for every way a spec can get them wrong."""

from __future__ import annotations

import pytest

from cis.core.errors import SpecError
from cis.core.replicas import derived_address, replica_ids, split_replica_id
from cis.core.spec import load_spec, parse_spec, spec_to_dict, write_spec


def _spec(**cloud) -> dict:
    return {
        "cis": {"exits": 2, "classes": 3},
        "nodes": [
            {"id": "cloud", "exit": 2, "address": "tcp://127.0.0.1:5600", **cloud},
            {"id": "edge", "exit": 1, "parent": "cloud", "address": "tcp://127.0.0.1:5700"},
        ],
    }


def test_replica_i_binds_the_nodes_port_plus_i_and_is_named_id_hash_i():
    spec = parse_spec(_spec(replicas=3))
    cloud = spec.node("cloud")
    assert cloud.replica_ids == ["cloud#0", "cloud#1", "cloud#2"]
    assert cloud.replica_addresses == ["tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]
    edge = spec.node("edge")  # one replica: the node's own id and address, as before replicas
    assert edge.replica_ids == ["edge"] and edge.replica_addresses == ["tcp://127.0.0.1:5700"]


def test_an_addresses_list_where_ports_do_not_follow_and_it_survives_a_round_trip(tmp_path):
    where = ["tcp://10.0.0.5:5555", "tcp://10.0.0.6:5555"]
    raw = _spec()
    del raw["nodes"][0]["address"]
    raw["nodes"][0]["addresses"] = where
    spec = parse_spec(raw)
    cloud = spec.node("cloud")
    assert cloud.replicas == 2 and cloud.replica_addresses == where  # replicas default to the list's length
    assert spec_to_dict(spec)["nodes"][0]["addresses"] == where
    write_spec(spec, tmp_path / "s.toml")
    assert load_spec(tmp_path / "s.toml") == spec
    assert "replicas" not in spec_to_dict(parse_spec(_spec()))["nodes"][0]  # one replica: not written


def test_the_core_rule_alone():
    assert replica_ids("cloud", 1) == ["cloud"]
    assert split_replica_id("cloud#2") == ("cloud", 2) and split_replica_id("cloud") == ("cloud", None)
    assert derived_address("tcp://[::1]:7000", 2) == "tcp://[::1]:7002"
    for bad in ("cloud#x", "#1"):
        with pytest.raises(ValueError, match="not a replica id"):
            split_replica_id(bad)


@pytest.mark.parametrize(
    "cloud, message",
    [
        ({"replicas": 2, "address": "ipc:///tmp/cloud"}, "no TCP port to count up from; expected addresses"),
        ({"replicas": 3, "address": "tcp://127.0.0.1:65534"}, "port 65536, past 65535"),
        ({"replicas": 2, "address": "tcp://127.0.0.1:5699"}, "edge would bind tcp://127.0.0.1:5700, as cloud#1 does"),
        ({"addresses": ["tcp://a:1", "tcp://b:1"]}, "both 'address' and 'addresses'"),
        ({"address": None, "addresses": ["tcp://a:1", "tcp://b:1"], "replicas": 3},
         "'replicas' is 3 but 'addresses' lists 2"),
        ({"address": None, "addresses": "tcp://a:1"}, "field 'addresses' is 'tcp://a:1'; expected a list"),
        ({"address": None, "addresses": []}, "field 'addresses' is []"),
        ({"replicas": 0}, "field 'replicas' is 0; expected a value >= 1"),
    ],
)
def test_each_mistake_is_one_line_naming_the_node(cloud, message):
    """(a clash names the node that comes second in the spec)"""
    raw = _spec(**cloud)
    raw["nodes"][0] = {k: v for k, v in raw["nodes"][0].items() if v is not None}
    with pytest.raises(SpecError) as err:
        parse_spec(raw, "s.toml")
    text = str(err.value)
    assert text.startswith("s.toml: node '") and message in text and "\n" not in text
