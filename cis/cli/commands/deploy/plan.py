"""What every deployment target shares: each node's endpoint, the address it binds, its parent's, and the
``cis serve`` options it runs with, as the ``CIS_*`` variables of serve's own table
(:mod:`cis.cli.commands.serve_config`), so a container or a unit starts ``cis serve BUNDLE`` and nothing more.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cis.cli.commands import serve_config
from cis.core import logs
from cis.core.bundle import Bundle
from cis.core.errors import CisError
from cis.core.spec import CisSpec, Node

DEFAULT_METRICS_PORT = 9100
# set by cis deploy itself (from the spec and its own flags), so --set may not name them; free_ports and log_dir
# belong to serve --all, which a deployment does not run
DEPLOY_SETS = ("node", "spec", "bind", "parent", "metrics_port", "free_ports", "log_dir")
SERVE_ALL_ONLY = ("free_ports", "log_dir")  # launcher settings: a deployed node is one process


@dataclass(frozen=True)
class Endpoint:
    """A node's ZeroMQ address in the spec, taken apart: ``tcp://HOST:PORT``."""

    host: str
    port: int

    @property
    def connectable(self) -> bool:
        """Whether children can connect to it (``*``, ``0.0.0.0`` and ``[::]``, any unspecified address, only bind)."""
        host = self.host.strip("[]")
        if host in ("*", ""):
            return False
        try:
            return not ipaddress.ip_address(host).is_unspecified
        except ValueError:  # a host name
            return True

    def bind(self) -> str:
        """The address the node binds where it runs: the spec's when its host is an IP address or ``*``; a
        host name (which ZeroMQ cannot bind) gives every interface, ``tcp://*:PORT``."""
        host = self.host.strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"tcp://*:{self.port}" if host != "localhost" else f"tcp://127.0.0.1:{self.port}"
        return f"tcp://{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def endpoints(spec: CisSpec, source: str) -> dict[str, Endpoint]:
    """Every node's endpoint: its ``address``, or the first of its ``addresses`` (each node is deployed as one
    process or one Service: the platform makes its replicas); a node without either, or with one that is not
    ``tcp://HOST:PORT``, is one line."""
    out = {}
    for n in spec.nodes:
        where = f"{source}: node {n.id!r}"
        address = n.address or (n.addresses[0] if n.addresses else None)
        if address is None:
            raise CisError(
                f"{where} has no address; expected every node's address = \"tcp://HOST:PORT\" in the spec "
                "(the port it serves on, and where its children find it)"
            )
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if not address.startswith("tcp://") or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CisError(f"{where}: address {address!r}; expected tcp://HOST:PORT (a deployment serves over TCP)")
        out[n.id] = Endpoint(host, int(port))
    return out


def check_bundle(spec: CisSpec, bundle: Bundle, source: str) -> None:
    """The bundle serves this spec: as many exits, and stages for every node (what ``cis serve`` would refuse)."""
    if bundle.num_exits != spec.num_exits:
        raise CisError(
            f"bundle {bundle.root}: {bundle.num_exits} stages; expected {spec.num_exits} (the exits of {source})"
        )
    held = bundle.manifest.get("nodes", {})
    for n in spec.nodes:
        if n.id not in held:
            raise CisError(
                f"{source}: node {n.id!r} is not in bundle {bundle.root} (it has {', '.join(held)}); export the "
                "bundle for this spec (cis export --spec)"
            )
        exit_ = held[n.id].get("exit") or max(held[n.id]["stages"], default=0)  # a manifest's nodes: manifest_checks
        if exit_ != n.exit:
            raise CisError(
                f"{source}: node {n.id!r} has exit {n.exit}; bundle {bundle.root} holds stages for exit {exit_} there"
            )


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` items: serve options every node runs with, checked as their variables would be."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq:
            raise CisError(f"--set {item!r}; expected NAME=VALUE with one of serve's options, e.g. max_batch=16")
        option, value = serve_config.option_text(name, text, f"--set {item!r}")
        if option.name in DEPLOY_SETS:
            launcher = option.name in SERVE_ALL_ONLY
            why = "belongs to cis serve --all" if launcher else "is set by cis deploy from the spec and its flags"
            raise CisError(f"--set {item!r}: {option.name} {why}")
        out[option.name] = value
    return out


def serve_env(
    node: Node, bind: str, parent: str | None, spec_path: str, metrics_port: int, sets: Mapping[str, str]
) -> dict[str, str]:
    """The ``CIS_*`` variables ``cis serve BUNDLE`` runs one node with: the node, the spec, its addresses, its
    metrics port (served on the host of ``bind``: every interface for ``tcp://*``), then the ``--set`` options."""
    options = {
        "node": node.id,
        "spec": spec_path,
        "bind": bind,
        **({} if parent is None else {"parent": parent}),
        "metrics_port": str(metrics_port),
        **sets,
    }
    return {serve_config.BY_NAME[name].env: value for name, value in options.items()}


def log_env(log_format: str) -> dict[str, str]:
    """The log variable every node gets (``CIS_LOG_FORMAT``: cis.core.logs)."""
    return {logs.ENV_FORMAT: log_format}
