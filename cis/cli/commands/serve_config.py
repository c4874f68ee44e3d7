"""``cis serve``'s options, declared once: their flags, ``CIS_*`` environment variables and ``--config`` keys.

Every option in :data:`OPTIONS` is a flag (``--max-batch``), an environment variable
(``CIS_MAX_BATCH``) and a key of the TOML file given to ``--config`` (``max_batch = 64``); a
value comes from the flag, else the variable, else the file, else the default. A node option's
default is :class:`cis.runtime.node_config.NodeConfig`'s, read from there. An empty variable counts as
unset; paths in the file are relative to the file's folder. A bad key or value stops the command
with one line naming the file (or variable), the key and what was expected. See docs/runtime.md,
*Configuration*.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cis.cli.commands.serve_rules import expected
from cis.core import logs
from cis.core.errors import CisError
from cis.core.spec import PROVIDERS
from cis.runtime.node_config import NONFINITE_MODES, STAGE_THREADS, NodeConfig, node_default

ENV_PREFIX = "CIS_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
EXPECTED = {"int": "an integer", "float": "a number", "str": "a string", "path": "a path", "bool": "true or false"}


@dataclass(frozen=True)
class Option:
    name: str  # the file's key; the flag is --name with dashes, the variable CIS_NAME
    kind: str  # int, float, str, path or bool
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    node: bool = False  # passed on to every node by --all
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("node", "str", "the node id of the spec to serve, or a replica's id (cloud#1) of a node with replicas; or "
                          "--all"),
    Option("spec", "path", "spec file (default: the spec inside the bundle)"),
    Option("bind", "str", "address to bind (default: the node's address in the spec)"),
    Option("parent", "str", "parent's address, or its replicas' addresses separated by commas (default: the "
                            "parent's addresses in the spec)"),
    Option("free_ports", "bool", "with --all: ignore the spec's addresses and pick free loopback ports", False),
    Option("threshold", "float", "override the bundle policy's threshold (with --all: every non-root node)"),
    Option("cap", "bool", "enforce max_transfer_rate (--no-cap: forward whatever the policy says)", True, node=True),
    Option("max_batch", "int", "samples per micro-batch", node_default("max_batch"), node=True),
    Option(
        "max_wait",
        "float",
        "seconds a request may wait for a fuller batch (0: run when idle)",
        node_default("max_wait"),
        node=True,
    ),  # fmt: skip
    Option(
        "queue_limit",
        "int",
        "samples that may wait; beyond, 'overloaded'; a bigger request gets 'too_many_samples' "
        f"(default: the spec's queue_limit, else {node_default('queue_limit')})",
        node=True,
    ),  # fmt: skip
    Option(
        "forward_timeout",
        "float",
        "seconds a forward waits per tier above",
        node_default("forward_timeout"),
        node=True,
    ),  # fmt: skip
    Option("heartbeat", "float", "seconds between heartbeats to the parent", node_default("heartbeat"), node=True),
    Option(
        "max_message_bytes",
        "int",
        "larger messages get 'too_large'; a single larger frame drops the sender's connection",
        node_default("max_message_bytes"),
        node=True,
    ),  # fmt: skip
    Option(
        "rcv_hwm",
        "int",
        "messages ZeroMQ may hold per peer before the node reads them",
        node_default("rcv_hwm"),
        node=True,
    ),  # fmt: skip
    Option(
        "rcv_buf",
        "int",
        "kernel receive buffer (SO_RCVBUF) per connection in bytes; -1: the OS's",
        node_default("rcv_buf"),
        node=True,
    ),  # fmt: skip
    Option(
        "nonfinite",
        "str",
        "NaN/inf in the input, or outputs that overflow: 'refuse' answers bad_input; 'flag' "
        "answers those samples here with flag 4",
        node_default("nonfinite"),
        NONFINITE_MODES,
        node=True,
    ),  # fmt: skip
    Option(
        "adapt",
        "bool",
        "move the threshold online to hold the spec's forwarded share",
        node_default("adapt"),
        node=True,
    ),  # fmt: skip
    Option(
        "spin",
        "bool",
        "busy-poll instead of sleeping between messages: less latency per hop for a node that owns "
        "a CPU core (it keeps that core busy)",
        node_default("spin"),
        node=True,
    ),  # fmt: skip
    Option("threads", "int", "onnxruntime threads per stage", STAGE_THREADS, node=True),
    Option(
        "provider",
        "str",
        "what runs the stages: onnxruntime on the cpu or cuda, tensorrt (the bundle's engines, "
        "else onnxruntime's TensorRT provider), or auto (cuda when it runs here, else the cpu, said at start); "
        "default: the spec's provider per node, else cpu",
        None,
        PROVIDERS,
        node=True,
    ),  # fmt: skip
    Option(
        "metrics_port",
        "int",
        "serve /metrics, /livez, /readyz and /healthz over HTTP on PORT (0: a free port; "
        "with --all, node i of the spec gets PORT+i, or a free port each with 0)",
        metavar="PORT",
    ),  # fmt: skip
    Option(
        "metrics_host",
        "str",
        "address the metrics server binds (default: the host of the node's ZeroMQ address)",
        node=True,
    ),  # fmt: skip
    Option(
        "http_port",
        "int",
        "serve the Open Inference Protocol (KServe v2) over HTTP on PORT (0: a free port; with --all, node i "
        "of the spec gets PORT+i, or a free port each with 0); the 'http' extra",
        metavar="PORT",
    ),  # fmt: skip
    Option(
        "grpc_port",
        "int",
        "serve the Open Inference Protocol over gRPC (inference.GRPCInferenceService) on PORT, as --http-port; "
        "the 'grpc' extra",
        metavar="PORT",
    ),  # fmt: skip
    Option("model_name", "str", "the model's name on the HTTP and gRPC front doors", "cis", node=True),
    Option(
        "http_host",
        "str",
        "address the HTTP and gRPC front doors bind (default 127.0.0.1; 0.0.0.0 for a door with TLS and "
        "--auth-token-file)",
        node=True,
    ),  # fmt: skip
    Option("http_tls_cert", "path", "TLS certificate chain (PEM) of the HTTP front door (https)", node=True),
    Option("http_tls_key", "path", "the private key (PEM) of --http-tls-cert", node=True),
    Option("grpc_tls_cert", "path", "TLS certificate chain (PEM) of the gRPC front door", node=True),
    Option("grpc_tls_key", "path", "the private key (PEM) of --grpc-tls-cert", node=True),
    Option(
        "auth_token_file",
        "path",
        "file whose first line is a bearer token that every front-door request but the health checks must "
        "carry (HTTP header or gRPC metadata 'authorization: Bearer TOKEN')",
        node=True,
    ),  # fmt: skip
    Option(
        "http_timeout",
        "float",
        "seconds an HTTP request may take to arrive whole (else 408) and an idle connection may stay open",
        30.0,
        node=True,
    ),  # fmt: skip
    Option(
        "http_head_timeout",
        "float",
        "seconds a TLS handshake, and a request's line and headers, may take on the HTTP door (at most "
        "--http-timeout); else 408 and the connection closes (a handshake: closed)",
        10.0,
        node=True,
    ),  # fmt: skip
    Option(
        "http_max_connections",
        "int",
        "HTTP connections open at once (also capped by the open-files limit); for a new one beyond, the longest "
        "idle connection is closed (none idle: the new one)",
        10000,
        node=True,
    ),  # fmt: skip
    Option(
        "http_max_json_bytes",
        "int",
        "bytes of JSON the HTTP door decodes per request (the body, or its JSON header with binary tensors), so "
        "one request cannot hold the node's loop long; larger gets 413 (send binary tensor data)",
        4 << 20,
        node=True,
    ),  # fmt: skip
    Option(
        "door_max_request_bytes",
        "int",
        "bytes of one front-door request (HTTP body, gRPC message); larger gets 413 / RESOURCE_EXHAUSTED before it "
        "is read (default: --max-message-bytes)",
        node=True,
    ),  # fmt: skip
    Option(
        "door_max_buffered_bytes",
        "int",
        "bytes the node's front doors may hold at once of requests not yet handed to the node (gRPC: not yet "
        "answered); a request that would pass it gets 503 / RESOURCE_EXHAUSTED",
        256 << 20,
        node=True,
    ),  # fmt: skip
    Option(
        "spans_file",
        "path",
        "append the node's spans (request, queue, compute, forward) to PATH, one JSON line each; {node} in PATH "
        "becomes the node id, a replica's for a node with replicas (with --all PATH must hold {node})",
        node=True,
        metavar="PATH",
    ),  # fmt: skip
    Option(
        "otlp_endpoint",
        "str",
        "export the node's spans with OpenTelemetry over OTLP/HTTP to URL (a collector's base URL, e.g. "
        "http://127.0.0.1:4318; /v1/traces is added); the 'otel' extra; also OTEL_EXPORTER_OTLP_ENDPOINT",
        node=True,
        metavar="URL",
    ),  # fmt: skip
    Option("curve_key", "path", "own CurveZMQ .key_secret: encrypt the node's sockets", node=True),
    Option("allow", "path", "folder of authorised public .key files; other peers are refused", node=True),
    Option("server_key", "path", "the parent's public .key (default: the node's own public key)", node=True),
    Option("trust", "path", "Ed25519 public key (PEM): refuse a bundle not signed by it", node=True),
    Option(
        "log_dir",
        "path",
        "with --all: each node's log in LOG_DIR/ID.log, the cluster's state in LOG_DIR/cluster.json",
    ),  # fmt: skip
)
BY_NAME = {o.name: o for o in OPTIONS}
LOG_KEYS = ("log_level", "log_format")  # the global log options may be set in the file too
ENV_NAMES = frozenset(o.env for o in OPTIONS)


def add_options(p: argparse.ArgumentParser) -> None:
    """Every option as a flag whose value is None unless given (so the environment and the file can fill it)."""
    for o in OPTIONS:
        shown = "" if o.default is None else f" (default {_show(o.default)})"
        if o.kind == "bool":
            p.add_argument(o.flag, action=argparse.BooleanOptionalAction, default=None, help=o.help + shown)
        else:
            p.add_argument(o.flag, type=_flag_type(o), choices=o.choices, metavar=o.metavar, help=o.help + shown)
    p.add_argument("--config", metavar="FILE", help="TOML file of these options (keys as the flags, with _)")


def _show(v: Any) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def _float(text: str) -> float:
    try:
        return float(text)  # accepts inf and -inf
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (inf and -inf are allowed)") from None


_CAST: dict[str, Callable[[str], Any]] = {"int": int, "float": _float, "str": str, "path": str}


def _flag_type(o: Option) -> Callable[[str], Any]:
    """The argparse type of ``o``'s flag: its kind, then its range (:func:`serve_rules.expected`)."""
    cast = _CAST[o.kind]

    def parse(text: str) -> Any:
        value = cast(text)
        wanted = expected(o.name, value)
        if wanted is not None:
            raise argparse.ArgumentTypeError(f"{text!r}; expected {wanted}")
        return value

    parse.__name__ = cast.__name__  # argparse names the type in "invalid int value: 'x'"
    return parse


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> logs.LogSettings:
    """Fill ``args`` in place: flag, else ``CIS_*`` variable, else ``--config`` file, else default. Returns the
    log settings, which the file may set too (after the flags and the variables)."""
    if args.all and args.node is not None:
        raise CisError("--node and --all: give one")
    for flag, given in (("--bind", args.bind), ("--parent", args.parent)):
        if args.all and given is not None:
            raise CisError(f"{flag} goes with --node; --all takes every node's address from the spec (or "
                           "--free-ports)")
    env = {o.name: _from_env(o, environ) for o in OPTIONS if environ.get(o.env, "").strip()}
    path = args.config or environ.get(ENV_PREFIX + "CONFIG", "").strip() or None
    file = read_file(path) if path else {}
    flags = {o.name for o in OPTIONS if getattr(args, o.name) is not None}
    for o in OPTIONS:
        if getattr(args, o.name) is None:
            setattr(args, o.name, env.get(o.name, file.get(o.name, o.default)))
    if args.all:  # --all serves every node: a node (and its addresses) from the variables or the file do not apply
        args.node = args.bind = args.parent = None
    elif args.node is None:
        raise CisError("no node to serve: give --node ID (or CIS_NODE, or node in the --config file) or --all")
    for name, why in (("log_dir", "a single node writes to its own stderr"),
                      ("free_ports", "a single node binds its --bind (port 0: a free one)")):
        if not args.all and getattr(args, name):  # named where it came from: the flag, the variable or the file
            where = BY_NAME[name].flag if name in flags else BY_NAME[name].env if name in env else f"{path}: {name}"
            raise CisError(f"{where} goes with --all; {why}")
    # the file's log keys rank below the flags and the variables: they act as variables that are not set
    below = {logs.ENV_LEVEL: file.get("log_level", ""), logs.ENV_FORMAT: file.get("log_format", "")}
    return logs.resolve(args.log_level, args.log_format, {**below, **{k: v for k, v in environ.items() if v.strip()}})


