"""cis train --engine flower on a SuperLink: --flower-superlink means deployment; a non-loopback SuperLink needs
TLS; a run on another host returns where its run dir is (no local summary.json required); a ServerApp error
in OUT/flower.log is the one error line."""

import json
import re

import pytest

pytest.importorskip("flwr")

from cis.core.errors import CisError  # noqa: E402
from cis.core.spec_file import tomllib  # noqa: E402  (tomli on Python 3.10)
from cis.runtime.ports import free_port  # noqa: E402
from cis.training.flower.deploy import (  # noqa: E402
    Submission,
    check_transport,
    flwr_error,
    is_loopback,
    server_error,
    write_connection,
)
from cis.training.flower.launch import COMPLETED, flower_mode, run_end, submitted_text  # noqa: E402

REMOTE = "superlink.example.org:9093"
# the end of a real OUT/flower.log of a ServerApp stopped by its connect timeout (a loopback run of flwr 1.42)
SERVERAPP_LOG = """\
  File "/work/main/cis/training/flower/strategy.py", line 97, in discover
    raise CisError(
cis.core.errors.CisError: flower: 1 SuperNodes connected after 5 s; the spec has 7 nodes (one SuperNode each)
2026-11-29T21:27:20.486Z ERROR flwr: ServerApp raised an exception
Traceback (most recent call last):
  File "/work/main/cis/training/flower/strategy.py", line 97, in discover
    raise CisError(
cis.core.errors.CisError: flower: 1 SuperNodes connected after 5 s; the spec has 7 nodes (one SuperNode each)
\x1b[91mERROR \x1b[0m:     Exit Code: 201

An unhandled exception occurred in the ServerApp.
2026-11-29T21:27:20.508Z DEBUG flwr: [flwr-serverapp] Will push ServerApp task output
\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `6619824921301637480`
"""
SAID = "flower: 1 SuperNodes connected after 5 s; the spec has 7 nodes (one SuperNode each)"


@pytest.fixture
def ca(tmp_path):
    path = tmp_path / "ca.crt"
    path.write_text("-----BEGIN CERTIFICATE-----\n")  # only its presence is checked before `flwr` reads it
    return path


def one_error_line(r) -> str:
    assert r.code == 2, (r.code, r.out, r.err)
    line = r.err.strip().splitlines()[-1]
    assert line.startswith("cis train: error: ") and r.out == ""
    return line


def test_the_mode_follows_the_superlink(ca):
    assert flower_mode(None, None, None) == "simulation"
    assert flower_mode(None, "127.0.0.1:9093", None) == "deployment"
    assert flower_mode(None, REMOTE, ca) == "deployment"
    assert flower_mode("deployment", None, None) == "deployment"  # the loopback federation
    with pytest.raises(CisError, match="--flower-mode simulation trains on this machine"):
        flower_mode("simulation", "127.0.0.1:9093", None)
    with pytest.raises(CisError, match="--flower-mode simulation trains on this machine"):
        flower_mode("simulation", None, ca)
    with pytest.raises(CisError, match="--flower-root-certificates goes with --flower-superlink"):
        flower_mode(None, None, ca)


def test_cli_superlink_alone_submits_a_deployment_run(tmp_path, run_cli):
    """No --flower-mode: the run goes to the SuperLink (here none listens: `flwr run` says so in one line),
    not into a local simulation."""
    out = tmp_path / "run"
    r = run_cli("train", "--engine", "flower", "--flower-superlink", f"127.0.0.1:{free_port()}", "--rounds", "1",
                "--out", out)  # fmt: skip
    line = one_error_line(r)
    assert "`flwr run` on 127.0.0.1:" in line and "Connection to the SuperLink is unavailable" in line, line
    assert "│" not in line and not (out / "summary.json").exists()


def test_cli_simulation_with_a_superlink_is_refused(tmp_path, run_cli):
    r = run_cli("train", "--engine", "flower", "--flower-mode", "simulation", "--flower-superlink", REMOTE,
                "--rounds", "1", "--out", tmp_path / "run")  # fmt: skip
    assert "--flower-mode simulation trains on this machine" in one_error_line(r)
    assert not (tmp_path / "run").exists()
    r = run_cli("train", "--flower-superlink", REMOTE, "--flower-mode", "deployment", "--rounds", "1",
                "--out", tmp_path / "run")  # fmt: skip
    said = "--flower-mode, --flower-superlink goes with --engine flower (this run uses the built-in engine)"
    assert one_error_line(r).endswith(said) and not (tmp_path / "run").exists()


def test_cli_remote_superlink_without_certificates_is_refused(tmp_path, run_cli):
    r = run_cli("train", "--engine", "flower", "--flower-superlink", REMOTE, "--rounds", "1", "--out", tmp_path / "r")
    line = one_error_line(r)
    assert f"--flower-superlink {REMOTE}: not a loopback address; give --flower-root-certificates" in line


