"""``cis infer --connect ADDR --dataset digits --split test``: send a data set, report what came back.

``--dataset`` is a built-in data set (``digits``, ``cifar10:PATH``, ``cifar100:PATH``: the
'train' extra, as training reads them) or files that the core install reads alone
(:mod:`cis.core.input_files`): ``FILE.npz`` arrays (with ``--bundle``, or else as the entry node says its stage 1
takes them (its status reply's ``inputs``): any shape and dtype, token ids included) or an image folder (with
``--bundle`` for the normalisation).

The summary says each error code with the node's first message (e.g. ``bad_input`` and why a stage could not take
an input), and where the transfer cap kept samples from being forwarded (``capped``, per node).
``--out FILE.csv`` writes one row per sample, with the node it was sent to and when (a requests file
``cis rates --measured`` reads).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cis.cli.main import print_result, seed
from cis.core.errors import CisError
from cis.core.records import format_ms
from cis.runtime.wire import RETRY_AFTER

if TYPE_CHECKING:
    from cis.runtime.client import Result


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("infer", help="send a data set to a running CIS and report accuracy, served shares, latency")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--connect", help="a node's address: every request goes there (several, separated by commas: spread over them, "
        "e.g. a node's replicas; with --out only one node's)"
    )
    where.add_argument(
        "--spec", help="spec file: each sample goes to the node that assign_entries picks (as the offline evaluation)"
    )
    p.add_argument(
        "--dataset",
        required=True,
        help="digits, cifar10:PATH, cifar100:PATH (these need the 'train' extra), "
        "FILE.npz (array x, optional labels y; or npz:FILE: any shape and dtype stage 1 takes, e.g. int64 token "
        "ids, as --bundle says or else the entry node itself) or an image folder DIR[/<class>]/*.png "
        "(or images:DIR; needs --bundle)",
    )
    p.add_argument(
        "--bundle", help="bundle whose normalisation, classes and input size apply to images or uint8 arrays"
    )
    p.add_argument(
        "--split", default="test", choices=("train", "val", "test"), help="digits/cifar: which split (default test)"
    )
    p.add_argument("--n", type=int, help="first N samples only")
    p.add_argument("--rate", type=float, help="requests per second (default: as fast as --window allows)")
    p.add_argument("--window", type=int, default=32, help="requests in flight per node (default 32)")
    p.add_argument("--batch-size", type=int, default=1, help="samples per request with --connect (default 1)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as lost")
    retry = p.add_mutually_exclusive_group()
    retry.add_argument(
        "--retry-after", type=float, default=RETRY_AFTER, metavar="S",
        help="send a request once more (same id; to another entry node, or to the same once it is back) when no "
        f"reply came within S seconds; also at once when its entry node's connection closes (default {RETRY_AFTER:g})",
    )  # fmt: skip
    retry.add_argument("--no-retry", action="store_true", help="never send a request twice")
    p.add_argument("--seed", type=seed, default=0, help="data split seed and entry assignment seed")
    p.add_argument(
        "--traceparent",
        help="W3C trace context 00-<32 hex>-<16 hex>-<2 hex> that every request joins (default: the TRACEPARENT "
        "environment variable); the nodes that trace record their spans in that trace",
    )
    p.add_argument(
        "--tracestate",
        help="W3C tracestate that goes with the traceparent, e.g. congo=t61rcWkgMzE (default: the TRACESTATE "
        "environment variable, when the traceparent is TRACEPARENT's); every node passes it on and records it on "
        "its spans",
    )
    p.add_argument("--curve-key", help="own CurveZMQ .key_secret")
    p.add_argument("--server-key", help="the node's public .key")
    p.add_argument(
        "--out",
        help="CSV file: one row per sample "
        "(sample, file, label, class, confidence, exit, node, degraded, capped, error, entry, sent_s, latency_s)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _check_numbers(args: argparse.Namespace) -> None:
    """One line for a number that cannot work (a --window of 0 would wait forever, a --rate of 0 divide by 0)."""
    counts = (("--window", args.window, "requests in flight per node"), ("--batch-size", args.batch_size,
              "samples per request"), ("--n", 1 if args.n is None else args.n, "samples"))  # fmt: skip
    for flag, value, what in counts:
        if value < 1:
            raise CisError(f"{flag} is {value}; expected {what} >= 1")
    if args.rate is not None and not args.rate > 0:
        raise CisError(f"--rate is {args.rate:g}; expected requests per second > 0 (none: as fast as --window allows)")
    if not 0 < args.timeout < math.inf:
        raise CisError(f"--timeout is {args.timeout:g}; expected seconds > 0 and finite")
    if not 0 < args.retry_after < math.inf:  # NaN too
        raise CisError(f"--retry-after is {args.retry_after:g}; expected seconds > 0 and finite (or --no-retry)")
    if args.connect is not None and not args.connect.replace(",", "").strip():
        raise CisError(f"--connect {args.connect!r}: no address; expected a node's address, e.g. tcp://HOST:PORT "
                       "(several separated by commas)")


def run(args: argparse.Namespace) -> int:
    from cis.runtime.result_summary import summarize

    _traceparent(args)
    _check_numbers(args)
    if args.out:
        writable_file(args.out, "--out")  # before anything is sent: a run is not lost to a bad path
    data = read_dataset(args)
    x, y = data.x, data.y
    if args.n is not None:
        x, y = x[: args.n], (None if y is None else y[: args.n])
    results, entry = _send(args, x)
    summary = summarize(results, y)
    lines = summary_lines(summary, len(x))
    if args.out:
        write_rows(args.out, results, y, data.names, entry)
        summary["out"] = args.out
        lines.append(f"wrote {args.out}")
    print_result(args, summary, "\n".join(lines))
    return 0 if not summary["errors"] else 1


def writable_file(path: str, flag: str) -> None:
    """One line unless ``path`` can be written: its folder made if missing, and not a folder itself."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CisError(f"{flag} {path}: cannot make its folder {target.parent} ({exc.strerror})") from None
    if target.is_dir() or not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise CisError(f"{flag} {path}: not a file this user can write; expected a writable file path")


