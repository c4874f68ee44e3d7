"""``cis infer`` and :class:`cis.Client` refuse numbers that cannot work in one line (issue 43: a mistake is one
line and exit 2): a ``--window`` of 0 waited forever, a ``--rate`` of 0 divided by zero, a ``--batch-size`` of 0
raised from ``range``, a negative rate sent as fast as it could. Checked before any data is read or sent."""

from __future__ import annotations

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.runtime.client import Client, check_pacing, infer_spread


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--rate", "0"), "--rate is 0; expected requests per second > 0"),
        (("--rate", "-5"), "--rate is -5; expected requests per second > 0"),
        (("--window", "0"), "--window is 0; expected requests in flight per node >= 1"),
        (("--batch-size", "0"), "--batch-size is 0; expected samples per request >= 1"),
        (("--n", "0"), "--n is 0; expected samples >= 1"),
        (("--timeout", "0"), "--timeout is 0; expected seconds > 0"),
    ],
)
def test_a_number_that_cannot_work_is_one_line(flags, said, run_cli, tmp_path):
    data = tmp_path / "x.npz"
    np.savez(data, x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4, np.int64))
    res = run_cli("infer", "--connect", "tcp://127.0.0.1:1", "--dataset", str(data), *flags)
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith(f"cis infer: error: {said}"), res.err


def test_the_client_refuses_them_before_sending():
    x = np.zeros((4, 1, 8, 8), np.float32)
    with Client("tcp://127.0.0.1:1", timeout=1) as c:
        for kwargs, said in (({"window": 0}, "window is 0"), ({"rate": 0.0}, "rate is 0.0"),
                             ({"batch_size": 0}, "batch size is 0"), ({"rate": -1.0}, "rate is -1.0")):
            with pytest.raises(CisError, match=said):
                c.infer_many(x, **kwargs)
        with pytest.raises(CisError, match="window is 0"):
            infer_spread({"d": c}, x, {"d": np.arange(4)}, window=0)
        for timeout in (0.0, -1.0, float("nan")):  # docs/runtime.md: refused as cis infer --timeout is
            with pytest.raises(CisError, match="timeout is"):
                c.infer_many(x, timeout=timeout)
            with pytest.raises(CisError, match="timeout is"):
                infer_spread({"d": c}, x, {"d": np.arange(4)}, timeout=timeout)
        assert c.in_flight == 0  # nothing was sent
    check_pacing(1, None)  # the defaults pass


def test_an_out_path_that_cannot_be_written_is_one_line_before_sending(run_cli, tmp_path):
    """Checked before anything is sent (tcp://127.0.0.1:1 is never reached): the run is not lost at its end."""
    data = tmp_path / "x.npz"
    np.savez(data, x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4, np.int64))
    (tmp_path / "afile").write_text("")
    res = run_cli("infer", "--connect", "tcp://127.0.0.1:1", "--dataset", str(data), "--timeout", "30",
                  "--out", tmp_path / "afile" / "rows.csv")
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith("cis infer: error: --out "), res.err
    res = run_cli("infer", "--connect", "tcp://127.0.0.1:1", "--dataset", str(data), "--out", tmp_path)
    assert res.code == 2 and "not a file this user can write" in res.err, res.err


@pytest.mark.parametrize("command", [("spec", "new", "--topology", "paper-7", "-o"), ("keys",)])
def test_a_path_under_a_file_is_one_line_not_a_traceback(command, run_cli, tmp_path):
    (tmp_path / "afile").write_text("")
    res = run_cli(*command, tmp_path / "afile" / "x")
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith(f"cis {command[0]}: error: {tmp_path / 'afile'}"), res.err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("status", "--connect", "127.0.0.1:5553"), "127.0.0.1:5553: not a ZeroMQ address"),
        (("status", "--connect", "tcp://127.0.0.1:1", "--timeout", "inf"), "--timeout: 'inf'; expected a finite"),
        (("rates", "--connect", "tcp://127.0.0.1:1", "--timeout", "-1"), "--timeout: '-1'; expected a finite"),
        (("spec", "new", "--serving", "nan-30-10"), "serving setting 'nan-30-10': expected non-negative percentages"),
        (("spec", "new", "--total-rate", "-1"), "--total-rate is -1.0; expected requests per second >= 0"),
        (("spec", "new", "--classes", "1"), "--classes is 1; expected at least 2 classes"),
        (("spec", "new", "-o", "/dev/full"), "No space left on device"),
    ],
)
def test_more_mistakes_are_one_line(argv, said, run_cli):
    """Found by a hunt for tracebacks and silent acceptance (session 19): each is one line, exit 2."""
    res = run_cli(*argv)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith(f"cis {argv[0]}: error: ") and said in line, res.err


def test_keys_are_never_replaced_and_a_binary_file_is_one_line(run_cli, tmp_path):
    assert run_cli("keys", tmp_path / "k").code == 0
    res = run_cli("keys", tmp_path / "k")
    assert res.code == 2 and f"{tmp_path / 'k' / 'node.key'} exists" in res.err, res.err
    assert run_cli("keys", tmp_path / "k", "--name", "../out").code == 2 and not (tmp_path / "out.key").exists()
    spec, garbage = tmp_path / "s.toml", tmp_path / "faults.txt"
    assert run_cli("spec", "new", "-o", spec).code == 0
    garbage.write_bytes(bytes(range(128, 256)) * 4)
    res = run_cli("simulate", "--spec", spec, "--requests", "5", "--faults", garbage)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and "not UTF-8 text" in line, res.err


def test_an_empty_npz_is_one_line(run_cli, tmp_path):
    (tmp_path / "empty.npz").write_bytes(b"")
    res = run_cli("infer", "--connect", "tcp://127.0.0.1:1", "--dataset", tmp_path / "empty.npz", "--timeout", "2")
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and "empty.npz: cannot read (No data left in file)" in line, res.err
