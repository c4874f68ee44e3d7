"""Start every node of a spec as its own process on loopback and keep them up (``cis serve BUNDLE --all``).

Addresses come from the spec's ``address`` fields, or from free loopback ports
when a node has none (or when ``free_ports`` is set). Each node is a
``python -m cis.cli.main serve BUNDLE --node ID --bind ADDR --parent ADDR`` process;
a node with replicas is one such process per replica (``--node cloud#1``, its own
address, :mod:`cis.core.replicas`), and its children get every replica's address
(``--parent ADDR0,ADDR1,...``). Below, "node" is each such process, keyed by its replica id.

Supervision (:meth:`Cluster.supervise`, called every ~0.1 s by ``serve --all``):
a node that exits is reaped at once (no zombies) and started again at the same
address after a backoff of 0 s for the first restart, then 0.5, 1, 2, 4 ... up to
30 s; a node that stayed up for 30 s starts over at 0 s. The restarted node gets
``--restarts N``, so its ``status`` reply shows how often it was restarted. With
a log folder, each node's stdout and stderr go to ``LOG_DIR/ID.log`` (the
launcher adds a line for every exit and restart) and ``LOG_DIR/cluster.json``
holds every node's address, pid, state (up/down), restarts and last exit status
(``cis status --cluster LOG_DIR``). Nodes get SIGTERM if the launcher itself dies.
With a metrics port (``--metrics-port``) node i of the spec serves Prometheus metrics
on PORT+i, or on a free port of its own when PORT is 0 (:func:`plan_metrics`); a
restarted node keeps its port, and :attr:`Cluster.metrics` holds every node's URL.
After ``cis rollout --cluster LOG_DIR`` (``LOG_DIR/rollout.json``) a node is restarted with the new bundle.
:meth:`Cluster.stop` sends SIGTERM (drain, then exit) and SIGKILL after a grace period.
Nodes start with SIGINT blocked (:mod:`cis.runtime.child_signals`): a Ctrl-C stops them through the launcher.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cis.core import logs
from cis.core.bundle import load_bundle
from cis.core.errors import CisError
from cis.core.replicas import split_replica_id
from cis.core.spec import CisSpec, write_spec
from cis.runtime.addresses import check_port_run
from cis.runtime.child_signals import sigint_blocked
from cis.runtime.orphans import launcher_env
from cis.runtime.ports import free_port
from cis.runtime.security import CurveConfig

FIRST_BACKOFF = 0.5  # seconds before the second restart; the first is immediate
MAX_BACKOFF = 30.0
STABLE_AFTER = 30.0  # seconds up after which a node's backoff starts over
CLUSTER_FILE = "cluster.json"
ROLLOUT_FILE = "rollout.json"  # cis rollout --cluster LOG_DIR: {"bundle": the folder every node serves now, ...}
log = logging.getLogger(__name__)


def processes(spec: CisSpec) -> list[str]:
    """Every process a spec runs: each node's replica ids (:mod:`cis.core.replicas`), in spec order."""
    return [rid for n in spec.nodes for rid in n.replica_ids]


def plan_addresses(spec: CisSpec, free_ports: bool = False) -> dict[str, str]:
    """{replica id: address}: the spec's (replica i: port + i, or the node's addresses list), else free ports."""
    out = {}
    for n in spec.nodes:
        where = None if free_ports else n.replica_addresses
        for i, rid in enumerate(n.replica_ids):
            out[rid] = where[i] if where else f"tcp://127.0.0.1:{free_port()}"
    return out


def plan_metrics(
    spec: CisSpec, addresses: dict[str, str], port: int | None, host: str | None = None
) -> tuple[dict[str, int], dict[str, str]]:
    """({node: metrics port}, {node: metrics URL}): PORT+i for process i (:func:`processes`), or free ports
    for 0."""
    if port is None:
        return {}, {}
    from cis.runtime.metrics_http import http_host, metrics_url

    check_port_run(port, len(processes(spec)), "metrics port")
    ports, urls = {}, {}
    for i, rid in enumerate(processes(spec)):
        where = host or http_host(addresses[rid])
        ports[rid] = port + i if port else free_port("127.0.0.1" if where == "0.0.0.0" else where)
        urls[rid] = metrics_url(where, ports[rid])
    return ports, urls


