"""``cis serve BUNDLE --node ID`` (one node) or ``cis serve BUNDLE --all`` (every node, one process each)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from cis.cli.commands import serve_config as options
from cis.core import logs
from cis.core.errors import CisError
from cis.runtime.node_config import node_default

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a bundle: one CIS node, or all nodes with --all",
        description="Each option is also a CIS_* environment variable (CIS_MAX_BATCH) and a key of the --config "
        "file (max_batch); a flag wins over the variable, the variable over the file, the file over the default.",
    )
    p.add_argument("bundle", help="bundle folder written by 'cis export'")
    p.add_argument("--all", action="store_true", help="start every node of the spec as its own process")
    options.add_options(p)
    # set by --all when it restarts a node
    p.add_argument("--restarts", type=int, default=node_default("restarts"), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="with --all: print the addresses as one JSON line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.runtime.orphans import die_with_launcher

    die_with_launcher()
    with StopAsked(signal.SIGINT) as stop:  # a Ctrl-C from here is a request to stop, not a traceback from an import
        return _serve(args, stop)


def _serve(args: argparse.Namespace, stop: StopAsked) -> int:
    from cis.core.bundle import load_bundle
    from cis.core.spec import load_spec

    logs.configure(options.resolve(args))  # the file may set the log level and format too
    if args.metrics_port is not None:  # its range: serve_rules
        from cis.core.extras import require

        require("metrics", "--metrics-port")
    _check_tracing(args)
    doors = _door_configs(args)  # checked before any node starts
    bundle = load_bundle(args.bundle, trust=args.trust)
    spec = load_spec(args.spec) if args.spec else bundle.spec
    if spec is None:
        raise CisError(f"{args.bundle}: bundle has no spec; pass --spec")
    if args.all:
        _check_providers(args, bundle, spec)
        _check_fit(args, bundle, spec)
        _check_spans_files(args, spec)
        return _run_all(args, spec, stop)
    return _run_node(args, bundle, spec, doors, stop)


class StopAsked:
    """A context in which ``signals`` (and those :meth:`catch` adds) are caught and remembered, the last one in
    :attr:`signum`; calling it says whether one came. Leaving it puts the handlers from before back.

    ``cis serve`` stops at the next place that looks (before the node serves, the launcher's wait for its nodes,
    the loop of ``--all``), not at a KeyboardInterrupt thrown into the middle of loading the stages, which a
    library's import turns into a traceback."""

    def __init__(self, *signals: signal.Signals):
        self.signum = 0
        self.signals = signals
        self.before: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopAsked:
        self.catch(*self.signals)
        return self

    def catch(self, *signals: signal.Signals) -> None:
        for s in signals:
            self.before.setdefault(s, signal.getsignal(s))
            signal.signal(s, self._caught)

    def _caught(self, signum: int, _frame: object) -> None:
        self.signum = signum

    def __call__(self) -> bool:
        return self.signum != 0

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.before.items():
            signal.signal(s, handler)


def _check_tracing(args: argparse.Namespace) -> None:
    """--spans-file and --otlp-endpoint: one line now rather than from each node later."""
    from cis.runtime.tracing import otlp_endpoint

    if args.all and args.spans_file and "{node}" not in args.spans_file:
        raise CisError(
            f"--spans-file {args.spans_file}: with --all each node writes its own file; put {{node}} in the path "
            "(e.g. logs/{node}.spans.jsonl)"
        )
    if args.otlp_endpoint:
        from cis.core.extras import require

        otlp_endpoint(args.otlp_endpoint)
        require("otel", "--otlp-endpoint")


def _check_spans_files(args: argparse.Namespace, spec) -> None:
    """Before --all starts any node: each node's spans file can be opened (a node that cannot would only be
    restarted again and again)."""
    from pathlib import Path

    from cis.runtime.tracing import open_spans_file

    if args.spans_file:
        for n in spec.nodes:
            for rid in n.replica_ids:  # each replica writes its own file
                open_spans_file(Path(args.spans_file.replace("{node}", rid))).close()


def _curve(args: argparse.Namespace):
    from cis.runtime.security import CurveConfig

    if args.allow and not args.curve_key:
        raise CisError("--allow needs --curve-key (the node's own .key_secret): authentication runs over CurveZMQ")
    server = args.server_key
    if args.curve_key and not server:
        server = str(args.curve_key).removesuffix("_secret")
    return CurveConfig(args.curve_key, args.allow, server)


