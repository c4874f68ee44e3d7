"""Spec mistakes a hunt found accepted: node ids the wire refuses or replica names clash with, serving settings
that do not add up to 100, a [cis] name that is not a string. Each is one line and a non-zero exit."""

from __future__ import annotations

import textwrap

import pytest

from cis.core.errors import CisError, SpecError
from cis.core.replicas import MAX_ID_CHARS
from cis.core.spec import Node, load_spec, parse_spec
from cis.core.topologies import make_spec, parse_serving
from cis.runtime.wire import MAX_NAME, is_name


def spec_text(leaf_id: str = "leaf", replicas: int = 1, name: str = '"t"') -> str:
    return textwrap.dedent(f"""
        [cis]
        name = {name}
        exits = 2

        [[nodes]]
        id = "root"
        exit = 2

        [[nodes]]
        id = "{leaf_id}"
        parent = "root"
        exit = 1
        replicas = {replicas}
        address = "tcp://127.0.0.1:5600"
        """)


def write(tmp_path, text: str):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def one_line_error(run_cli, *argv) -> str:
    r = run_cli(*argv)
    assert r.code != 0
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1, r.err
    assert "Traceback" not in r.err
    return lines[0]


# 1. ids the wire refuses (docs/protocol.md: node ids of 1..128 characters)


def test_an_id_of_128_characters_is_one_the_wire_takes(tmp_path):
    assert MAX_ID_CHARS == MAX_NAME  # the spec's limit is the wire's
    spec = load_spec(write(tmp_path, spec_text("e" * MAX_NAME)))
    assert all(is_name(n.id) for n in spec.nodes)


def test_an_id_over_128_characters_is_refused_in_one_line(tmp_path, run_cli):
    path = write(tmp_path, spec_text("e" * 140))
    with pytest.raises(SpecError, match=r"140 characters.*expected 1\.\.128 characters"):
        load_spec(path)
    line = one_line_error(run_cli, "rates", path)
    assert "'eeee" in line and "128" in line and "spec.toml" in line


def test_a_replica_id_over_128_characters_is_refused(tmp_path):
    # replica 1 of a 127-character id is ID#1, 129 characters: its pings would be refused bad_message
    load_spec(write(tmp_path, spec_text("e" * 126, replicas=2)))  # e...e#1: 128
    with pytest.raises(SpecError, match=r"replica id .*129 characters.*expected .*128"):
        load_spec(write(tmp_path, spec_text("e" * 127, replicas=2)))


def test_an_empty_id_is_refused():
    base = make_spec("paper-7", "60-30-10")
    with pytest.raises(SpecError, match="id"):
        base.replace_nodes([*base.nodes[:-1], Node(**{**base.nodes[-1].__dict__, "id": ""})])


# 2. '#' is reserved for replica ids (ID#i)


@pytest.mark.parametrize("bad", ["edge1#1", "a#b", "#", "edge#"])
def test_an_id_with_a_hash_is_refused(tmp_path, run_cli, bad):
    path = write(tmp_path, spec_text(bad))
    with pytest.raises(SpecError, match=r"'#'.*replica"):
        load_spec(path)
    line = one_line_error(run_cli, "rates", path)
    assert repr(bad) in line and "#" in line


def test_a_hash_id_built_in_code_is_refused_too():
    base = make_spec("paper-7", "60-30-10")
    nodes = [Node(**{**n.__dict__, "id": "cloud#1"}) if n.id == "device3" else n for n in base.nodes]
    with pytest.raises(SpecError, match="'cloud#1'.*'#'"):
        base.replace_nodes(nodes)


# 3. serving settings are percentages that add up to 100 (docs/spec.md, Rate calculus)


@pytest.mark.parametrize("bad", ["80-15-6", "80-15-4", "100-0-1", "99-0-0", "0.8-0.15-0.05", "60-30-11"])
def test_a_serving_setting_that_does_not_add_up_to_100_is_refused(bad):
    with pytest.raises(CisError, match=rf"serving setting '{bad}': .*add up to .*expected percentages"):
        parse_serving(bad, 3)


def test_spec_new_refuses_80_15_6_in_one_line(tmp_path, run_cli):
    line = one_line_error(run_cli, "spec", "new", "--serving", "80-15-6", "-o", tmp_path / "s.toml")
    assert "80-15-6" in line and "101" in line and "100" in line
    assert not (tmp_path / "s.toml").exists()


def test_train_and_evaluate_use_the_same_rule(tmp_path, run_cli):
    from cis.exporter.fixture_bundle import make_demo_run

    line = one_line_error(run_cli, "train", "--serving", "80-15-6", "--rounds", "1", "--out", tmp_path / "t")
    assert "serving setting '80-15-6': the shares add up to 101" in line
    assert not (tmp_path / "t").exists()
    run_dir = make_demo_run(tmp_path / "run", steps=1)
    line = one_line_error(run_cli, "evaluate", run_dir, "--serving", "80-15-6")
    assert "serving setting '80-15-6': the shares add up to 101" in line
    assert run_cli("evaluate", run_dir, "--serving", "33-33-33", "--json").code == 0


@pytest.mark.parametrize(
    "good, shares",
    [
        ("80-15-5", [0.8, 0.15, 0.05]),
        ("33-33-33", [1 / 3] * 3),  # whole-number roundings of thirds (cis train's default)
        ("33-33-34", [0.33, 0.33, 0.34]),
        ("33.3-33.3-33.4", [0.333, 0.333, 0.334]),
        ("34-33-34", [34 / 101, 33 / 101, 34 / 101]),
        ("0-0-100", [0.0, 0.0, 1.0]),
    ],
)
def test_settings_that_add_up_to_100_or_round_to_it_are_taken(good, shares):
    assert parse_serving(good, 3) == pytest.approx(shares, abs=1e-12)


def test_spec_new_33_33_33_as_the_docs_show(tmp_path, run_cli):
    r = run_cli("spec", "new", "--topology", "paper-7", "--serving", "33-33-33", "-o", tmp_path / "s.toml")
    assert r.code == 0, r.err
    load_spec(tmp_path / "s.toml")


# 4. [cis] name is a string


@pytest.mark.parametrize("bad", ["5", "[1, 2]", "true", "1.5", "{ a = 1 }"])
def test_a_name_that_is_not_a_string_is_refused(tmp_path, run_cli, bad):
    path = write(tmp_path, spec_text(name=bad))
    with pytest.raises(SpecError, match=r"\[cis\] name is .*; expected a string"):
        load_spec(path)
    line = one_line_error(run_cli, "rates", path)
    assert "name" in line


def test_a_string_name_is_kept_and_a_missing_one_is_the_file_name(tmp_path):
    assert load_spec(write(tmp_path, spec_text(name='"my cis"'))).name == "my cis"
    data = {"cis": {"exits": 1}, "nodes": [{"id": "only", "exit": 1}]}
    assert parse_spec(data, str(tmp_path / "plain.toml")).name == "plain"