def plan_doors(
    spec: CisSpec, ports: Mapping[str, int | None], host: str | None = None, tls: bool = False
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, str]]]:
    """Front doors ({door: {node: port}}, {door: {node: URL}}): PORT+i for process i (:func:`processes`), or
    free ports for 0; ``door`` is "http" (URL http(s)://HOST:PORT) or "grpc" (HOST:PORT, what gRPC clients
    take)."""
    from cis.runtime.oip.door import LOOPBACK, url

    where = host or LOOPBACK
    plan: dict[str, dict[str, int]] = {}
    urls: dict[str, dict[str, str]] = {}
    for door, port in ports.items():
        if port is None:
            continue
        check_port_run(port, len(processes(spec)), f"{door} port")
        plan[door] = {rid: port + i if port else free_port(where) for i, rid in enumerate(processes(spec))}
        scheme = ("https" if tls else "http") if door == "http" else "grpc"
        urls[door] = {nid: url(scheme, where, p).removeprefix("grpc://") for nid, p in plan[door].items()}
    return plan, urls


@dataclass
class Supervision:
    """What the launcher knows of one node beyond its process."""

    restarts: int = 0
    started: float = 0.0  # monotonic time of the last start
    backoff: float = 0.0  # seconds to wait before the next restart
    down_since: float | None = None
    restart_at: float | None = None
    last_exit: int | None = None


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
    supervision: dict[str, Supervision] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # --metrics-port of each node (none: no metrics)
    metrics: dict[str, str] = field(default_factory=dict)  # each node's metrics URL (ends in /metrics)
    door_ports: dict[str, dict[str, int]] = field(default_factory=dict)  # {"http"/"grpc": {node: port}}
    doors: dict[str, dict[str, str]] = field(default_factory=dict)  # {"http"/"grpc": {node: URL}}
    stopping: bool = False
    env: Mapping[str, str] | None = None  # the nodes' environment (None: the launcher's)
    node_prefix: dict[str, Sequence[str]] = field(default_factory=dict)  # a command before each node's (the testbed)
    written_bundle: str = ""  # the bundle cluster.json names (rewritten when cis rollout puts another on the nodes)
    temporary_spec: bool = False  # spec_file is launch's own temporary file (removed by stop)
    stop_asked: Callable[[], bool] | None = None  # True once the caller was asked to stop: wait_ready gives up

    def command(self, node_id: str) -> list[str]:
        node = self.spec.node(split_replica_id(node_id)[0])
        settings = logs.current()  # the nodes log as the launcher does
        cmd = [
            sys.executable,
            "-m",
            "cis.cli.main",
            "--log-level",
            settings.level,
            "--log-format",
            settings.format,
            "serve",
            self.serving(),
            "--node",
            node_id,
            "--bind",
            self.addresses[node_id],
        ]
        if node.parent is not None:  # every replica of the parent: the node spreads its forwards over them
            cmd += ["--parent", ",".join(self.addresses[r] for r in self.spec.node(node.parent).replica_ids)]
        if self.spec_file:
            cmd += ["--spec", str(self.spec_file)]
        restarts = self.supervision.get(node_id, Supervision()).restarts
        if restarts:
            cmd += ["--restarts", str(restarts)]
        if node_id in self.metrics_ports:
            cmd += ["--metrics-port", str(self.metrics_ports[node_id])]
        for door, ports in self.door_ports.items():
            cmd += [f"--{door}-port", str(ports[node_id])]
        cmd += list(self.extra_args) + list(self.node_args.get(node.id, ()))
        if node_id != node.id:
            cmd += list(self.node_args.get(node_id, ()))
        return [*self.node_prefix.get(node_id, ()), *cmd]

    def serving(self) -> str:
        """The bundle folder the nodes serve: the launcher's, or the one ``cis rollout`` put on them since."""
        if self.log_dir:
            try:
                return str(json.loads((Path(self.log_dir) / ROLLOUT_FILE).read_text())["bundle"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # none yet (or unreadable): the launcher's own
        return str(self.bundle)

    def log_path(self, node_id: str) -> Path | None:
        return Path(self.log_dir) / f"{node_id}.log" if self.log_dir else None

    def start(self, node_id: str) -> subprocess.Popen:
        old = self.procs.get(node_id)
        if old is not None and old.poll() is None:
            raise CisError(f"node {node_id!r} is already running (pid {old.pid})")
        log = self.log_path(node_id)
        out = None  # without a log folder a node writes to the launcher's own stdout/stderr
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = open(log, "ab")
        try:
            with sigint_blocked():  # the node takes no Ctrl-C: the launcher stops it (sigint_blocked)
                self.procs[node_id] = subprocess.Popen(
                    self.command(node_id),
                    stdin=subprocess.DEVNULL,
                    stdout=out if out else subprocess.DEVNULL,
                    stderr=out if out else None,
                    env=launcher_env(None if self.env is None else dict(self.env)),  # no preexec_fn: see orphans
                )
        finally:
            if out is not None:
                out.close()
        sup = self.supervision.setdefault(node_id, Supervision())
        sup.started, sup.down_since, sup.restart_at = time.monotonic(), None, None
        self.write_state()
        return self.procs[node_id]

    def start_all(self) -> None:
        if self.log_dir:  # an earlier launcher's rollout.json: this one serves the bundle it was given
            (Path(self.log_dir) / ROLLOUT_FILE).unlink(missing_ok=True)
        for rid in processes(self.spec):  # the root first: children find their parent sooner
            self.start(rid)

    def wait_ready(self, timeout: float = 60.0, ids: Sequence[str] | None = None) -> None:
        """Until every node answers a status request and sees its parent (every replica of it); KeyboardInterrupt
        as soon as :attr:`stop_asked` says so (a Ctrl-C or SIGTERM that the caller's handler caught)."""
        from cis.runtime.client import Client

        ids = list(ids or processes(self.spec))
        end = time.monotonic() + timeout
        for nid in ids:
            with Client(self.addresses[nid], curve=self.curve) as c:
                while True:
                    if self.stop_asked is not None and self.stop_asked():
                        raise KeyboardInterrupt("a stop was asked for while the nodes started")
                    proc = self.procs.get(nid)
                    if proc is not None and proc.poll() is not None:
                        raise CisError(
                            f"node {nid!r} exited with status {proc.returncode} while starting" + self._see_log(nid)
                        )
                    if time.monotonic() > end:
                        raise CisError(
                            f"node {nid!r} at {self.addresses[nid]}: not ready within {timeout:.0f} s"
                            + self._see_log(nid)
                        )
                    try:
                        st = c.status(timeout=0.5)
                    except TimeoutError:
                        continue
                    self._check_answered_by(nid, proc, st.get("pid"))
                    parents = st.get("parents") or []  # every replica of the parent, where it has several
                    if st.get("parent") is None or st.get("parent_up") and all(p["up"] for p in parents):
                        break
                    time.sleep(0.05)

    def _check_answered_by(self, nid: str, proc: subprocess.Popen | None, pid: object) -> None:
        """One line when another process than the node started answers at its address (a cluster already on these
        ports would pass for ready); a prefixed command (the testbed's) or a reply without a pid is not judged."""
        if proc is not None and not self.node_prefix.get(nid) and pid is not None and pid != proc.pid:
            raise CisError(f"node {nid!r} at {self.addresses[nid]}: process {pid} answers there, not the node started "
                           f"(pid {proc.pid}); expected a free address (another cluster serving on it?)")  # fmt: skip

    def _see_log(self, node_id: str) -> str:
        log = self.log_path(node_id)
        return f" (see {log})" if log is not None else ""

    def supervise(self, now: float | None = None) -> list[str]:
        """Reap nodes that exited and restart those whose backoff is over; returns what happened."""
        if self.stopping:
            return []
        if self.log_dir and str(Path(self.serving()).resolve()) != self.written_bundle:
            self.write_state()  # cis rollout put another bundle on the nodes: cluster.json says so at once
        now = time.monotonic() if now is None else now
        events: list[tuple[str, int, str, str, dict]] = []  # node, level, event, message, fields
        for nid, proc in list(self.procs.items()):
            sup = self.supervision.setdefault(nid, Supervision())
            code = proc.poll()  # reaps an exited child: no zombie
            if code is None:
                if now - sup.started >= STABLE_AFTER:
                    sup.backoff = 0.0
                continue
            if sup.down_since is None:
                sup.down_since, sup.last_exit = now, code
                sup.restart_at = now + sup.backoff
                events.append(
                    (
                        nid,
                        logging.WARNING,
                        "node_exit",
                        f"node {nid} exited with status {code}; restart {sup.restarts + 1} in {sup.backoff:.1f} s",
                        {"status": code, "restart": sup.restarts + 1, "backoff_s": sup.backoff},
                    )
                )
                sup.backoff = min(MAX_BACKOFF, max(FIRST_BACKOFF, 2 * sup.backoff))
                self.write_state()
            if sup.restart_at is not None and now >= sup.restart_at:
                sup.restarts += 1
                self.start(nid)
                pid = self.procs[nid].pid
                message = f"node {nid} restarted (pid {pid}, restart {sup.restarts})"
                events.append((nid, logging.INFO, "node_restart", message, {"node_pid": pid, "restart": sup.restarts}))
        for nid, level, name, message, fields in events:
            logs.event(log, level, name, message, node=nid, **fields)
            path = self.log_path(nid)
            if path is not None:  # beside the node's own lines
                logs.append(path, log.name, level, name, message, node=nid, **fields)
        return [message for _, _, _, message, _ in events]

    def state(self) -> dict:
        nodes = {}
        for rid in processes(self.spec):
            n = self.spec.node(split_replica_id(rid)[0])
            proc, sup = self.procs.get(rid), self.supervision.get(rid, Supervision())
            up = proc is not None and proc.returncode is None and sup.down_since is None
            nodes[rid] = {
                "address": self.addresses[rid],
                "node": n.id,
                "exit": n.exit,
                "parent": n.parent,
                "pid": proc.pid if proc else None,
                "state": "stopped" if self.stopping else ("up" if up else "down"),
                "restarts": sup.restarts,
                "last_exit": sup.last_exit,
                "log": str(self.log_path(rid)) if self.log_dir else None,
            }
        spec_file = str(Path(self.spec_file).resolve()) if self.spec_file else None  # cis.runtime.measure compares
        bundle = str(Path(self.serving()).resolve())
        return {"launcher_pid": os.getpid(), "spec": spec_file, "bundle": bundle, "nodes": nodes}

    def write_state(self) -> None:
        """LOG_DIR/cluster.json, replaced atomically."""
        if not self.log_dir:
            return
        path = Path(self.log_dir) / CLUSTER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = self.state()
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)
        self.written_bundle = state["bundle"]

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            if sig == signal.SIGKILL:
                proc.wait(10)

    def stop(self, grace: float = 15.0) -> dict[str, int | None]:
        self.stopping = True
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
        self.write_state()
        if self.temporary_spec and self.spec_file:
            Path(self.spec_file).unlink(missing_ok=True)
        return {nid: p.returncode for nid, p in self.procs.items()}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def spec_for_nodes(bundle: str | Path, spec: CisSpec, log_dir: str | None) -> str | None:
    """The spec file the nodes are started with when the caller gave none: None where ``spec`` is the bundle's own
    (a node reads that from the bundle), else ``spec`` written to LOG_DIR/spec.toml, or without a log folder to a
    temporary file (removed by :meth:`Cluster.stop`). Without it, the nodes would serve the bundle's spec."""
    if spec == load_bundle(bundle, verify=False).spec:
        return None
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        path = Path(log_dir) / "spec.toml"
    else:
        fd, name = tempfile.mkstemp(prefix="cis-spec-", suffix=".toml")
        os.close(fd)
        path = Path(name)
    write_spec(spec, path)
    return str(path)


def launch(
    bundle: str | Path,
    spec: CisSpec,
    spec_file: str | None = None,
    free_ports: bool = False,
    extra_args: Sequence[str] = (),
    node_args: Mapping[str, Sequence[str]] | None = None,
    ready_timeout: float = 60.0,
    log_dir: str | None = None,
    curve: CurveConfig | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    env: Mapping[str, str] | None = None,
    node_prefix: dict[str, Sequence[str]] | None = None,
    door_ports: Mapping[str, int | None] | None = None,
    door_host: str | None = None,
    door_tls: bool = False,
    stop_asked: Callable[[], bool] | None = None,
) -> Cluster:
    """Start all nodes and wait until they serve; on failure, stop what was started.

    ``metrics_port``: every node serves /metrics and /healthz (see :func:`plan_metrics`);
    ``metrics_host`` is passed on in ``extra_args`` by ``cis serve`` and only names the URLs here;
    ``node_prefix`` runs each node's command behind a prefix (``ip netns exec NS``: :mod:`cis.runtime.testbed`);
    ``door_ports`` the front doors' ports ({"http": PORT, "grpc": PORT}, see :func:`plan_doors`), ``door_host``
    and ``door_tls`` only name their URLs (``--http-host`` and the TLS flags go to the nodes in ``extra_args``);
    ``stop_asked``: once it returns True, stop the nodes started so far and raise KeyboardInterrupt."""
    given = spec_file
    spec_file = spec_file or spec_for_nodes(bundle, spec, log_dir)
    addresses = plan_addresses(spec, free_ports)
    ports, urls = plan_metrics(spec, addresses, metrics_port, metrics_host)
    door_plan, door_urls = plan_doors(spec, door_ports or {}, door_host, door_tls)
    cluster = Cluster(
        str(bundle),
        spec,
        addresses,
        spec_file,
        list(extra_args),
        dict(node_args or {}),
        log_dir=log_dir,
        curve=curve,
        metrics_ports=ports,
        metrics=urls,
        door_ports=door_plan,
        doors=door_urls,
        env=env,
        node_prefix=dict(node_prefix or {}),
        temporary_spec=given is None and log_dir is None and spec_file is not None,
        stop_asked=stop_asked,
    )
    try:
        cluster.start_all()
        cluster.wait_ready(ready_timeout)
    except BaseException:
        cluster.stop(grace=5.0)
        raise
    return cluster
