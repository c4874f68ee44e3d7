"""``cis bench ADDR --rate R``: drive an open-loop load at a running CIS and report what it held.

The library half is :mod:`cis.runtime.loadgen` (:func:`cis.runtime.loadgen.run_load`): requests sent on a Poisson
(or evenly spaced) schedule whatever the replies; p50/p99 latency, the rate it held, errors by class; ``--out DIR``
writes requests.csv (:mod:`cis.core.records`' layout) and bench.json. docs/runtime.md, "Load: cis bench".
"""

from __future__ import annotations

import argparse
import math

from cis.cli.main import print_result, seed
from cis.core.errors import CisError
from cis.core.paths import check_folder
from cis.core.records import format_ms


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cis.runtime.loadgen import ARRIVALS, DEFAULT_DURATION, TRANSPORTS

    p = sub.add_parser("bench", help="drive an open-loop load (Poisson arrivals) at a running CIS: p50/p99, the "
                                     "rate it held, errors by class")  # fmt: skip
    p.add_argument("addresses", nargs="+", metavar="ADDR",
                   help="where requests go (several: round robin): tcp://HOST:PORT (zmq), http://HOST:PORT (http), "
                        "HOST:PORT (grpc)")  # fmt: skip
    p.add_argument("--rate", type=float, required=True, help="requests per second (one sample each)")
    p.add_argument("--arrivals", choices=ARRIVALS, default="poisson",
                   help="poisson (exponential gaps) or uniform (one every 1/rate s); default poisson")  # fmt: skip
    p.add_argument("--transport", choices=TRANSPORTS, default="zmq",
                   help="zmq (cis.Client), http or grpc (the Open Inference Protocol: cis serve --http-port / "
                        "--grpc-port); default zmq")  # fmt: skip
    size = p.add_mutually_exclusive_group()
    size.add_argument("--duration", type=float, help=f"seconds of arrivals (default {DEFAULT_DURATION:g})")
    size.add_argument("--requests", type=int, help="this many requests instead of --duration")
    p.add_argument("--data", help="samples to send (request i: sample i mod N): FILE.npz (array x, optional labels "
                                  "y) or an image folder, as cis infer reads them; default: random samples of the "
                                  "input the node says it takes")  # fmt: skip
    p.add_argument("--bundle", help="bundle whose normalisation and input size apply to --data images or arrays")
    p.add_argument("--model-name", help="http/grpc: the model's name (cis serve --model-name; default cis)")
    p.add_argument("--binary", action="store_true", help="http: inputs as raw bytes (Triton's binary extension)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a request counts as lost (default 10)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the Poisson arrivals and the random samples")
    p.add_argument("--curve-key", help="zmq: own CurveZMQ .key_secret")
    p.add_argument("--server-key", help="zmq: the node's public .key")
    p.add_argument("--out", help="folder: requests.csv (one row per request) and bench.json (the summary)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.runtime.loadgen import run_load

    if not 0 < args.timeout < math.inf:
        raise CisError(f"--timeout {args.timeout:g}: expected seconds > 0 and finite")
    _check_transport_flags(args)
    if args.out:
        check_folder(args.out, "--out")  # before the load: a run is not lost to a bad path
    x = labels = None
    if args.data:
        from cis.core.bundle import load_bundle
        from cis.core.input_files import load_inputs

        data = load_inputs(args.data, load_bundle(args.bundle) if args.bundle else None)
        x, labels = data.x, data.y
    options: dict = {"model": args.model_name or "cis", "binary": args.binary}
    if args.curve_key:
        from cis.runtime.security import CurveConfig

        options["curve"] = CurveConfig(args.curve_key, None, args.server_key)
    result = run_load(
        args.addresses, args.rate, arrivals=args.arrivals, transport=args.transport, duration=args.duration,
        requests=args.requests, x=x, labels=labels, timeout=args.timeout, seed=args.seed, **options,
    )  # fmt: skip
    summary = result.summary()
    if args.out:
        summary["out"] = result.write(args.out)
    print_result(args, summary, human(summary))
    return 0 if summary["answered"] else 1


def _check_transport_flags(args: argparse.Namespace) -> None:
    """A one-line :class:`CisError` for a flag that the chosen transport would not use."""
    if args.binary and args.transport != "http":
        raise CisError(f"--binary: HTTP inputs as raw bytes; expected --transport http with it, not {args.transport}")
    if args.model_name is not None and args.transport == "zmq":
        raise CisError("--model-name: the Open Inference Protocol's model; expected --transport http or grpc with it")
    for flag, value in (("--curve-key", args.curve_key), ("--server-key", args.server_key)):
        if value is not None and args.transport != "zmq":
            raise CisError(f"{flag}: CurveZMQ; expected --transport zmq with it, not {args.transport}")
    if args.server_key is not None and args.curve_key is None:
        raise CisError("--server-key: the node's public key for CurveZMQ; expected --curve-key (your secret key) "
                       "with it")


def human(s: dict) -> str:
    """The summary for people: the load, what it held, latency, errors."""
    lat = s["latency"]
    rate = lambda r: "-" if r is None else f"{r:.1f}/s"  # noqa: E731
    lines = [
        f"{s['requests']} requests to {', '.join(s['addresses'])} over {s['transport']}, {s['arrivals']} arrivals at "
        f"{s['rate']:g}/s for {s['duration_s']:.1f} s",
        ("sent 1 request (no rate over a single send)" if s["requests"] == 1 else f"sent {rate(s['sent_rate'])}")
        + f" (generator late by {format_ms(s['lag_p99_s'])} ms at p99); held "
        f"{rate(s['held_rate'])}: {s['answered']} answered; errors: "
        + (", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none"),
        f"latency ms: p50 {format_ms(lat['p50_s'])}  p99 {format_ms(lat['p99_s'])}  mean {format_ms(lat['mean_s'])}  "
        f"max {format_ms(lat['max_s'])}",
    ]
    if "accuracy" in s:
        lines.append(f"accuracy {s['accuracy'] * 100:.2f}% of the answered requests")
    if s["served_share_per_exit"]:
        lines.append("served per exit: " + ", ".join(f"exit {e} {v * 100:.1f}%"
                                                     for e, v in s["served_share_per_exit"].items()))  # fmt: skip
    if "out" in s:
        lines.append(f"wrote {s['out']['requests']} and {s['out']['summary']}")
    return "\n".join(lines)
