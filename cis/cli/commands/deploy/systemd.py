"""systemd units from a spec: one template, ``cis-node@.service``, and one environment file per node.

``systemctl enable --now cis-node@edge0`` starts ``cis serve BUNDLE`` with the variables of
``/etc/cis/edge0.env`` (``CIS_NODE``, ``CIS_SPEC``, ``CIS_BIND``, ``CIS_PARENT``, ``CIS_METRICS_PORT`` ...:
serve's own options, docs/runtime.md *Configuration*). docs/deploy.md, *systemd*, walks it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cis.cli.commands.deploy.plan import Endpoint, serve_env
from cis.core.errors import CisError
from cis.core.spec import CisSpec

UNIT = "cis-node@.service"
BUNDLE_VARIABLE = "BUNDLE"  # the unit's own variable (ExecStart's argument); cis serve reads no such variable
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./*{}\[\]-]*")  # values written without quotes
_UNIT_PATH = re.compile(r"/[A-Za-z0-9_@+=:,./-]*")  # an absolute path a unit file takes as it is: no quoting, no % or $
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*|[0-9]+")  # a user and group name, or a numeric id


@dataclass(frozen=True)
class UnitOptions:
    cis: str = "/opt/cis/bin/cis"  # the cis command on the machines (a virtualenv: docs/deploy.md)
    env_dir: str = "/etc/cis"  # where NODE.env and spec.toml go
    bundle_path: str = "/srv/cis/bundle"
    user: str = "cis"
    metrics_port: int = 9100  # node i of the spec gets PORT+i: nodes that share a machine do not collide
    sets: dict[str, str] = field(default_factory=dict)


def check_options(options: UnitOptions) -> None:
    """The paths and the user as the unit and the environment files need them, before anything is written: paths
    absolute (nothing on the machines is relative to where cis deploy ran); ``--cis`` and ``--env-dir``, which the
    unit names, without characters a unit file would split, unquote or expand (spaces, quotes, ``\\``, ``%``,
    ``$``); the user a plain name or a number."""
    for flag, path in (("--cis", options.cis), ("--env-dir", options.env_dir), ("--bundle-path", options.bundle_path)):
        if not path.startswith("/"):
            raise CisError(f"{flag} {path!r} is relative; expected an absolute path on the machines (a unit runs "
                           "from /)")
    for flag, path in (("--cis", options.cis), ("--env-dir", options.env_dir)):
        if not _UNIT_PATH.fullmatch(path):
            raise CisError(f"{flag} {path!r}: the unit file would split or expand it; expected a path of letters, "
                           "digits and _@+=:,./- only (no spaces, quotes, '\\', '%' or '$')")
    if not _USER.fullmatch(options.user):
        raise CisError(f"--user {options.user!r}; expected a user name (letters, digits, '_', '.', '-'; not "
                       "starting with a digit or '-') or a numeric id")


def unit_text(options: UnitOptions) -> str:
    """The template unit; ``%i`` is the node id."""
    return f"""\
# cis-node@.service: one node of a collaborative inference system (cis serve), written by cis deploy systemd.
# Install: docs/deploy.md, "systemd". The instance name is the node id: systemctl enable --now cis-node@edge0
[Unit]
Description=cis node %i (cis serve)
After=network-online.target
Wants=network-online.target
# never give up restarting (a node whose parent is down still serves, degraded)
StartLimitIntervalSec=0

[Service]
Type=exec
User={options.user}
Group={options.user}
# the node's options as CIS_* variables (cis serve reads them), and BUNDLE, the bundle's folder
EnvironmentFile={options.env_dir}/%i.env
ExecStart={options.cis} serve ${{{BUNDLE_VARIABLE}}}
# restart after a crash, a kill or an OOM, 2 s later; exit status 2 is a configuration error: not restarted
Restart=on-failure
RestartSec=2s
RestartPreventExitStatus=2
# SIGTERM: the node refuses new requests and drains for at most 10 s, then exits 0
KillSignal=SIGTERM
TimeoutStopSec=20s
LimitNOFILE=65536
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
# writable: /var/lib/cis (StateDirectory) and /var/log/cis (LogsDirectory), e.g. for --set spans_file=
StateDirectory=cis
LogsDirectory=cis

[Install]
WantedBy=multi-user.target
"""


def env_files(spec: CisSpec, ends: dict[str, Endpoint], options: UnitOptions) -> dict[str, str]:
    """{NODE.env: text} for every node: where it binds (its spec address, see :meth:`Endpoint.bind`), its
    parent's spec address, its metrics port, and the ``--set`` options."""
    out = {}
    spec_path = f"{options.env_dir}/spec.toml"
    for i, n in enumerate(spec.nodes):
        parent = None
        if n.parent is not None:
            up = ends[n.parent]
            if not up.connectable:
                raise CisError(
                    f"node {n.parent!r}: address {up} only binds; expected a host its children can reach (its child "
                    f"{n.id!r} connects there)"
                )
            parent = str(up)
        env = {
            BUNDLE_VARIABLE: options.bundle_path,
            **serve_env(n, ends[n.id].bind(), parent, spec_path, options.metrics_port + i, options.sets),
        }
        head = f"# cis-node@{n.id}: node {n.id} (exit {n.exit}) of spec {spec.name!r}; written by cis deploy systemd\n"
        out[f"{n.id}.env"] = head + "".join(f"{k}={_quote(v)}\n" for k, v in env.items())
    return out


def _quote(value: str) -> str:
    """A value as systemd's EnvironmentFile reads it: bare when safe, else double-quoted with escapes."""
    if _SAFE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def check_ids(spec: CisSpec) -> None:
    """Node ids become unit instance names and file names: letters, digits and ``_.-`` only."""
    for n in spec.nodes:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", n.id) or n.id.startswith("."):
            raise CisError(
                f"node {n.id!r}: not usable as a unit instance and file name; expected letters, digits, '_', '.' "
                "and '-'"
            )
