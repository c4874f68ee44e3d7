"""Flower's deployment engine: submit a run to a SuperLink; start a whole federation on loopback.

:class:`LoopbackFederation` starts ``flower-superlink`` and one ``flower-supernode``
per CIS node (``--node-config partition-id=K``) as subprocesses bound to
127.0.0.1 on free ports, with ``--insecure`` (loopback only; docs/flower.md shows
TLS and node authentication for real deployments), and always stops them
(process groups, SIGTERM then SIGKILL). :func:`submit_run` is ``flwr run`` of
cis/training/flower/app with the run config (``cis-config``, ``out-dir``) in a TOML
file and a private FLWR_HOME naming the SuperLink connection: TLS with the given CA
certificate; insecure only for a loopback address (:func:`check_transport`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from cis.core.errors import CisError
from cis.runtime.ports import free_port
from cis.training.config import RunConfig

APP_DIR = Path(__file__).resolve().parent / "app"
BIN = Path(sys.executable).parent


def _env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # flower-superexec, flwr-serverapp, flwr-clientapp
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def address_host(address: str) -> str:
    """The host of a SuperLink address ``HOST:PORT`` (``[::1]:PORT`` for IPv6); one line when it is not one."""
    host, sep, port = address.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit():
        raise CisError(f"--flower-superlink {address!r}: expected HOST:PORT, e.g. superlink.example.org:9093")
    return host


def is_loopback(address: str) -> bool:
    """Whether SuperLink ``address`` (HOST:PORT) is on this machine's loopback (localhost, 127.0.0.0/8, ::1)."""
    host = address_host(address)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def check_transport(address: str, root_certificates: str | Path | None) -> None:
    """TLS with ``root_certificates`` (a file), or insecure to a loopback ``address`` only: else one line."""
    if root_certificates is not None:
        if not Path(root_certificates).expanduser().is_file():
            raise CisError(
                f"--flower-root-certificates {root_certificates}: file not found; expected the CA certificate "
                "(PEM) that signed the SuperLink's certificate"
            )
    elif not is_loopback(address):
        raise CisError(
            f"--flower-superlink {address}: not a loopback address; give --flower-root-certificates CA.crt "
            "(TLS to the SuperLink; an insecure connection is for 127.0.0.1 / localhost only)"
        )


def write_connection(flwr_home: Path, name: str, address: str, root_certificates: str | Path | None = None) -> None:
    """FLWR_HOME/config.toml naming one SuperLink connection (the `flwr` CLI's config): TLS with
    ``root_certificates``, else insecure, which :func:`check_transport` allows on loopback only."""
    check_transport(address, root_certificates)
    flwr_home.mkdir(parents=True, exist_ok=True)
    conn: dict = {"address": address}
    if root_certificates is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(Path(root_certificates).expanduser().resolve())
    (flwr_home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}))


def write_run_config(
    path: Path, config: RunConfig, out: str | Path, round_timeout: float, connect_timeout: float
) -> Path:
    from cis.training.flower.records import config_to_text

    values = {"cis-config": config_to_text(config), "out-dir": str(Path(out).resolve()),
              "round-timeout": float(round_timeout), "connect-timeout": float(connect_timeout)}
    path.write_text(tomli_w.dumps(values))
    return path


@dataclass
class Submission:
    """A run ``flwr run`` submitted and streamed to its end: its id, what `flwr run` printed (the ServerApp's
    log) and, where asked for (``status=True``), the SuperLink's final status of it (``flwr ls``)."""

    superlink: str
    run_id: int | None
    output: str
    status: str | None = None  # e.g. "finished:completed", "finished:failed"; None: not asked or not known
    details: str = ""  # the SuperLink's status details, e.g. "ServerApp failed with exception: flower: ..."


