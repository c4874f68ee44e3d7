"""One line for bad input to ``cis infer``, ``cis bench``, the Python API and the top-level error line (a hunt's
findings): seeds out of numpy's range, an empty ``--connect``, a ``--duration`` whose send times are drawn as they
fall due (never all up front), the API's data, out, spec, labels, timeout, address and node options checked before
anything runs, and the file a binary text file or a file in a folder's way is named.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from test_bundle import bundle_dir, weights  # noqa: E402, F401  (a hand-built 3-stage ONNX bundle: no torch)

import cis  # noqa: E402
from cis.cli.os_errors import os_error_line, undecodable_file  # noqa: E402
from cis.core.errors import CisError  # noqa: E402
from cis.runtime.load_transports import Answer  # noqa: E402
from cis.runtime.loadgen import drive, schedule, send_offsets  # noqa: E402

DEAD = "tcp://127.0.0.1:1"  # nothing listens there


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- cis infer, cis bench


@pytest.mark.parametrize("value", ["-1", "4294967296", "1.5"])
@pytest.mark.parametrize("command", [
    ("infer", "--connect", DEAD, "--dataset", "digits", "--n", "1", "--timeout", "1"),
    ("bench", DEAD, "--rate", "1", "--requests", "1", "--timeout", "1"),
])  # fmt: skip
def test_a_seed_numpy_cannot_take_is_one_line(run_cli, command, value):
    res = run_cli(*command, f"--seed={value}")
    assert res.code == 2
    line = one_line(res.err)
    assert line.startswith(f"cis {command[0]}: error: argument --seed: '{value}'") and "0..4294967295" in line


@pytest.mark.parametrize("connect", ["", " ", " , "])
def test_infer_connect_with_no_address_is_one_line(run_cli, connect):
    res = run_cli("infer", "--connect", connect, "--dataset", "digits", "--n", "1", "--timeout", "1")
    assert res.code == 2
    assert one_line(res.err) == (f"cis infer: error: --connect {connect!r}: no address; expected a node's address, "
                                 "e.g. tcp://HOST:PORT (several separated by commas)")  # fmt: skip


def test_send_times_are_drawn_as_they_fall_due_not_all_up_front():
    """A --duration of 1e9 s at a million requests per second: its first send times come at once (the whole
    schedule, 1e15 of them, would never fit in memory), the same as the schedule's of that many requests."""
    start = time.perf_counter()
    first = list(itertools.islice(send_offsets("poisson", 1e6, duration=1e9, seed=3), 1000))
    assert time.perf_counter() - start < 60  # generous: a machine under load; the old code never got here
    assert np.array_equal(first, schedule("poisson", 1e6, requests=1000, seed=3))
    assert np.allclose(schedule("uniform", 40.0, duration=2.0), np.arange(80) / 40)


class Echo:
    """A transport that answers at once, noting when each request went out."""

    name = "echo"

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def call(self, address: str, body: object) -> Answer:
        self.calls.append(time.perf_counter())
        return Answer(cls=0, exit=1, node="n", confidence=1.0, flags=0)


def test_the_load_reads_each_send_time_when_the_one_before_has_gone():
    """drive() takes an iterator of send times and reads the next only once the request before it is sent: a
    long load holds none of its send times ahead."""
    echo = Echo()
    read: list[float] = []

    def offsets():
        for k in range(4):
            read.append(time.perf_counter())
            assert len(echo.calls) >= k - 1  # request k-1 was sent before time k is asked for (a task: k-2 ran)
            yield k * 0.01

    sent, latency, errors, answers, _ = asyncio.run(drive(echo, [{"input": 0}], ["a", "b"], offsets(), 5.0))
    assert len(sent) == 4 and errors == [None] * 4 and np.all(np.isfinite(latency))
    assert len(read) == 4 and all(a is not None for a in answers)


@pytest.mark.parametrize("duration", ["0", "-1", "nan", "inf"])
def test_a_duration_that_cannot_work_is_one_line(run_cli, duration):
    res = run_cli("bench", DEAD, "--rate", "10", f"--duration={duration}")
    assert res.code == 2
    assert one_line(res.err) == f"cis bench: error: --duration {duration}: expected seconds > 0"


def test_bench_out_with_a_file_in_the_way_is_one_line_before_the_load(run_cli, tmp_path):
    (tmp_path / "taken").write_text("x")
    res = run_cli("bench", DEAD, "--rate", "1", "--requests", "1", "--out", tmp_path / "taken" / "load")
    assert res.code == 2
    assert one_line(res.err) == (f"cis bench: error: --out: {tmp_path / 'taken'}: a file; expected a folder "
                                 f"(for {tmp_path / 'taken' / 'load'})")  # fmt: skip


# ---------------------------------------------------------------- the Python API


XY = (np.random.default_rng(0).random((12, 4)).astype(np.float32), np.arange(12) % 3)


def test_train_data_as_a_dict_says_what_data_may_be(tmp_path):
    with pytest.raises(CisError, match=r"cis.train train_data: a dict; expected a tuple \(x, y\) of arrays"):
        cis.train(None, {"x": XY[0], "y": XY[1]}, out=tmp_path / "run", rounds=1)
    with pytest.raises(CisError, match=r"cis.train val_data: a int; expected a tuple"):
        cis.train(None, XY, val_data=5, test_data=XY, out=tmp_path / "run", rounds=1)
    assert not (tmp_path / "run").exists()  # nothing left behind


def test_train_out_where_a_file_stands_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("x")
    for out in (tmp_path / "taken", tmp_path / "taken" / "run"):
        said = f"cis.train: out .the run dir.: {tmp_path / 'taken'}: a file; expected a folder"
        with pytest.raises(CisError, match=said):
            cis.train(None, XY, out=out, rounds=1)
    assert (tmp_path / "taken").read_text() == "x"


