"""``cis serve BUNDLE --node ID`` (one node) or ``cis serve BUNDLE --all`` (every node, one process each)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from cis.errors import CisError
from cis.spec import PROVIDERS


def _float(text: str) -> float:
    try:
        return float(text)  # accepts inf and -inf
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (inf and -inf are allowed)") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a bundle: one CIS node, or all nodes with --all")
    p.add_argument("bundle", help="bundle folder written by 'cis export'")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", help="the node id of the spec to serve")
    who.add_argument("--all", action="store_true", help="start every node of the spec as its own process on loopback")
    p.add_argument("--spec", help="spec file (default: the spec inside the bundle)")
    p.add_argument("--bind", help="address to bind (default: the node's address in the spec)")
    p.add_argument("--parent", help="parent's address (default: the parent's address in the spec)")
    p.add_argument(
        "--free-ports", action="store_true", help="with --all: ignore the spec's addresses and pick free loopback ports"
    )
    p.add_argument(
        "--threshold", type=_float, help="override the bundle policy's threshold (with --all: every non-root node)"
    )
    p.add_argument(
        "--no-cap", action="store_true", help="do not enforce max_transfer_rate (forward whatever the policy says)"
    )
    p.add_argument("--max-batch", type=int, default=32, help="samples per micro-batch (default 32)")
    p.add_argument(
        "--max-wait",
        type=float,
        default=0.0,
        help="seconds a request may wait for a fuller batch (default 0: run when idle)",
    )
    p.add_argument(
        "--queue-limit",
        type=int,
        help="samples that may wait; beyond, 'overloaded'; a bigger request gets 'too_many_samples' "
        "(default: spec queue_limit or 1024)",
    )
    p.add_argument(
        "--forward-timeout", type=float, default=1.0, help="seconds a forward waits per tier above (default 1)"
    )
    p.add_argument(
        "--heartbeat", type=float, default=0.2, help="seconds between heartbeats to the parent (default 0.2)"
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=64 << 20,
        help="larger messages get 'too_large'; a single larger frame drops the sender's connection (default 64 MiB)",
    )
    p.add_argument(
        "--rcv-hwm",
        type=int,
        default=64,
        help="messages ZeroMQ may hold per peer before the node reads them (default 64)",
    )
    p.add_argument(
        "--rcv-buf",
        type=int,
        default=-1,
        help="kernel receive buffer (SO_RCVBUF) per connection in bytes: small keeps the waiting "
        "visible to the node (default: OS)",
    )
    p.add_argument(
        "--nonfinite",
        choices=("refuse", "flag"),
        default="refuse",
        help="input with NaN/inf: 'refuse' answers bad_input (default); 'flag' answers those samples here with flag 4",
    )
    p.add_argument("--adapt", action="store_true", help="move the threshold online to hold the spec's forwarded share")
    p.add_argument(
        "--spin",
        action="store_true",
        help="busy-poll instead of sleeping between messages: less latency per hop for a node that owns a CPU core "
        "(it keeps that core busy)",
    )
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads per stage (default 1)")
    p.add_argument(
        "--provider",
        choices=PROVIDERS,
        help="what runs the stages: onnxruntime on the cpu or cuda, tensorrt (the bundle's engines, else "
        "onnxruntime's TensorRT provider), or auto (cuda when it runs here, else the cpu, said at start); "
        "default: the spec's provider per node, else cpu. A provider that cannot run here stops the node",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus /metrics and /healthz over HTTP on PORT (0: a free port; with --all, node i of the "
        "spec gets PORT+i, or a free port each with 0)",
    )
    p.add_argument(
        "--metrics-host",
        help="address the metrics server binds (default: the host of the node's ZeroMQ address; 0.0.0.0 for *)",
    )
    p.add_argument("--curve-key", help="own CurveZMQ .key_secret: encrypt the node's sockets")
    p.add_argument("--allow", help="folder of authorised public .key files; other peers are refused")
    p.add_argument("--server-key", help="the parent's public .key (default: the node's own public key)")
    p.add_argument("--trust", help="Ed25519 public key (PEM): refuse a bundle whose manifest is not signed by it")
    p.add_argument(
        "--log-dir",
        help="with --all: each node's output in LOG_DIR/ID.log, the cluster's state in LOG_DIR/cluster.json",
    )
    p.add_argument("--restarts", type=int, default=0, help=argparse.SUPPRESS)  # set by --all when it restarts a node
    p.add_argument("--json", action="store_true", help="with --all: print the addresses as one JSON line")
    p.set_defaults(func=run)


def _node_options(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for flag, value in (
        ("--threshold", args.threshold),
        ("--max-batch", args.max_batch),
        ("--max-wait", args.max_wait),
        ("--queue-limit", args.queue_limit),
        ("--forward-timeout", args.forward_timeout),
        ("--heartbeat", args.heartbeat),
        ("--max-message-bytes", args.max_message_bytes),
        ("--rcv-hwm", args.rcv_hwm),
        ("--rcv-buf", args.rcv_buf),
        ("--nonfinite", args.nonfinite),
        ("--threads", args.threads),
        ("--provider", args.provider),
        ("--metrics-host", args.metrics_host),
        ("--curve-key", args.curve_key),
        ("--allow", args.allow),
        ("--server-key", args.server_key),
        ("--trust", args.trust),
    ):
        if value is not None:
            out += [flag, str(value)]
    if args.no_cap:
        out.append("--no-cap")
    if args.adapt:
        out.append("--adapt")
    if args.spin:
        out.append("--spin")
    return out


def run(args: argparse.Namespace) -> int:
    from cis.bundle import load_bundle
    from cis.spec import load_spec

    if args.metrics_port is not None:
        from cis.extras import require

        if not 0 <= args.metrics_port <= 65535:
            raise CisError(f"--metrics-port is {args.metrics_port}; expected 0 (a free port) to 65535")
        require("metrics", "--metrics-port")
    bundle = load_bundle(args.bundle, trust=args.trust)
    spec = load_spec(args.spec) if args.spec else bundle.spec
    if spec is None:
        raise CisError(f"{args.bundle}: bundle has no spec; pass --spec")
    if args.all:
        _check_providers(args, bundle, spec)
        return _run_all(args, spec)
    if args.log_dir:
        raise CisError("--log-dir goes with --all; a single node writes to its own stderr")
    return _run_node(args, bundle, spec)


def _curve(args: argparse.Namespace):
    from cis.runtime.security import CurveConfig

    if args.allow and not args.curve_key:
        raise CisError("--allow needs --curve-key (the node's own .key_secret): authentication runs over CurveZMQ")
    server = args.server_key
    if args.curve_key and not server:
        server = str(args.curve_key).removesuffix("_secret")
    return CurveConfig(args.curve_key, args.allow, server)


def _run_node(args: argparse.Namespace, bundle, spec) -> int:
    from cis.stages import StageRunner  # noqa: F401  (fail early if onnxruntime is missing)

    opts = dict(
        max_batch=args.max_batch,
        max_wait=args.max_wait,
        forward_timeout=args.forward_timeout,
        heartbeat=args.heartbeat,
        heartbeat_timeout=max(1.0, 5 * args.heartbeat),
        max_message_bytes=args.max_message_bytes,
        adapt=args.adapt,
        curve=_curve(args),
        rcv_hwm=args.rcv_hwm,
        rcv_buf=args.rcv_buf,
        nonfinite=args.nonfinite,
        spin=args.spin,
        restarts=args.restarts,
    )
    if args.queue_limit is not None:
        opts["queue_limit"] = args.queue_limit
    metrics = _metrics_server(args, spec)  # up before the stages load: /healthz says "loading" meanwhile
    try:
        node = _build(bundle, args, spec, opts)
        cfg = node.cfg
        backend = cfg.backend
        if backend is not None and backend.note:
            print(f"cis serve: node {cfg.node_id}: {backend.note}", file=sys.stderr, flush=True)

        def ready() -> None:  # sockets bound, signal handlers set: the node serves from here on
            if metrics is not None:
                metrics.attach(node)
            print(
                f"cis serve: node {cfg.node_id} (exit {cfg.exit}) at {cfg.bind}"
                + (f", parent {cfg.parent}" if cfg.parent else " (root)")
                + (f"; stages on {backend.describe()}" if backend is not None else "")
                + (f"; metrics {metrics.url}" if metrics is not None else ""),
                file=sys.stderr,
                flush=True,
            )

        node.run(ready=ready)
    finally:
        if metrics is not None:
            metrics.close()
    print(f"cis serve: node {cfg.node_id} stopped", file=sys.stderr, flush=True)
    return 0


def _metrics_server(args: argparse.Namespace, spec):
    """The node's metrics server (state: loading) with --metrics-port, else None."""
    if args.metrics_port is None:
        return None
    from cis.runtime.metrics_http import MetricsServer, http_host

    host = args.metrics_host or http_host(args.bind or spec.node(args.node).address or "")
    return MetricsServer(args.node, host, args.metrics_port)