def submit_run(
    config: RunConfig,
    out: str | Path,
    superlink: str,
    *,
    root_certificates: str | Path | None = None,
    round_timeout: float = 600.0,
    connect_timeout: float = 120.0,
    flwr_home: str | Path | None = None,
    timeout: float | None = None,
    write_log: bool = True,
    status: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> Submission:
    """``flwr run cis/training/flower/app`` on ``superlink`` (its Control API address), waiting for the end.

    ``write_log``: `flwr run`'s output (the ServerApp's streamed log) into OUT/flower.log, where OUT is on
    this machine; ``status``: ask the SuperLink for the run's final status afterwards."""
    with tempfile.TemporaryDirectory(prefix="cis-flwr-") as tmp:
        home = Path(flwr_home) if flwr_home else Path(tmp) / "home"
        write_connection(home, "cis", superlink, root_certificates)
        run_toml = write_run_config(Path(tmp) / "run.toml", config, out, round_timeout, connect_timeout)
        cmd = [str(BIN / "flwr"), "run", str(APP_DIR), "cis", "--run-config", str(run_toml), "--stream"]
        log("flower: " + " ".join(cmd[:4]) + " cis --stream")
        try:
            proc = subprocess.run(cmd, env=_env(home), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CisError(f"flower: `flwr run` did not finish in {timeout:.0f} s") from None
        output = proc.stdout + proc.stderr
        if proc.returncode != 0 or "Successfully started run" not in proc.stdout:
            raise CisError(f"flower: `flwr run` on {superlink} failed (exit {proc.returncode}): {flwr_error(output)}")
        if write_log:
            (Path(out) / "flower.log").parent.mkdir(parents=True, exist_ok=True)
            (Path(out) / "flower.log").write_text(output)
        found = re.search(r"Successfully started run (\d+)", proc.stdout)
        sub = Submission(superlink, int(found.group(1)) if found else None, output)
        if status and sub.run_id is not None:
            sub.status, sub.details = run_status(home, sub.run_id)
        return sub


def run_status(flwr_home: Path, run_id: int) -> tuple[str | None, str]:
    """The SuperLink's status of run ``run_id`` and its details (``flwr ls --run-id``); (None, why) when it
    cannot be read."""
    cmd = [str(BIN / "flwr"), "ls", "cis", "--run-id", str(run_id), "--format", "json"]
    try:
        proc = subprocess.run(cmd, env=_env(flwr_home), capture_output=True, text=True, timeout=120)
        runs = json.loads(proc.stdout).get("runs") or [{}]
    except (subprocess.TimeoutExpired, ValueError, AttributeError):
        return None, "`flwr ls` gave no status"
    return runs[0].get("status"), str(runs[0].get("status-details") or "")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b[^:]*: ")


def server_error(text: str) -> str | None:
    """The ServerApp's error in its log ``text``: its last CisError line (from ``flower:`` on), else the last
    exception line of a traceback; None when there is neither."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    said = [line[line.index("flower: "):] for line in lines if "CisError: flower: " in line]
    said = said or [line[line.index("flower: "):] for line in lines if line.startswith("flower: ")]
    if said:
        return said[-1]
    raised = [line for line in lines if _EXCEPTION.match(line)]
    return raised[-1] if raised else None


def flwr_error(text: str) -> str:
    """`flwr` CLI's error as one line: the text of its "Error" box, else its last non-empty line."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    boxed = [line.strip("│ ") for line in lines if line.startswith("│")]
    if boxed:
        return " ".join(part for part in boxed if part)
    said = [line.strip() for line in lines if line.strip()]
    return said[-1][-500:] if said else "no output"


class LoopbackFederation:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (insecure), stopped on exit."""

    def __init__(self, num_nodes: int, workdir: str | Path | None = None, start_timeout: float = 60.0,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.num_nodes, self.start_timeout, self.log = num_nodes, start_timeout, log
        self._tmp = None
        if not workdir:
            self._tmp = tempfile.TemporaryDirectory(prefix="cis-flower-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.home = self.workdir / "flwr-home"
        self.procs: list[subprocess.Popen] = []
        self.address = ""
        self.start_seconds = 0.0

    def _spawn(self, name: str, cmd: list[str], home: Path) -> subprocess.Popen:
        logf = open(self.workdir / f"{name}.log", "w")
        p = subprocess.Popen(cmd, env=_env(home), stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=self.workdir, start_new_session=True)  # own process group: killed with its children
        logf.close()
        self.procs.append(p)
        return p

    def _supernode(self, k: int) -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = self._spawn(f"supernode-{k}", [
            str(BIN / "flower-supernode"), "--insecure", "--superlink", self.address,
            "--host", "127.0.0.1", "--port", str(port),
            "--node-config", f"partition-id={k} num-partitions={self.num_nodes}",
        ], self.workdir / f"node-{k}")
        return proc, port

    def _wait_listening(self, port: int, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise CisError(f"flower: {what} exited ({proc.returncode}); see {self.workdir}/*.log")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise CisError(f"flower: {what} not listening on 127.0.0.1:{port} after {self.start_timeout:.0f} s")

    def start(self) -> LoopbackFederation:
        t0 = time.perf_counter()
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        sl = self._spawn(
            "superlink",
            [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port)],
            self.home,
        )
        self._wait_listening(port, sl, "flower-superlink")
        nodes = [self._supernode(k) for k in range(self.num_nodes)]
        for k, (proc, node_port) in enumerate(nodes):  # one that could not start says so here, not as a hung run
            self._wait_listening(node_port, proc, f"flower-supernode {k}")
        self.start_seconds = time.perf_counter() - t0
        self.log(f"flower: SuperLink on {self.address}, {self.num_nodes} SuperNodes ({self.workdir})")
        return self

    def run(self, config: RunConfig, out: str | Path, round_timeout: float = 600.0, connect_timeout: float = 120.0,
            timeout: float | None = None) -> Submission:
        return submit_run(config, out, self.address, round_timeout=round_timeout, connect_timeout=connect_timeout,
                          flwr_home=self.workdir / "cli-home", timeout=timeout, log=self.log)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group too: flower-superexec and flwr-*app children
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait(timeout=5)
        self.procs = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LoopbackFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