def test_tls_unless_loopback(tmp_path, ca):
    for address in ("127.0.0.1:9093", "127.0.0.2:1", "localhost:9093", "[::1]:9093"):
        assert is_loopback(address), address
    for address in (REMOTE, "10.0.0.1:9093", "[2001:db8::1]:9093"):
        assert not is_loopback(address), address
    with pytest.raises(CisError, match="expected HOST:PORT"):
        is_loopback("superlink.example.org")
    with pytest.raises(CisError, match="not a loopback address"):
        write_connection(tmp_path / "a", "cis", "10.0.0.1:9093")
    assert not (tmp_path / "a" / "config.toml").exists()
    with pytest.raises(CisError, match="nope.crt: file not found"):
        check_transport(REMOTE, tmp_path / "nope.crt")
    write_connection(tmp_path / "b", "cis", "127.0.0.1:9093")
    write_connection(tmp_path / "c", "cis", REMOTE, ca)
    b, c = (tomllib.loads((tmp_path / d / "config.toml").read_text())["superlink"]["cis"] for d in "bc")
    assert b == {"address": "127.0.0.1:9093", "insecure": True}
    assert c == {"address": REMOTE, "root-certificates": str(ca.resolve())}


def test_missing_summary_quotes_the_serverapp_error_from_flower_log(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "flower.log").write_text(SERVERAPP_LOG)
    with pytest.raises(CisError) as err:
        run_end(out, Submission("127.0.0.1:9093", 7, SERVERAPP_LOG))
    msg = str(err.value)
    assert msg.startswith(SAID + " (") and "\n" not in msg
    assert f"without writing {out / 'summary.json'}" in msg and f"the ServerApp's log: {out / 'flower.log'}" in msg
    (out / "flower.log").write_text("INFO : nothing went wrong here\n")
    with pytest.raises(CisError, match=r"^flower: the run ended without writing .*; the ServerApp's log: .*\.log$"):
        run_end(out, Submission("127.0.0.1:9093", 7, ""))


def test_server_error_lines():
    assert server_error(SERVERAPP_LOG) == SAID
    assert server_error("Traceback (most recent call last):\nKeyError: 'rounds'\nINFO : done\n") == "KeyError: 'rounds'"
    assert server_error("INFO : round 1/2\n") is None
    boxed = "Using SuperLink: cis\n╭─ Error ─╮\n│ Connection to the SuperLink is    │\n│ unavailable.   │\n╰──╯\n"
    assert flwr_error(boxed) == "Connection to the SuperLink is unavailable."


def test_a_run_on_another_host_returns_where_its_run_dir_is(tmp_path):
    out = tmp_path / "srv" / "runs" / "fl"  # a path on the SuperLink's host: nothing of it here
    result = run_end(out, Submission(REMOTE, 42, "INFO : round 1/1\n", COMPLETED))
    assert result == {"engine": "flower", "mode": "deployment", "superlink": REMOTE, "run_id": 42, "status": COMPLETED,
                      "out": str(out.resolve()), "run_dir_host": "the SuperLink's host"}  # fmt: skip
    assert json.loads(json.dumps(result)) == result and not (tmp_path / "srv").exists()
    text = submitted_text(result)
    assert text.startswith(f"flower: run 42 finished on SuperLink {REMOTE}\n")
    assert f"its run dir is {out.resolve()} on the SuperLink's host" in text
    # the SuperLink says it failed: its ServerApp's error, streamed back, is the one line
    with pytest.raises(CisError, match=rf"^{re.escape(SAID)} \(run 42 on {REMOTE} ended finished:failed;"):
        run_end(out, Submission(REMOTE, 42, SERVERAPP_LOG, "finished:failed"))
    with pytest.raises(CisError, match=r"^ServerApp failed with exception: boom \(run 42"):
        run_end(out, Submission(REMOTE, 42, "", "finished:failed", "ServerApp failed with exception: boom"))
    # no status from the SuperLink: an error in the streamed log still fails it; without one, status unknown
    with pytest.raises(CisError, match=rf"^{re.escape(SAID)} \(run 42 on {REMOTE} ended with an error;"):
        run_end(out, Submission(REMOTE, 42, SERVERAPP_LOG))
    assert run_end(out, Submission(REMOTE, 42, "INFO : ok\n"))["status"] == "unknown"
    # a shared disk: the summary is readable here, so it is the result
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"engine": "flower", "cis_accuracy": 0.9}))
    assert run_end(out, Submission(REMOTE, 42, "", COMPLETED))["cis_accuracy"] == 0.9
