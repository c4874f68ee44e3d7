"""Start every node of a spec as its own process on loopback (``cis serve BUNDLE --all``).

Addresses come from the spec's ``address`` fields, or from free loopback ports
when a node has none (or when ``free_ports`` is set). Each node is a
``python -m cis.cli serve BUNDLE --node ID --bind ADDR --parent ADDR`` process;
:meth:`Cluster.stop` sends SIGTERM (drain, then exit) and SIGKILL after a grace period.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cis.errors import CisError
from cis.runtime.security import CurveConfig
from cis.spec import CisSpec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def plan_addresses(spec: CisSpec, free_ports: bool = False) -> dict[str, str]:
    return {n.id: (n.address if n.address and not free_ports else f"tcp://127.0.0.1:{free_port()}") for n in spec.nodes}


@dataclass
class Cluster:
    bundle: str
    spec: CisSpec
    addresses: dict[str, str]
    spec_file: str | None = None
    extra_args: Sequence[str] = ()
    node_args: dict[str, Sequence[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    log_dir: str | None = None
    curve: CurveConfig | None = None  # how the launcher's own probes reach nodes that run CurveZMQ

    def command(self, node_id: str) -> list[str]:
        node = self.spec.node(node_id)
        cmd = [sys.executable, "-m", "cis.cli", "serve", str(self.bundle), "--node", node_id, "--bind", self.addresses[node_id]]
        if node.parent is not None:
            cmd += ["--parent", self.addresses[node.parent]]
        if self.spec_file:
            cmd += ["--spec", str(self.spec_file)]
        return cmd + list(self.extra_args) + list(self.node_args.get(node_id, ()))

    def start(self, node_id: str) -> subprocess.Popen:
        old = self.procs.get(node_id)
        if old is not None and old.poll() is None:
            raise CisError(f"node {node_id!r} is already running (pid {old.pid})")
        err = subprocess.DEVNULL
        if self.log_dir:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            err = open(Path(self.log_dir) / f"{node_id}.log", "ab")
        self.procs[node_id] = subprocess.Popen(self.command(node_id), stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        if err is not subprocess.DEVNULL:
            err.close()
        return self.procs[node_id]

    def start_all(self) -> None:
        for node in self.spec.nodes:  # the root first: children find their parent sooner
            self.start(node.id)

    def wait_ready(self, timeout: float = 60.0, ids: Sequence[str] | None = None) -> None:
        """Until every node answers a status request and sees its parent."""
        from cis.runtime.client import Client

        ids = list(ids or self.spec.ids)
        end = time.monotonic() + timeout
        for nid in ids:
            with Client(self.addresses[nid], curve=self.curve) as c:
                while True:
                    proc = self.procs.get(nid)
                    if proc is not None and proc.poll() is not None:
                        raise CisError(f"node {nid!r} exited with status {proc.returncode} while starting")
                    if time.monotonic() > end:
                        raise CisError(f"node {nid!r} at {self.addresses[nid]}: not ready within {timeout:.0f} s")
                    try:
                        st = c.status(timeout=0.5)
                    except TimeoutError:
                        continue
                    if st.get("parent") is None or st.get("parent_up"):
                        break
                    time.sleep(0.05)

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            if sig == signal.SIGKILL:
                proc.wait(10)

    def stop(self, grace: float = 15.0) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return {nid: p.returncode for nid, p in self.procs.items()}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(
    bundle: str | Path,
    spec: CisSpec,
    spec_file: str | None = None,
    free_ports: bool = False,
    extra_args: Sequence[str] = (),
    node_args: dict[str, Sequence[str]] | None = None,
    ready_timeout: float = 60.0,
    log_dir: str | None = None,
    curve: CurveConfig | None = None,
) -> Cluster:
    """Start all nodes and wait until they serve; on failure, stop what was started."""
    cluster = Cluster(str(bundle), spec, plan_addresses(spec, free_ports), spec_file, list(extra_args), dict(node_args or {}), log_dir=log_dir, curve=curve)
    try:
        cluster.start_all()
        cluster.wait_ready(ready_timeout)
    except BaseException:
        cluster.stop(grace=5.0)
        raise
    return cluster