def _from_env(o: Option, environ: Mapping[str, str]) -> Any:
    return _check(o, environ[o.env].strip(), o.env, text=True)


def read_file(path: str | Path) -> dict[str, Any]:
    """The options of a TOML file, checked: unknown keys and wrong types are one line naming file and key."""
    from cis.core.spec_file import tomllib

    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except OSError as exc:
        raise CisError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CisError(f"{p}: not valid TOML ({exc})") from None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in LOG_KEYS:
            allowed = logs.LEVELS if key == "log_level" else logs.FORMATS
            if not isinstance(value, str) or value.lower() not in allowed:
                raise CisError(f"{p}: {key} is {value!r}; expected one of {', '.join(allowed)}")
            out[key] = value.lower()
            continue
        o = BY_NAME.get(key)
        if o is None:
            near = _near(key, LOG_KEYS)
            known = ", ".join([*BY_NAME, *LOG_KEYS])
            raise CisError(f"{p}: unknown key {key!r}{near}; expected serve's options: {known}")
        value = _check(o, value, f"{p}: {key}")
        out[key] = str(p.parent / value) if o.kind == "path" and not Path(value).is_absolute() else value
    return out


def _near(key: str, more: tuple[str, ...] = ()) -> str:
    """`` (did you mean max_batch?)`` for a mistyped option name, or nothing."""
    near = difflib.get_close_matches(key.replace("-", "_"), [*BY_NAME, *more], 1)
    return f" (did you mean {near[0]}?)" if near else ""


