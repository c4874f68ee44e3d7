"""`cis train`'s bad inputs found by a hunt: each is one line and exit status 2, and leaves no run dir behind."""

from __future__ import annotations

import json

import pytest

from cis.core.errors import CisError, SpecError

SPEC = """[cis]
exits = {exits}

[[nodes]]
id = "root"
exit = {exits}

[[nodes]]
id = "leaf"
parent = "root"
exit = 1
arrival_rate = 1.0
"""


def refused(run_cli, out, *argv) -> str:
    """``cis train`` with ``argv`` into ``out``: exit status 2, one line, no traceback, nothing written."""
    r = run_cli("train", "--rounds", "1", "--local-steps", "1", "--no-progress", "--out", out, *argv)
    assert r.code == 2, r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not out.exists()
    return r.err


def test_a_broken_missing_or_folder_spec_is_one_line(tmp_path, run_cli):
    broken = tmp_path / "broken.toml"
    broken.write_text("[cis\nexits = 3\n")
    assert "not valid TOML" in refused(run_cli, tmp_path / "run", "--spec", broken)
    assert "spec file not found" in refused(run_cli, tmp_path / "run", "--spec", tmp_path / "missing.toml")
    assert "is a folder" in refused(run_cli, tmp_path / "run", "--spec", tmp_path)


def test_a_broken_spec_named_by_a_config_file_or_the_api_is_one_line(tmp_path, run_cli):
    """Past the CLI's own check: the reader of the spec's class count (states_classes) reads it checked."""
    from cis.core.spec import states_classes
    from cis.training.config import make_config
    from cis.training.run import train_run

    broken = tmp_path / "broken.toml"
    broken.write_text("[cis\nexits = 3\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        states_classes(broken)
    with pytest.raises(SpecError, match="is a folder"):
        states_classes(tmp_path)
    with pytest.raises(SpecError, match="not valid TOML"):
        train_run(make_config({}, {"spec": str(broken), "rounds": 1}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"spec": str(broken)}))
    assert "not valid TOML" in refused(run_cli, tmp_path / "run", "--config", cfg)


def test_a_huge_exit_count_is_refused(tmp_path, run_cli):
    from cis.core.spec import MAX_EXITS, parse_spec

    huge = tmp_path / "huge.toml"
    huge.write_text(SPEC.format(exits=10**9))
    assert f"expected a value in 1..{MAX_EXITS}" in refused(run_cli, tmp_path / "run", "--spec", huge)
    r = run_cli("rates", huge)  # every reader of a spec: the bound is the parser's
    assert r.code == 2 and "'exits' is 1000000000" in r.err
    parse_spec({"cis": {"exits": MAX_EXITS}, "nodes": [{"id": "root", "exit": MAX_EXITS}]})


def test_a_long_chain_of_nodes_is_checked_in_one_walk():
    """The tree check walks over each node once: a chain is not walked again from every node (that was quadratic
    in the node count). Counted by the ids' hashes, one per look-up."""
    from cis.core.spec import CisSpec, Node, _check_tree

    looked_up = [0]

    class Id(str):
        def __hash__(self) -> int:
            looked_up[0] += 1
            return str.__hash__(self)

    n = 500
    nodes = [Node(Id(f"n{i}"), 1, parent=Id(f"n{i + 1}") if i < n - 1 else None) for i in range(n)]
    with pytest.raises(SpecError, match="exit 1 is not larger"):
        _check_tree(CisSpec(tuple(nodes), 3), "chain")
    assert looked_up[0] < 20 * n


@pytest.mark.parametrize(
    ("argv", "key", "expected"),
    [
        (("--seed", "-1"), "seed", "an integer in 0..2**32-1"),
        (("--threads", "-1"), "threads", "an integer >= 1"),
        (("--local-epochs", "inf"), "local_epochs", "a finite positive number"),
        (("--lr", "inf"), "lr", "a finite positive number"),
        (("--eval-every", "0"), "eval_every", "an integer >= 1"),
        (("--eval-every", "-1"), "eval_every", "an integer >= 1"),
    ],
)
def test_bad_train_flags_are_refused_up_front(tmp_path, run_cli, argv, key, expected):
    err = refused(run_cli, tmp_path / "run", *argv)
    assert f"field {key!r}" in err and expected in err


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ('seed = "a"', "seed", "an integer in 0..2**32-1"),
        ("seed = -1", "seed", "an integer in 0..2**32-1"),
        ("checkpoint_every = 0", "checkpoint_every", "an integer >= 1"),
        ('momentum = "a"', "momentum", "a finite number >= 0"),
        ("weight_decay = -1", "weight_decay", "a finite number >= 0"),
        ("batch_size = 2.5", "batch_size", "an integer >= 1"),
        ('confidence = "bogus"', "confidence", "'max_softmax' or 'entropy' or 'margin'"),
    ],
)
def test_bad_config_file_values_are_refused_before_the_run_dir(tmp_path, run_cli, line, key, expected):
    cfg = tmp_path / "train.toml"
    cfg.write_text(line + "\n")
    err = refused(run_cli, tmp_path / "run", "--config", cfg)
    assert f"field {key!r}" in err and expected in err


def test_the_api_refuses_a_bad_seed():
    from cis.training.config import make_config

    with pytest.raises(CisError, match="seed"):
        make_config({}, {"seed": -1})
    assert make_config({}, {"seed": 2**32 - 1}).seed == 2**32 - 1


def test_a_cis_error_before_the_first_checkpoint_leaves_no_run_dir(tmp_path, monkeypatch, one_torch_thread):
    """A CisError that ends a new run after its dir was made (here: in the first round's validation) removes
    what the run wrote, as a failure of the model does."""
    import cis.training.run as run_module
    from cis.training.config import make_config

    def bad_evaluation(s):
        raise CisError("a mistake found mid-run")

    monkeypatch.setattr(run_module, "evaluate_round", bad_evaluation)
    out = tmp_path / "run"
    config = make_config({}, {"rounds": 1, "local_steps": 1})
    with pytest.raises(CisError, match="a mistake found mid-run"):
        run_module.train_run(config, out, progress=False)
    assert not out.exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")  # a folder that was there: only the run's files go
    with pytest.raises(CisError):
        run_module.train_run(config, tmp_path / "kept", progress=False)
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]


def test_a_file_in_the_way_of_out_is_named_as_a_file(tmp_path, run_cli):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, argv in ((afile, ()), (afile, ("--resume",)), (afile / "sub", ())):
        r = run_cli("train", "--rounds", "1", "--no-progress", "--out", out, *argv)
        assert r.code == 2 and f"{afile}: a file; expected a folder" in r.err, r.err
        assert "File exists" not in r.err and "Not a directory" not in r.err
    from cis.training.run import write_run_start

    # the Flower engine's ServerApp makes the dir this way
    with pytest.raises(CisError, match="a file; expected a folder"):
        write_run_start(None, afile)  # type: ignore[arg-type]


def test_an_empty_spec_path_says_it_is_empty():
    from cis.core.spec import load_spec

    with pytest.raises(CisError, match="^spec path is empty; expected a TOML file"):
        load_spec("")