def _traceparent(args: argparse.Namespace) -> None:
    """--traceparent, else the TRACEPARENT variable (OpenTelemetry's carrier for a process's context), and
    --tracestate, else the TRACESTATE variable when the traceparent is TRACEPARENT's (the two variables are one
    context), checked; --tracestate without a traceparent is one line."""
    from cis.runtime.tracing import check_traceparent, check_tracestate

    where, state_where = "--traceparent", "--tracestate"
    if args.traceparent is None and os.environ.get("TRACEPARENT", "").strip():
        args.traceparent, where = os.environ["TRACEPARENT"].strip(), "the TRACEPARENT variable"
        if args.tracestate is None and os.environ.get("TRACESTATE", "").strip():
            args.tracestate, state_where = os.environ["TRACESTATE"].strip(), "the TRACESTATE variable"
    if args.traceparent is not None:
        check_traceparent(args.traceparent, where)
    if args.tracestate is not None:
        if args.traceparent is None:
            raise CisError(f"--tracestate is {args.tracestate!r:.80} without a traceparent; expected --traceparent "
                           "(or the TRACEPARENT variable) beside it")  # fmt: skip
        check_tracestate(args.tracestate, state_where)


def _curve(args: argparse.Namespace):
    from cis.runtime.security import CurveConfig

    return CurveConfig(args.curve_key, None, args.server_key) if args.curve_key else None


def _send(args: argparse.Namespace, x) -> tuple[Sequence[Result | None], list[str]]:
    """Every sample to --connect's node, or each to the entry node the spec assigns it; the results and, for
    --out, each sample's entry node."""
    from cis.runtime.client import Client, infer_spread

    retry = None if args.no_retry else args.retry_after
    if args.connect is not None:
        addresses = [a.strip() for a in args.connect.split(",") if a.strip()]
        entry = [_entry_node(args, addresses)] * len(x) if args.out else []  # before anything is sent
        with Client(addresses, timeout=args.timeout, curve=_curve(args), retry_after=retry) as c:
            results = c.infer_many(
                x, batch_size=args.batch_size, window=args.window, rate=args.rate, timeout=args.timeout,
                traceparent=args.traceparent, tracestate=args.tracestate,
            )  # fmt: skip
            return results, entry
    from cis.core.policy.exit_policy import assign_entries
    from cis.core.spec import load_spec

    spec = load_spec(args.spec)
    entries = assign_entries(spec, len(x), args.seed)
    clients = {}
    try:
        for nid in entries:
            where = spec.node(nid).replica_addresses  # an entry node with replicas: spread over them
            if where is None:
                raise CisError(f"{args.spec}: node {nid!r} has no address")
            clients[nid] = Client(where, timeout=args.timeout, curve=_curve(args), retry_after=retry)
        spread = infer_spread(
            clients, x, entries, args.window, args.rate, args.timeout, traceparent=args.traceparent,
            tracestate=args.tracestate,
        )  # fmt: skip
    finally:
        for c in clients.values():
            c.close()
    entry = [""] * len(x)
    for nid, idx in entries.items():
        for i in idx:
            entry[int(i)] = nid
    return spread, entry