def option_text(name: str, text: str, where: str) -> tuple[Option, str]:
    """An option given as ``NAME=VALUE`` text (``cis deploy --set``), checked as its ``CIS_*`` variable would be:
    the option (``-`` in NAME reads as ``_``) and the variable's value (booleans as ``true``/``false``)."""
    o = BY_NAME.get(name.strip().replace("-", "_"))
    if o is None:
        raise CisError(f"{where}: unknown option {name!r}{_near(name)}; expected one of serve's: {', '.join(BY_NAME)}")
    value = _check(o, text.strip(), where, text=True)
    return o, ("true" if value else "false") if o.kind == "bool" else text.strip()


def _check(o: Option, value: Any, where: str, text: bool = False) -> Any:
    """``value`` as the option's kind (``text``: parsed from an environment variable), or one line."""
    try:
        got = _parse(o.kind, value) if text else _typed(o.kind, value)
    except (TypeError, ValueError):
        raise CisError(f"{where} is {value!r}; expected {EXPECTED[o.kind]}") from None
    if o.choices is not None and got not in o.choices:
        raise CisError(f"{where} is {value!r}; expected one of {', '.join(o.choices)}")
    wanted = expected(o.name, got)
    if wanted is not None:
        raise CisError(f"{where} is {value!r}; expected {wanted}")
    return got


