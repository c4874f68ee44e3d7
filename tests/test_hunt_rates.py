"""What a hunt of ``cis rates --measured`` / ``cis spec new|update`` / ``cis evaluate`` found, each pinned to its doc.

- an exit outside the spec's 1..E (7, -1) or a serving node the spec lacks, in a requests file, is one line
  naming the file and the row; ``cis spec update`` with that file writes nothing (docs/closed-loop.md);
- a hand-edited saved measurement (an exit 9, a negative count, a parent naming no node, kind "bogus") is one
  line naming the file; set beside a spec, exits beyond the spec's are one line too;
- ``cis spec update`` keeps a design's missing ``classes`` missing ("a copy of DESIGN"; docs/spec.md);
- an empty path (``-o ""``, ``--rates-from ""``, ``cis rates ""``) and ``-o FOLDER`` are one line each;
- ``cis evaluate`` on a run without a round says no "(round None)"; README's ``cis spec new`` row shows the
  optional flags in brackets with their defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cis.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
HEADER = "id,entry,node,exit,outcome,correct,arrive_s,finish_s,latency_s,flags\n"
GOOD_ROWS = [  # paper-7: device0..3 exit 1, edge0/1 exit 2, cloud exit 3
    ("device0", "device0", "1"), ("device0", "edge0", "2"), ("device1", "cloud", "3"), ("device2", "device2", "1"),
]


def _csv(path: Path, rows) -> Path:
    lines = [f"{k},{entry},{node},{ex},served,,{0.1 + k:.1f},{0.2 + k:.1f},0.1,0\n"
             for k, (entry, node, ex) in enumerate(rows)]
    path.write_text(HEADER + "".join(lines))
    return path


@pytest.fixture
def design(tmp_path):
    """paper-7 as ``cis spec new`` writes it without --classes (no classes key)."""
    out = tmp_path / "design.toml"
    assert main(["spec", "new", "-o", str(out)]) == 0
    return out


def _fails(capsys, argv, *words):
    """The command exits 2 with one line (no traceback) holding every word."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.mark.parametrize("exit_", ["7", "-1", "0"])
def test_requests_exit_outside_spec(tmp_path, capsys, design, exit_):
    bad = _csv(tmp_path / "q.csv", [GOOD_ROWS[0], ("device0", "device0", exit_), *GOOD_ROWS[1:]])
    _fails(capsys, ["rates", str(design), "--measured", str(bad)], str(bad), "row 3", "exit", "1..3")
    out = tmp_path / "up.toml"
    _fails(capsys, ["spec", "update", str(design), "--rates-from", str(bad), "-o", str(out)], "row 3", "1..3")
    assert not out.exists()


def test_requests_node_not_in_spec(tmp_path, capsys, design):
    bad = _csv(tmp_path / "q.csv", [*GOOD_ROWS, ("device0", "nonode", "1")])
    _fails(capsys, ["rates", str(design), "--measured", str(bad)], str(bad), "row 6", "'nonode'", "cloud")


