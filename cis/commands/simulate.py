"""``cis simulate``: replay a CIS spec's load in the SimPy simulator (see docs/simulator.md).

One run prints a summary (per node, exit and link) and with ``--out DIR``
writes result.json, requests.csv, nodes.csv and plots; ``--sweep
arrival_rate=LIST`` runs several loads in parallel and prints a capacity table.
The simulator (package ``sim``) is imported here, inside ``run``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cis.cli import print_result
from cis.errors import CisError
from cis.spec import PROVIDERS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a CIS under load (SimPy)")
    p.add_argument("--spec", required=True, help="spec file (TOML)")
    p.add_argument(
        "--bundle", help="bundle folder: service times, payloads, confidences and thresholds from its profiles"
    )
    stop = p.add_mutually_exclusive_group(required=True)
    stop.add_argument("--requests", type=int, help="stop arrivals after N requests (over all nodes)")
    stop.add_argument("--duration", type=float, help="stop arrivals after T simulated seconds")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same result")
    p.add_argument("--arrivals", default="poisson", help="poisson (default), deterministic, mmpp, or trace:FILE")
    p.add_argument("--mmpp-ratio", type=float, default=4.0, help="mmpp: busy-state rate / quiet-state rate (default 4)")
    p.add_argument("--mmpp-dwell", type=float, default=1.0, help="mmpp: mean seconds in each state (default 1)")
    p.add_argument(
        "--service",
        choices=["exponential", "deterministic"],
        help="service time distribution (default: deterministic with a bundle, else exponential)",
    )
    p.add_argument(
        "--service-mean",
        type=float,
        default=0.005,
        help="without a bundle: mean seconds per stage at speed 1 (default 0.005)",
    )
    p.add_argument(
        "--payload-bytes",
        type=int,
        default=3072 * 4,
        help="without a bundle: bytes per forwarded request (default 12288)",
    )
    p.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="NODE=F",
        help="without a bundle: share of its requests NODE keeps (default f_i from the rate calculus); repeatable",
    )
    p.add_argument(
        "--burst",
        type=float,
        help="token bucket depth in seconds of each node's transfer cap (default: the exit policy's)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        help="with --bundle: every non-root node's threshold instead of the policy's, as cis serve --all --threshold "
        "(inf: every request goes to the root)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="calibrate thresholds on the bundle's profile instead of using its policy",
    )
    p.add_argument(
        "--loopback",
        action="store_true",
        help="every node on one machine: links add no latency and no bandwidth limit (see --visit-cost)",
    )
    p.add_argument(
        "--visit-cost",
        metavar="SECONDS|FILE",
        help="messaging cost per node visit: a number of seconds, or a file of them (one per line) to draw from, e.g. "
             "a calibration load's (docs/simulator.md)",
    )
    p.add_argument(
        "--provider",
        choices=PROVIDERS,
        help="with --bundle: every node's stage times from this backend's latency profile (cpu, cuda, tensorrt; "
        "auto is simulated as cpu), as cis serve --provider; default: each node's spec provider, else cpu",
    )
    p.add_argument(
        "--visit-overhead",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="node work per request beyond its stages, holding the node (the runtime's decode, admit, reply); "
        "default 0",
    )
    p.add_argument(
        "--latency-profile",
        metavar="FILE",
        help="stage times measured where the nodes run, instead of the bundle's: JSON "
        '{"stages": {STAGE: {BATCH: SECONDS}}, "idle_slowdown": [[IDLE_S, EXTRA_S], ...], "spread": [X, ...]} '
        "(idle_slowdown and spread optional)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        help="requests a node runs as one micro-batch (cis serve --max-batch); default 32 with --bundle, else 1",
    )
    p.add_argument(
        "--wire",
        choices=["payload", "tcp"],
        default="payload",
        help="what crosses a link: the carry alone, replies free (payload, default); or the runtime's messages in "
        "TCP/IPv4/Ethernet segments, replies too (tcp)",
    )
    p.add_argument(
        "--link-burst",
        type=float,
        default=0.0,
        metavar="BYTES",
        help="bytes a link sends at once after idling (tc tbf's burst; a cis testbed's is 1600); default 0",
    )
    p.add_argument(
        "--faults",
        metavar="FILE",
        help="link faults on a schedule, as cis testbed --faults: lines 'AT down|up NODE', 'AT bandwidth NODE "
        "BYTES_PER_S'",
    )
    p.add_argument(
        "--forward-timeout", type=float, default=1.0, help="seconds a forward waits per tier above (default 1)"
    )
    p.add_argument(
        "--heartbeat", type=float, default=0.2, help="seconds between heartbeats to the parent (default 0.2)"
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=1.0,
        help="a parent unheard for this long is down (default 1, as cis serve's default heartbeat gives)",
    )
    p.add_argument("--workers", type=int, help="workers at every node (default: the spec's, 1)")
    p.add_argument(
        "--queue-limit",
        type=int,
        help="waiting requests allowed at every node; more are dropped (default: the spec's, unbounded)",
    )
    p.add_argument(
        "--sweep",
        metavar="arrival_rate=LIST|LO:HI",
        help="run several loads (factors on every arrival rate) in parallel; LO:HI searches with --slo-p99",
    )
    p.add_argument(
        "--slo-p99",
        type=float,
        metavar="MS",
        help="with --sweep: report the largest load whose p99 latency (drops as misses) is within MS",
    )
    p.add_argument("--jobs", type=int, help="with --sweep: parallel processes (default: one per core)")
    p.add_argument("--out", help="folder for result files and plots")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def parse_shares(items: list[str]) -> dict[str, float]:
    shares = {}
    for item in items:
        node, _, value = item.partition("=")
        try:
            shares[node.strip()] = float(value)
        except ValueError:
            raise CisError(f"--share {item!r}: expected NODE=FRACTION, such as device0=0.6") from None
    return shares


def parse_visit_cost(value: str | None) -> tuple[float, ...]:
    """``--visit-cost``: seconds, or a file with one number of seconds per line ('#' comments)."""
    if value is None:
        return ()
    try:
        return (float(value),)
    except ValueError:
        pass
    path = Path(value)
    if not path.is_file():
        raise CisError(
            f"--visit-cost {value!r}: not a number of seconds and not a file; expected e.g. 0.0008 or costs.txt"
        )
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append(float(line))
        except ValueError:
            raise CisError(
                f"{path}:{n}: {line!r} is not a number; expected seconds per node visit, one per line"
            ) from None
    if not out:
        raise CisError(f"{path}: no numbers; expected seconds per node visit, one per line")
    return tuple(out)


def read_latency_profile(path: str | None) -> dict:
    """``--latency-profile FILE`` as SimConfig fields: ``latency_profile``, ``idle_slowdown``, ``service_spread``."""
    if path is None:
        return {}
    import json

    try:
        data = json.loads(Path(path).read_text())
        stages = {int(k): {int(b): float(t) for b, t in v.items()} for k, v in data["stages"].items()}
        slowdown = tuple((float(g), float(f)) for g, f in data.get("idle_slowdown", []))
        spread = tuple(float(v) for v in data.get("spread", []))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CisError(
            f"--latency-profile {path}: cannot read ({exc.__class__.__name__}: {exc}); expected JSON "
            '{"stages": {STAGE: {BATCH: SECONDS}}, "idle_slowdown": [[IDLE_S, EXTRA_S], ...], "spread": [X, ...]}'
        ) from None
    return {"latency_profile": stages, "idle_slowdown": slowdown, "service_spread": spread}


def run(args: argparse.Namespace) -> int:
    from cis.bundle import load_bundle
    from cis.faults import read_faults
    from cis.spec import load_spec
    from sim.config import SimConfig, override_nodes
    from sim.output import write_outputs
    from sim.report import human_summary
    from sim.run import simulate
    from sim.sweep import capacity_table, parse_sweep, sweep, write_sweep

    spec = override_nodes(
        load_spec(args.spec), workers=args.workers, queue_limit=args.queue_limit, provider=args.provider
    )
    bundle = load_bundle(args.bundle) if args.bundle else None
    kind, _, trace = args.arrivals.partition(":")
    config = SimConfig(
        requests=args.requests,
        duration=args.duration,
        seed=args.seed,
        arrivals=kind,
        trace=trace or None,
        mmpp_ratio=args.mmpp_ratio,
        mmpp_dwell=args.mmpp_dwell,
        service=args.service,
        service_mean=args.service_mean,
        payload_bytes=args.payload_bytes,
        shares=parse_shares(args.share),
        burst=args.burst,
        calibrate=args.calibrate,
        threshold=args.threshold,
        loopback=args.loopback,
        hop_rtt=parse_visit_cost(args.visit_cost),
        visit_overhead=args.visit_overhead,
        max_batch=args.max_batch,
        wire=args.wire,
        link_burst=args.link_burst,
        faults=read_faults(args.faults) if args.faults else (),
        forward_timeout=args.forward_timeout,
        heartbeat=args.heartbeat,
        heartbeat_timeout=args.heartbeat_timeout,
        progress=True,
        **read_latency_profile(args.latency_profile),
    )
    if args.sweep:
        swept = sweep(spec, config, parse_sweep(args.sweep), args.bundle, args.slo_p99, args.jobs)
        if args.out:
            write_sweep(args.out, swept)
        print_result(args, swept, capacity_table(swept))
        return 0
    if args.slo_p99 is not None or args.jobs is not None:
        raise CisError("--slo-p99 and --jobs apply to --sweep; expected --sweep arrival_rate=LIST with them")
    result = simulate(spec, config, bundle)
    summary = result.summary
    notes = write_outputs(args.out, summary, result.requests) if args.out else []
    human = human_summary(summary) + "".join(f"\nnote: {n}" for n in notes)
    if args.out:
        human += f"\nwrote {args.out}/result.json, requests.csv, nodes.csv" + (
            "" if notes else ", latency_cdf.png, utilisation.png"
        )
    print_result(args, {**summary, "notes": notes}, human)
    return 0