def _build(bundle, args, spec, opts):
    import zmq

    from cis.runtime import build_node

    try:
        return build_node(
            bundle,
            args.node,
            spec,
            args.bind,
            args.parent,
            args.threshold,
            transfer_cap=not args.no_cap,
            threads=args.threads,
            provider=args.provider,
            **opts,
        )
    except zmq.ZMQError as exc:
        raise CisError(f"node {args.node}: {exc}") from None


def _check_providers(args: argparse.Namespace, bundle, spec) -> None:
    """Before --all starts any node: one line if a node's provider (cuda, tensorrt) cannot run here."""
    from cis.backends import node_provider, open_stages, refusal
    from cis.stages import ProviderError

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


def _run_all(args: argparse.Namespace, spec) -> int:
    from cis.runtime.launcher import launch
    from cis.runtime.security import CurveConfig

    per_node: dict[str, list[str]] = {}
    extra = _node_options(args)
    if args.threshold is not None:  # the root always serves everything
        extra = [
            a for i, a in enumerate(extra) if not (a == "--threshold" or (i > 0 and extra[i - 1] == "--threshold"))
        ]
        for n in spec.nodes:
            if n.parent is not None:
                per_node[n.id] = ["--threshold", str(args.threshold)]
    stop = {"now": False}

    def on_signal(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # the launcher's readiness probes use the nodes' own key pair, which every node trusts
    probe = CurveConfig(args.curve_key, None, str(args.curve_key).removesuffix("_secret")) if args.curve_key else None
    start = getattr(args, "start_cluster", None) or launch  # cis testbed: the same nodes, each in a namespace
    cluster = start(
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
    )
    describe = getattr(cluster, "describe", lambda node=None: {})  # what a testbed adds (namespace, link)
    try:
        if args.json:
            print(
                json.dumps(
                    {
                        "nodes": {
                            n.id: {
                                "address": cluster.addresses[n.id],
                                "exit": n.exit,
                                "parent": n.parent,
                                "pid": cluster.procs[n.id].pid,
                                "metrics": cluster.metrics.get(n.id),
                                **describe(n.id),
                            }
                            for n in spec.nodes
                        },
                        **describe(),
                    }
                ),
                flush=True,
            )
        else:
            for n in spec.nodes:
                url = f"  {cluster.metrics[n.id]}" if n.id in cluster.metrics else ""
                print(
                    f"{n.id:<12} exit {n.exit}  {cluster.addresses[n.id]}  pid {cluster.procs[n.id].pid}{url}",
                    flush=True,
                )
            print("serving; Ctrl-C stops every node", file=sys.stderr, flush=True)
        while not stop["now"]:
            cluster.supervise()  # restart nodes that died (backoff), reap them: no zombies
            time.sleep(0.1)
    finally:
        codes = cluster.stop()
        print(f"cis serve: stopped {len(codes)} nodes", file=sys.stderr, flush=True)
    return 0