def _door_configs(args: argparse.Namespace) -> dict:
    """{"http": DoorConfig, "grpc": DoorConfig} for the doors asked for (--http-port, --grpc-port), checked:
    the extra, a TLS certificate with its key, the token file (the ports' and limits' ranges: serve_rules)."""
    from cis.core.extras import require
    from cis.runtime.oip.door import DoorConfig

    out = {}
    token = _token(args.auth_token_file) if args.auth_token_file else None
    for door in ("http", "grpc"):
        port, cert, key = (getattr(args, f"{door}_{k}") for k in ("port", "tls_cert", "tls_key"))
        if (cert is None) != (key is None):
            raise CisError(f"--{door}-tls-cert and --{door}-tls-key go together; give both")
        if port is None:
            continue
        require(door, f"--{door}-port")
        for flag, path in ((f"--{door}-tls-cert", cert), (f"--{door}-tls-key", key)):
            if path is not None and not os.path.isfile(path):
                raise CisError(f"{flag} {path}: no such file; expected a PEM file")
        out[door] = DoorConfig(
            port, args.http_host, cert, key, token, args.http_timeout, args.http_max_connections,
            args.door_max_request_bytes or args.max_message_bytes, min(args.http_head_timeout, args.http_timeout),
            args.http_max_json_bytes, args.door_max_buffered_bytes,
        )  # fmt: skip
    return out


def _token(path: str) -> str:
    """The bearer token: the file's first line, stripped."""
    try:
        with open(path) as f:
            token = f.readline().strip()
    except OSError as exc:
        raise CisError(f"--auth-token-file {path}: cannot read ({exc.strerror or exc})") from None
    if not token or any(c.isspace() for c in token):
        raise CisError(f"--auth-token-file {path}: expected a token (no spaces) on its first line")
    return token


def _open_doors(node, doors: dict, model_name: str) -> None:
    """Give ``node`` its front doors (sharing one budget of buffered bytes, and the latency and batch timings
    their statistics read); they bind when the node opens its sockets."""
    from cis.runtime.metrics_http import node_timings
    from cis.runtime.oip.codec import Model
    from cis.runtime.oip.door import Budget

    if not doors:
        return
    stages = node.stages
    model = Model.of_stage(model_name, node.cfg.node_id, stages[min(stages)].inputs, stages[node.cfg.exit].outputs)
    budget = Budget(next(iter(doors.values())).max_buffered)
    node_timings(node)
    for kind, cfg in doors.items():
        if kind == "http":
            from cis.runtime.oip.http_door import HttpDoor

            node.doors.append(HttpDoor(model, cfg, budget))
        else:
            from cis.runtime.oip.grpc_door import GrpcDoor

            node.doors.append(GrpcDoor(model, cfg, budget))


def _run_node(args: argparse.Namespace, bundle, spec, doors: dict, stop: StopAsked) -> int:
    opts = {**options.node_config(args), "curve": _curve(args), "restarts": args.restarts}
    metrics = _metrics_server(args, spec)  # up before the stages load: /readyz says "loading" meanwhile
    try:
        node = _build(bundle, args, spec, opts)
        _open_doors(node, doors, args.model_name)
        if stop():  # a Ctrl-C while the stages loaded: main says "interrupted"
            raise KeyboardInterrupt
        ready = None if metrics is None else lambda: metrics.attach(node)
        node.run(ready=ready, stop=stop)  # logs its start and its stop; its own handlers take the signals now
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def _metrics_server(args: argparse.Namespace, spec):
    """The node's metrics server (state: loading) with --metrics-port, else None."""
    if args.metrics_port is None:
        return None
    from cis.runtime.metrics_http import MetricsServer, http_host

    host = args.metrics_host or http_host(args.bind or _replica_address(spec, args.node))
    return MetricsServer(args.node, host, args.metrics_port)


def _replica_address(spec, name: str) -> str:
    """The spec's address of the node or replica ``name`` (cloud#1), "" where it has none (or no such one:
    building the node says so)."""
    from cis.core.replicas import split_replica_id

    try:
        node_id, index = split_replica_id(name)
        where = spec.node(node_id).replica_addresses or []
    except (ValueError, CisError):
        return ""
    return where[index or 0] if (index or 0) < len(where) else ""


def _build(bundle, args, spec, opts):
    import zmq

    from cis.runtime.factory import build_node

    try:
        return build_node(
            bundle,
            args.node,
            spec,
            args.bind,
            args.parent,
            args.threshold,
            transfer_cap=args.cap,
            threads=args.threads,
            provider=args.provider,
            **opts,
        )
    except zmq.ZMQError as exc:
        raise CisError(f"node {args.node}: {exc}") from None


def _check_fit(args: argparse.Namespace, bundle, spec) -> None:
    """Before --all starts any node: one line for a node the bundle does not fit (a spec of another tree: no
    threshold for it, or an exit past its stages), not one such line from every node among their logs."""
    from cis.runtime.factory import fit

    for node in spec.nodes:
        fit(bundle, spec, node.id, args.threshold)