def _parse(kind: str, text: str) -> Any:
    if kind == "bool":
        if text.lower() not in TRUE + FALSE:
            raise ValueError(text)
        return text.lower() in TRUE
    return {"int": int, "float": float}.get(kind, str)(text)


def _typed(kind: str, value: Any) -> Any:
    ok = {
        "int": type(value) is int,
        "float": type(value) in (int, float),
        "bool": type(value) is bool,
    }.get(kind, type(value) is str)
    if not ok:
        raise TypeError(value)
    return float(value) if kind == "float" else value


NODE_FIELDS = {f.name for f in dataclasses.fields(NodeConfig)} - {"bind", "parent", "threshold"}  # build_node's


def node_config(args: argparse.Namespace) -> dict[str, Any]:
    """The NodeConfig fields among a resolved ``args`` (queue_limit only when set: else the spec's)."""
    given = {o.name: getattr(args, o.name) for o in OPTIONS if o.name in NODE_FIELDS}
    return {k: v for k, v in given.items() if v is not None}


def child_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of the nodes that ``--all`` starts: without serve's variables, whose values the
    launcher has resolved and passes as flags (a node must not read CIS_LOG_DIR or CIS_NODE again)."""
    return {k: v for k, v in environ.items() if k not in ENV_NAMES and k != ENV_PREFIX + "CONFIG"}