def _saved(tmp_path, capsys, design) -> dict:
    good = _csv(tmp_path / "good.csv", GOOD_ROWS)
    capsys.readouterr()
    assert main(["rates", str(design), "--measured", str(good), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _edit_exit9(d):
    d["nodes"]["device0"]["served_per_exit"] = {"9": d["nodes"]["device0"]["served"]}


def _edit_negative(d):
    d["nodes"]["device0"]["served"] = -5


def _edit_negative_per_exit(d):
    d["nodes"]["device0"]["served_per_exit"] = {"1": -1}
    d["nodes"]["device0"]["served"] = -1


def _edit_forwarded(d):
    d["nodes"]["device0"]["forwarded"] = -3


def _edit_parent(d):
    d["nodes"]["device0"]["parent"] = "nonode"


def _edit_kind(d):
    d["measurement"]["kind"] = "bogus"


def _edit_node_exit(d):
    d["nodes"]["device0"]["exit"] = 9


EDITS = {
    "exit9": (_edit_exit9, "exit 9"), "negative": (_edit_negative, "-5"),
    "negative_per_exit": (_edit_negative_per_exit, "-1"), "forwarded": (_edit_forwarded, "-3"),
    "parent": (_edit_parent, "'nonode'"), "kind": (_edit_kind, "'bogus'"), "node_exit": (_edit_node_exit, "exit 9"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_saved_measurement_edits_refused(tmp_path, capsys, design, edit):
    data = _saved(tmp_path, capsys, design)
    change, word = EDITS[edit]
    change(data)
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps(data))
    _fails(capsys, ["rates", str(design), "--measured", str(bad)], str(bad), word)
    _fails(capsys, ["rates", "--measured", str(bad)], str(bad), word)  # without a spec too
    out = tmp_path / "up.toml"
    _fails(capsys, ["spec", "update", str(design), "--rates-from", str(bad), "-o", str(out)], str(bad))
    assert not out.exists()


def test_saved_measurement_more_exits_than_spec(tmp_path, capsys, design):
    data = _saved(tmp_path, capsys, design)
    data["measurement"]["exits"] = 4
    data["nodes"]["cloud"]["exit"] = 4
    data["nodes"]["cloud"]["served_per_exit"] = {"4": data["nodes"]["cloud"]["served"]}
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps(data))
    assert main(["rates", "--measured", str(bad)]) == 0  # its own 4 exits: consistent
    _fails(capsys, ["rates", str(design), "--measured", str(bad)], str(bad), "1..3")


def test_saved_measurement_round_trips(tmp_path, capsys, design):
    data = _saved(tmp_path, capsys, design)
    saved = tmp_path / "m.json"
    saved.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["rates", str(design), "--measured", str(saved), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["measurement"]["served"] == len(GOOD_ROWS)


def test_update_keeps_classes_out(tmp_path, capsys, design):
    from cis.core.spec import load_spec, states_classes

    good = _csv(tmp_path / "good.csv", GOOD_ROWS)
    out = tmp_path / "up.toml"
    assert main(["spec", "update", str(design), "--rates-from", str(good), "-o", str(out)]) == 0
    assert not states_classes(out), out.read_text()
    load_spec(out)
    capsys.readouterr()
    assert main(["spec", "update", str(design), "--rates-from", str(good), "--json"]) == 0
    assert "classes" not in json.loads(capsys.readouterr().out)["spec"]["cis"]
    stated = tmp_path / "c5.toml"  # a design that states its classes keeps them
    assert main(["spec", "new", "--classes", "5", "-o", str(stated)]) == 0
    assert main(["spec", "update", str(stated), "--rates-from", str(good), "-o", str(out)]) == 0
    assert states_classes(out) and load_spec(out).num_classes == 5


def test_empty_paths(tmp_path, capsys, design, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, ["spec", "new", "-o", ""], "-o", "empty", "expected")
    _fails(capsys, ["spec", "update", str(design), "--rates-from", ""], "--rates-from", "empty", "expected")
    good = _csv(tmp_path / "good.csv", GOOD_ROWS)
    _fails(capsys, ["spec", "update", str(design), "--rates-from", str(good), "-o", ""], "-o", "empty")
    _fails(capsys, ["rates", ""], "SPEC", "empty", "expected")
    _fails(capsys, ["rates", str(design), "--measured", ""], "--measured", "empty", "expected")


def test_out_folder(tmp_path, capsys, design):
    folder = tmp_path / "dir"
    folder.mkdir()
    _fails(capsys, ["spec", "new", "-o", str(folder)], str(folder), "folder", "expected a file")
    good = _csv(tmp_path / "good.csv", GOOD_ROWS)
    _fails(capsys, ["spec", "update", str(design), "--rates-from", str(good), "-o", str(folder)], "folder",
           "expected a file")


def test_evaluate_run_without_round(tmp_path, capsys):
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_run

    run = make_demo_run(tmp_path / "run", steps=2)
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "None" not in head and head.startswith(str(run)), head


def test_readme_spec_new_row():
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `cis spec new"))
    assert "[--topology paper-7\\|paper-17]" in row and "[--serving X-Y-Z]" in row, row
    assert "`--topology paper-7`" in row and "`--serving 80-15-5`" in row, row