def _check_providers(args: argparse.Namespace, bundle, spec) -> None:
    """Before --all starts any node: one line if a node's provider (cuda, tensorrt) cannot run here."""
    from cis.core.stages.backends import node_provider, open_stages, refusal
    from cis.core.stages.runner import ProviderError

    tried: set[str] = set()
    for n in spec.nodes:
        provider, source = node_provider(n, args.provider)
        if provider in ("cpu", "auto") or provider in tried:
            continue
        tried.add(provider)
        try:
            open_stages(bundle, [1], provider)
        except ProviderError as exc:
            raise refusal(n.id, exc, source) from None


def _node_options(args: argparse.Namespace) -> list[str]:
    """The node options of a resolved ``args`` as flags, for each node that ``--all`` starts."""
    out: list[str] = []
    for o in options.OPTIONS:
        value = getattr(args, o.name)
        if not o.node or value is None or value == o.default:
            continue
        if o.kind == "bool":
            out.append(o.flag if value else "--no-" + o.flag[2:])
        else:
            out += [o.flag, str(value)]
    return out


def _run_all(args: argparse.Namespace, spec, stop: StopAsked) -> int:
    from cis.runtime.launcher import launch
    from cis.runtime.security import CurveConfig

    per_node: dict[str, list[str]] = {}
    extra = _node_options(args)
    if args.threshold is not None:  # the root always serves everything
        for n in spec.nodes:
            if n.parent is not None:
                per_node[n.id] = [f"--threshold={args.threshold}"]  # "=": -inf is no flag
    stop.catch(signal.SIGTERM)
    # the launcher's readiness probes use the nodes' own key pair, which every node trusts
    probe = CurveConfig(args.curve_key, None, str(args.curve_key).removesuffix("_secret")) if args.curve_key else None
    start = getattr(args, "start_cluster", None) or launch  # cis testbed: the same nodes, each in a namespace
    try:
        if stop():  # asked while the bundle was read and checked
            raise KeyboardInterrupt
        cluster = _start(start, args, spec, extra, per_node, probe, stop)
    except KeyboardInterrupt:  # asked to stop while the nodes started: the launcher stopped them
        if stop.signum != signal.SIGTERM:
            raise  # a Ctrl-C: main says "interrupted"
        log.info("stopped while the nodes started")
        return 0
    try:
        _print_cluster(args, spec, cluster)
        while not stop():
            cluster.supervise()  # restart nodes that died (backoff), reap them: no zombies
            time.sleep(0.1)
    finally:
        codes = cluster.stop()
        log.info("stopped %d nodes", len(codes))
    return 0


def _start(start: Callable, args: argparse.Namespace, spec, extra: list[str], per_node: dict, probe, stop):
    """The nodes started (:func:`cis.runtime.launcher.launch`, or the testbed's), every one ready."""
    return start(
        args.bundle,
        spec,
        args.spec,
        args.free_ports,
        extra,
        per_node,
        log_dir=args.log_dir,
        curve=probe,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        env=options.child_env(),
        door_ports={door: getattr(args, f"{door}_port") for door in ("http", "grpc")},
        door_host=args.http_host,
        door_tls=args.http_tls_cert is not None,
        stop_asked=stop,
    )


def _print_cluster(args: argparse.Namespace, spec, cluster) -> None:
    """Every node's address, exit and pid (and a testbed's namespace and link): one JSON line, or a table."""
    describe: Callable[..., dict] = getattr(cluster, "describe", lambda node=None: {})  # a testbed's namespace, link
    every = [(rid, n) for n in spec.nodes for rid in n.replica_ids]  # a node with replicas: each of them
    if not args.json:
        for rid, n in every:
            urls = [cluster.metrics.get(rid), *(cluster.doors.get(d, {}).get(rid) for d in ("http", "grpc"))]
            shown = "".join(f"  {u}" for u in urls if u)
            pid = cluster.procs[rid].pid
            print(f"{rid:<12} exit {n.exit}  {cluster.addresses[rid]}  pid {pid}{shown}", flush=True)
        log.info("serving %d nodes; Ctrl-C stops every node", len(every))
        return
    nodes = {
        rid: {
            "address": cluster.addresses[rid],
            "node": n.id,
            "exit": n.exit,
            "parent": n.parent,
            "pid": cluster.procs[rid].pid,
            "metrics": cluster.metrics.get(rid),
            "http": cluster.doors.get("http", {}).get(rid),
            "grpc": cluster.doors.get("grpc", {}).get(rid),
            **describe(rid),
        }
        for rid, n in every
    }
    print(json.dumps({"nodes": nodes, **describe()}), flush=True)