@pytest.mark.parametrize("spec", [5, {"cis": {}}, 2.5])
def test_train_and_serve_say_what_a_spec_may_be(tmp_path, spec):
    with pytest.raises(CisError, match=r"cis.train: spec is a \w+ .*; expected a spec file \(TOML\) or a CisSpec"):
        cis.train(None, XY, spec=spec, out=tmp_path / "run", rounds=1)
    with pytest.raises(CisError, match=r"cis.serve: spec is a \w+ .*; expected a spec file \(TOML\) or a CisSpec"):
        cis.serve(tmp_path / "no-bundle", spec=spec)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", [None, "[[node\nbad"])
def test_train_with_a_spec_file_missing_or_broken_is_one_line(tmp_path, text):
    pytest.importorskip("torch")
    path = tmp_path / "spec.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(CisError, match=str(path)):
        cis.train(None, XY, spec=path, out=tmp_path / "run", rounds=1)
    assert not (tmp_path / "run").exists()


def test_infer_refuses_labels_of_another_length_before_sending():
    with pytest.raises(CisError, match=r"cis.infer: y has shape \(5,\) for 10 samples in x; expected one label per"):
        cis.infer(DEAD, np.zeros((10, 4), np.float32), np.arange(5), timeout=1.0)  # would wait 1 s if it sent


@pytest.mark.parametrize("timeout", [0, 0.0, -1.0, float("nan"), float("inf"), "5", True])
def test_client_refuses_a_timeout_that_cannot_work(timeout):
    with pytest.raises(CisError, match=r"timeout is .*; expected a finite number of seconds > 0"):
        cis.Client(DEAD, timeout=timeout)


@pytest.mark.parametrize("address", [5, [5], None, [DEAD, 2.0]])
def test_client_refuses_an_address_that_is_not_a_string(address):
    with pytest.raises(CisError, match=r"Client: address .* is a \w+; expected a node's address, a string"):
        cis.Client(address)
    with pytest.raises(CisError, match="Client: no address"):
        cis.Client([])


def test_serve_names_the_providers_and_an_unknown_option_before_any_node_starts(tmp_path):
    with pytest.raises(CisError, match="cis.serve: provider 'tpu'; expected one of cpu, cuda, tensorrt, auto"):
        cis.serve(tmp_path / "no-bundle", provider="tpu")
    with pytest.raises(TypeError, match=r"cis.serve\(\) got an unexpected keyword argument 'unknown_option'"):
        cis.serve(tmp_path / "no-bundle", unknown_option=1)
    with pytest.raises(TypeError, match="bogus"):
        cis.export(tmp_path / "no-run", bogus=1)


def test_serve_stops_the_nodes_it_started_when_a_later_one_cannot_be_built(bundle_dir):  # noqa: F811
    """Parents start first: a leaf the bundle has no threshold for fails after the cloud and the edges run; they
    stop, and the error is the leaf's one line."""
    from cis.core.bundle import load_bundle
    from cis.core.spec import parse_spec, spec_to_dict

    tables = spec_to_dict(load_bundle(bundle_dir).spec)
    for node in tables["nodes"]:
        node["id"] = "phone3" if node["id"] == "device3" else node["id"]
    spec = parse_spec(tables)
    with pytest.raises(CisError, match="'phone3'"):
        cis.serve(bundle_dir, spec)
    assert [t.name for t in threading.enumerate() if t.name.startswith("cis-")] == []
    with cis.serve(bundle_dir) as served:  # the same bundle serves: nothing was left holding a port
        answers = cis.infer(served, np.zeros((3, 6), np.float32), np.zeros(3, np.int64), timeout=10.0)
    assert answers.summary["samples_answered"] == 3


# ---------------------------------------------------------------- the top-level error line


def test_a_binary_file_where_text_was_expected_is_named(run_cli, tmp_path):
    from cis.core.spec import write_spec
    from cis.core.topologies import make_spec

    spec = tmp_path / "spec.toml"
    write_spec(make_spec("paper-7", "60-30-10"), spec)
    binary = tmp_path / "requests.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    res = run_cli("rates", spec, "--measured", binary)
    assert res.code == 2 and str(binary) in one_line(res.err)

    def read_csv(path):
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    for read in (lambda: Path(binary).read_text(), lambda: read_csv(str(binary))):
        with pytest.raises(UnicodeDecodeError) as caught:
            read()
        assert undecodable_file(caught.value) == str(binary)


def test_a_file_where_a_folder_goes_reads_a_file_expected_a_folder(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("x")
    with pytest.raises(FileExistsError) as exists:
        taken.mkdir(parents=True, exist_ok=True)
    assert os_error_line(exists.value) == f"{taken}: a file; expected a folder"
    with pytest.raises(NotADirectoryError) as inside:
        (taken / "run" / "x").mkdir(parents=True)
    assert os_error_line(inside.value) == f"{taken}: a file; expected a folder (for {taken / 'run' / 'x'})"
    with pytest.raises(FileNotFoundError) as missing:
        (tmp_path / "none").read_text()
    assert os_error_line(missing.value) == f"{tmp_path / 'none'}: No such file or directory"


def test_ctrl_c_while_the_commands_are_imported_is_interrupted_not_a_traceback(monkeypatch, capsys):
    import cis.cli.main as cli

    def interrupted() -> None:  # what a SIGINT during build_parser's imports raises
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["status"]) == 130
    assert capsys.readouterr().err == "cis: interrupted\n"