def summary_lines(summary: dict, sent: int) -> list[str]:
    """The human summary: answered and errors (each code's count and the node's first message), accuracy,
    degraded and capped (where the transfer cap kept samples, and why runs differ), served shares, latency."""
    errors = "; ".join(f"{code} {n} ({summary['error_messages'].get(code, '')})"
                       for code, n in summary["errors"].items())
    lines = [f"{summary['samples_answered']} of {sent} samples answered; errors: {errors or 'none'}"
             + (f"; {summary['retried']} requests retried" if summary.get("retried") else "")]  # fmt: skip
    if "served_share_per_exit" not in summary:
        return lines
    lat = summary["latency"]
    acc = f"accuracy {summary['accuracy'] * 100:.2f}%   " if "accuracy" in summary else "no labels   "
    where = ", ".join(f"{k} {n}" for k, n in summary["capped_per_node"].items())
    lines.append(f"{acc}degraded {summary['degraded']}   capped {summary['capped']}" + (f" ({where})" if where else ""))
    if summary["capped"]:
        lines.append(
            f"capped: {summary['capped']} samples were answered where they were, not forwarded: the node's transfer "
            "cap (max_transfer_rate, a token bucket) was spent; it refills at the cap's rate, so runs straight after "
            "each other are capped differently (--rate under the cap, or cis serve --no-cap, avoids it)"
        )
    lines.append(
        "served per exit: " + ", ".join(f"exit {e} {s * 100:.1f}%" for e, s in summary["served_share_per_exit"].items())
    )
    lines.append(
        "served per node: " + ", ".join(f"{k} {s * 100:.1f}%" for k, s in summary["served_share_per_node"].items())
    )
    lines.append(
        f"latency ms: mean {format_ms(lat['mean_s'])}  p50 {format_ms(lat['p50_s'])}  p99 {format_ms(lat['p99_s'])}"
    )
    return lines


def read_dataset(args: argparse.Namespace):
    """The samples to send: arrays or images with the core install, built-in data sets with the 'train' extra.
    An npz without --bundle whose x is not float images takes the entry node's own inputs (its status reply)."""
    from cis.core.input_files import Inputs, is_input_source, load_inputs, needs_entry

    if is_input_source(args.dataset):
        from cis.core.bundle import load_bundle

        bundle = load_bundle(args.bundle) if args.bundle else None
        entry = _entry_inputs(args) if bundle is None and needs_entry(args.dataset) else None
        return load_inputs(args.dataset, bundle, entry)
    from cis.core.extras import require

    require("train", f"--dataset {args.dataset}")
    from cis.training.data.loading import load_dataset  # torch, scikit-learn, pillow: the 'train' extra

    data = getattr(load_dataset(args.dataset, seed=args.seed), args.split)
    return Inputs(data.x, data.y)


def _entry_inputs(args: argparse.Namespace):
    """Stage 1's input as the node that takes the requests says (its status reply's ``inputs``); None when it
    does not answer in time or has no such field (an older node)."""
    from cis.core.bundle import TensorInfo
    from cis.runtime.client import Client

    if args.connect is not None:
        address = args.connect.split(",")[0].strip()  # entry replicas serve one bundle: the first says
    else:
        from cis.core.spec import load_spec

        spec = load_spec(args.spec)
        where = spec.leaves[0].replica_addresses
        if not where:
            raise CisError(f"{args.spec}: node {spec.leaves[0].id!r} has no address")
        address = where[0]
    with Client(address, timeout=args.timeout, curve=_curve(args)) as c:
        try:
            inputs = c.status(min(args.timeout, 5.0)).get("inputs") or []
        except TimeoutError:
            return None
    entry = next((t for t in inputs if t.get("name") == "input"), None)
    return None if entry is None else TensorInfo.from_json(entry)


def _entry_node(args: argparse.Namespace, addresses: list[str]) -> str:
    """The node id that --out writes as every sample's entry: the one node all of --connect's addresses serve (a
    node's replicas share its id; an address that does not answer counts as itself). Addresses of different
    nodes are one line: the requests were spread over them, and which entered where is not recorded."""
    from cis.runtime.client import Client

    ids = []
    for address in addresses:
        with Client(address, timeout=2.0, curve=_curve(args)) as c:
            try:
                ids.append(str(c.status(2.0)["node"]))
            except TimeoutError:
                ids.append(address)
    if len(set(ids)) > 1:
        raise CisError(
            f"--connect {args.connect} --out: the addresses are nodes {', '.join(dict.fromkeys(ids))}; --out names "
            "each sample's entry node, so give one node's addresses (its replicas), or --spec SPEC to send each "
            "sample to its own entry node"
        )
    return ids[0]


def write_rows(path: str, results: Sequence, labels, names: list[str] | None, entry: list[str]) -> None:
    """One CSV row per sample, in sample order (requests of several samples are split); ``entry``: the node
    each sample was sent to; sent_s: seconds from the first request sent to this sample's; latency_s: to its
    reply (empty without one)."""
    import csv
    import math

    sent = [r.sent for r in results if r is not None and math.isfinite(r.sent)]
    start = min(sent) if sent else 0.0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sample", "file", "label", "class", "confidence", "exit", "node", "degraded", "capped", "error",
                    "entry", "sent_s", "latency_s"])
        i = 0
        for r in results:
            ok = r is not None and r.error is None
            err = "" if ok else ("timeout" if r is None else r.error.code)
            when = "" if r is None or not math.isfinite(r.sent) else f"{r.sent - start:.6f}"
            took = f"{r.latency:.6f}" if ok else ""
            for s in r.samples() if ok else [None] * (1 if r is None else len(r)):
                cells = (
                    [s["class"], f"{s['confidence']:.6g}", s["exit"], s["node"], int(s["degraded"]), int(s["capped"])]
                    if s
                    else [""] * 6
                )
                w.writerow([i, names[i] if names else "", "" if labels is None else int(labels[i]), *cells, err,
                            entry[i], when, took])
                i += 1
