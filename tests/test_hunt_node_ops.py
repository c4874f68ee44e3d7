"""Operating one node (docs/runtime.md): what a hunt of its operator's view found.

- --rcv-hwm / --rcv-buf / --max-message-bytes past ZeroMQ's limits (C int, int64): one line, status 2, before
  anything starts (not an OverflowError once the stages have loaded);
- a front door on every interface without TLS or a token logs ``door_open``;
- a failed SIGHUP reload is one ``bundle_load_failed`` with its path;
- ``--bind tcp://HOST:0``: ``node_start`` and the status reply say the port bound;
- ``cis status`` takes --curve-key and --server-key; its text says ``-`` for no last exit;
- the --bind range says 0 is accepted; CIS_LOG_DIR / --free-ports with --node are refused naming their source;
- the config file's unknown-key line lists log_level and log_format.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import time

import pytest
from cli_process import read_until, start, stop

from cis.cli.commands import status as status_cmd
from cis.core.errors import CisError
from cis.runtime.node_config import NodeConfig


def _one_line(r, *wanted: str) -> str:
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1, r
    for w in wanted:
        assert w in r.err, r.err
    return r.err


@pytest.mark.parametrize(
    ("flag", "value", "bound"),
    [
        ("--rcv-hwm", "2147483648", "at most 2147483647"),
        ("--rcv-buf", "99999999999999", "at most 2147483647"),
        ("--max-message-bytes", "99999999999999999999", "at most 9223372036854775807"),
    ],
)
def test_socket_sizes_past_zeromqs_limits_are_one_line(run_cli, flag, value, bound):
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud", flag, value), f"argument {flag}", bound)


def test_socket_sizes_from_a_variable_or_the_file_and_the_python_api(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_RCV_HWM", str(2**31))
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud"), "CIS_RCV_HWM is", "at most 2147483647")
    monkeypatch.delenv("CIS_RCV_HWM")
    conf = tmp_path / "serve.toml"
    conf.write_text(f'node = "cloud"\nmax_message_bytes = {2**63 - 1}\nrcv_buf = {2**31}\n')
    _one_line(run_cli("serve", "no-such-bundle", "--config", conf), f"{conf}: rcv_buf is", "at most 2147483647")
    assert NodeConfig(node_id="x", exit=1, rcv_hwm=2**31 - 1, rcv_buf=2**31 - 1, max_message_bytes=2**63 - 1)
    with pytest.raises(CisError, match="rcv_hwm is 2147483648"):
        NodeConfig(node_id="x", exit=1, rcv_hwm=2**31)


def test_the_bind_range_says_port_0_is_accepted(run_cli):
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud", "--bind", "tcp://127.0.0.1:70000"),
              "PORT 1 to 65535, or 0 (a free one)")  # fmt: skip


def test_with_all_only_options_are_refused_naming_their_source(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_LOG_DIR", str(tmp_path / "logs"))
    err = _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud"), "CIS_LOG_DIR goes with --all")
    assert "--log-dir" not in err
    monkeypatch.delenv("CIS_LOG_DIR")
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud", "--log-dir", tmp_path), "--log-dir goes with --all")
    conf = tmp_path / "serve.toml"
    conf.write_text('node = "cloud"\nlog_dir = "logs"\n')
    _one_line(run_cli("serve", "no-such-bundle", "--config", conf), f"{conf}: log_dir goes with --all")
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud", "--free-ports"), "--free-ports goes with --all")
    monkeypatch.setenv("CIS_FREE_PORTS", "1")
    _one_line(run_cli("serve", "no-such-bundle", "--node", "cloud"), "CIS_FREE_PORTS goes with --all")


def test_the_unknown_key_line_lists_the_log_keys(run_cli, tmp_path):
    conf = tmp_path / "serve.toml"
    conf.write_text('node = "cloud"\nno_such_key = 1\n')
    err = _one_line(run_cli("serve", "no-such-bundle", "--config", conf), "unknown key 'no_such_key'")
    assert err.rstrip().endswith("log_dir, log_level, log_format"), err


def test_status_text_says_dash_for_no_last_exit():
    row = {"live": False, "address": "tcp://127.0.0.1:1",
           "launcher": {"state": "up", "pid": 7, "restarts": 0, "last_exit": None, "log": None}}  # fmt: skip
    text = status_cmd._table({"cloud": row})
    assert "last exit -" in text and "None" not in text
    row["launcher"]["last_exit"] = -9
    assert "last exit -9" in status_cmd._table({"cloud": row})


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("node-ops"), steps=20)


def _read_keeping(proc, wanted: str, timeout: float = 60) -> list[str]:
    """Every complete stderr line until one contains ``wanted``, and those after it in the same read."""
    text, end = "", time.monotonic() + timeout
    while wanted not in text and time.monotonic() < end and proc.poll() is None:
        if select.select([proc.stderr.fileno()], [], [], 0.2)[0]:
            text += os.read(proc.stderr.fileno(), 65536).decode()
    assert wanted in text, text[-3000:]
    return text.splitlines()


def _events(lines: list[str], name: str) -> list[dict]:
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == name:
            out.append(rec)
    return out


def test_one_node_bound_to_port_0_with_curve_an_open_door_and_a_failed_reload(demo_bundle, run_cli, tmp_path):
    assert run_cli("keys", tmp_path / "k").code == 0
    folder = tmp_path / "served"
    shutil.copytree(demo_bundle, folder)
    proc = start("serve", folder, "--node", "cloud", "--bind", "tcp://127.0.0.1:0", "--http-port", "0",
                 "--http-host", "0.0.0.0", "--curve-key", tmp_path / "k" / "node.key_secret",
                 "--log-format", "json")  # fmt: skip
    lines: list[str] = []
    try:
        lines += read_until(proc.stderr, proc, '"node_start"')
        (started,) = _events(lines, "node_start")
        address = started["address"]
        assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0"), started
        (door,) = _events(lines, "door_open")  # every interface, no TLS, no token
        assert door["level"] == "WARNING" and door["host"] == "0.0.0.0", door
        keys = ("--curve-key", tmp_path / "k" / "node.key_secret", "--server-key", tmp_path / "k" / "node.key")
        r = run_cli("status", *keys, "--connect", address, "--json", "--timeout", "5")
        assert r.code == 0, r
        st = json.loads(r.out)["nodes"][address]
        assert st["live"] and st["address"] == address and st["parent_up"] is False  # the root: no parent
        stage = sorted((folder / "stages").glob("*.onnx"))[-1]
        stage.write_bytes(stage.read_bytes() + b"x")  # no longer the manifest's sha256
        proc.send_signal(signal.SIGHUP)
        lines += _read_keeping(proc, '"bundle_load_failed"')
        assert run_cli("status", *keys, "--connect", address, "--timeout", "5").code == 0  # the load is over
    finally:
        code = stop(proc)
        lines += proc.stderr.read().splitlines()
    assert code == 0
    (failed,) = _events(lines, "bundle_load_failed")
    assert failed["path"] == str(folder) and failed["why"], failed
