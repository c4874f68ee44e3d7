"""``cis simulate``: replay a CIS spec's load in the SimPy simulator (see docs/simulator.md).

One run prints a summary (per node, exit and link) and with ``--out DIR``
writes result.json, requests.csv, nodes.csv and plots; ``--sweep
arrival_rate=LIST`` runs several loads in parallel and prints a capacity table.
The simulator (package ``sim``) is imported here, inside ``run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from cis.cli.main import print_result
from cis.core.errors import CisError
from cis.core.paths import check_folder
from cis.core.spec import PROVIDERS, CisSpec


class Flag(NamedTuple):
    """One flag: ``kind`` is its type, a tuple of choices, or bool (a switch); then its help."""

    kind: Any
    help: str
    metavar: str | None = None

    def settings(self) -> dict[str, Any]:
        if self.kind is bool:
            return {"action": "store_true"}
        if isinstance(self.kind, tuple):
            return {"choices": self.kind}
        return {"type": self.kind, "metavar": self.metavar}


def config_flags() -> dict[str, Flag]:
    """The flags that set a SimConfig field of the same name (dashes for underscores); their defaults are
    SimConfig's, shown in the help where one exists."""
    from cis.sim.config import SERVICES, WIRES  # torch-free, and imported only when the parser is built

    return {
        "seed": Flag(int, "random seed; the same seed gives the same result"),
        "mmpp_ratio": Flag(float, "mmpp: busy-state rate / quiet-state rate"),
        "mmpp_dwell": Flag(float, "mmpp: mean seconds in each state"),
        "service": Flag(
            SERVICES, "service time distribution (default: deterministic with a bundle, else exponential)"
        ),
        "service_mean": Flag(float, "without a bundle: mean seconds per stage at speed 1"),
        "payload_bytes": Flag(int, "without a bundle: bytes per forwarded request"),
        "burst": Flag(float, "token bucket depth in seconds of each node's transfer cap (default: 10, the transfer "
                             "cap's; at least one request)"),
        "threshold": Flag(
            float, "with --bundle: every non-root node's threshold instead of the policy's, as cis serve --all "
            "--threshold (inf: every request goes to the root)",
        ),
        "calibrate": Flag(bool, "calibrate thresholds on the bundle's profile instead of using its policy"),
        "loopback": Flag(
            bool, "every node on one machine: links add no latency and no bandwidth limit (see --visit-cost)"
        ),
        "visit_overhead": Flag(
            float, "node work per request beyond its stages, holding the node (the runtime's decode, admit, reply)",
            "SECONDS",
        ),
        "spans": Flag(
            bool, "record each request's visit per node as spans (queue, compute, forward, request): their "
            "summary per node and kind in the result, and with --out the spans in DIR/spans.jsonl (the runtime's "
            "tracing format)",
        ),
        "max_batch": Flag(
            int, "requests a node runs as one micro-batch (cis serve --max-batch); default: cis serve's with --bundle, "
            "else 1",
        ),
        "wire": Flag(
            WIRES, "what crosses a link: the carry alone, replies free (payload); or the runtime's messages in "
            "TCP/IPv4/Ethernet segments, replies too (tcp)",
        ),
        "link_burst": Flag(
            float, "bytes a link sends at once after idling (tc tbf's burst; a cis testbed's is 1600)", "BYTES"
        ),
        "forward_timeout": Flag(float, "seconds a forward waits per tier above"),
        "heartbeat": Flag(float, "seconds between heartbeats to the parent"),
        "heartbeat_timeout": Flag(
            float, "a parent is down once a ping stays unanswered this long (default: cis serve's, max(1, 5 x "
            "--heartbeat))",
        ),
    }


# The other flags: what they set is parsed first (shares, visit costs, files) or is no part of one run.
OTHER_FLAGS: dict[str, dict[str, Any]] = {
    "share": {
        "action": "append",
        "default": [],
        "metavar": "NODE=F",
        "help": "without a bundle: share of its requests NODE keeps (default f_i from the rate calculus); repeatable",
    },
    "visit_cost": {
        "metavar": "SECONDS|FILE",
        "help": "messaging cost per node visit: a number of seconds, or a file of them (one per line) to draw from, "
        "e.g. a calibration load's (docs/simulator.md)",
    },
    "batch_overhead": {
        "action": "append",
        "default": [],
        "metavar": "[NODE=]SECONDS",
        "help": "node work per micro-batch beyond its stages, holding the node (a runtime batch's cost beyond its "
        "stage calls); SECONDS for every node, NODE=SECONDS for one (repeatable; default 0)",
    },
    "entry_cost": {
        "metavar": "SECONDS|FILE",
        "help": "the client's messaging with its entry node (request in, answer out), once per request, in place of "
        "the entry visit's --visit-cost: seconds, or a file of them to draw from (docs/simulator.md)",
    },
    "provider": {
        "choices": PROVIDERS,
        "help": "with --bundle: every node's stage times from this backend's latency profile (cpu, cuda, tensorrt; "
        "auto is simulated as cpu), as cis serve --provider; default: each node's spec provider, else cpu",
    },
    "latency_profile": {
        "metavar": "FILE",
        "help": "stage times measured where the nodes run, instead of the bundle's: JSON "
        '{"stages": {STAGE: {BATCH: SECONDS}}, "idle_slowdown": [[IDLE_S, EXTRA_S], ...], "spread": [X, ...], '
        '"batch_overhead": {NODE: SECONDS or [[IDLE_S, SECONDS], ...]}, "interference": X, "message_work": SECONDS} '
        "(all but stages optional)",
    },
    "faults": {
        "metavar": "FILE",
        "help": "link faults on a schedule, as cis testbed --faults: lines 'AT down|up NODE', 'AT bandwidth NODE "
        "BYTES_PER_S'",
    },
    "workers": {"type": int, "help": "workers at every node (default: the spec's, 1)"},
    "queue_limit": {
        "type": int,
        "help": "waiting requests allowed at every node; more are dropped (default: the spec's, unbounded)",
    },
    "sweep": {
        "metavar": "arrival_rate=LIST|LO:HI",
        "help": "run several loads (factors on every arrival rate) in parallel; LO:HI searches with --slo-p99",
    },
    "slo_p99": {
        "type": float,
        "metavar": "MS",
        "help": "with --sweep: report the largest load whose p99 latency (drops as misses) is within MS",
    },
    "jobs": {"type": int, "help": "with --sweep: parallel processes (default: one per core)"},
    "out": {"help": "folder for result files and plots"},
    "json": {"action": "store_true", "help": "machine-readable output"},
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cis.sim.config import SimConfig  # torch-free: its field defaults are the flags' defaults

    defaults = {f.name: f.default for f in dataclasses.fields(SimConfig)}
    p = sub.add_parser("simulate", help="simulate a CIS under load (SimPy)")
    p.add_argument("--spec", required=True, help="spec file (TOML)")
    p.add_argument(
        "--bundle", help="bundle folder: service times, payloads, confidences and thresholds from its profiles"
    )
    stop = p.add_mutually_exclusive_group(required=True)
    stop.add_argument("--requests", type=int, help="stop arrivals after N requests (over all nodes)")
    stop.add_argument("--duration", type=float, help="stop arrivals after T simulated seconds")
    for name, flag in config_flags().items():
        default = defaults[name]
        shown = "" if default is None or isinstance(default, bool) else f" (default {_show(default)})"
        p.add_argument(_flag(name), default=default, help=flag.help + shown, **flag.settings())
    p.add_argument(
        "--arrivals", default=defaults["arrivals"], help="poisson (default), deterministic, mmpp, or trace:FILE"
    )
    for name, settings in OTHER_FLAGS.items():
        p.add_argument(_flag(name), **settings)
    p.set_defaults(func=run)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_shares(items: list[str]) -> dict[str, float]:
    shares = {}
    for item in items:
        node, _, value = item.partition("=")
        try:
            shares[node.strip()] = float(value)
        except ValueError:
            raise CisError(f"--share {item!r}: expected NODE=FRACTION, such as device0=0.6") from None
    return shares


def parse_batch_overhead(items: list[str]) -> dict[str, float]:
    """``--batch-overhead``: ``SECONDS`` (every node: key ``*``) or ``NODE=SECONDS``, repeatable."""
    out = {}
    for item in items:
        node, sep, value = item.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            raise CisError(
                f"--batch-overhead {item!r}: expected SECONDS or NODE=SECONDS, such as 0.001 or cloud=0.001"
            ) from None
        out[node.strip() if sep else "*"] = seconds
    return out


def parse_visit_cost(value: str | None, flag: str = "--visit-cost") -> tuple[float, ...]:
    """``--visit-cost`` (or ``--entry-cost``): seconds, or a file with one number of seconds per line ('#'
    comments)."""
    if value is None:
        return ()
    try:
        return (float(value),)
    except ValueError:
        pass
    path = Path(value)
    if not path.is_file():
        raise CisError(
            f"{flag} {value!r}: not a number of seconds and not a file; expected e.g. 0.0008 or costs.txt"
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


def _number(value: object) -> float:
    """A JSON number as a float; a TypeError for anything else (``true`` is no number of seconds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{json.dumps(value)} is not a number")
    return float(value)


PROFILE_KEYS = ("stages", "idle_slowdown", "spread", "batch_overhead", "interference", "message_work")
"""The keys of a ``--latency-profile`` file (docs/simulator.md); any other is refused."""


def read_latency_profile(path: str | None) -> dict:
    """``--latency-profile FILE`` as SimConfig fields: ``latency_profile``, ``idle_slowdown``, ``service_spread``,
    ``interference``, ``message_work``, ``batch_overhead``."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        unknown = sorted(set(data) - set(PROFILE_KEYS))
        if unknown:
            raise CisError(f"--latency-profile {path}: unknown key {unknown[0]!r}; expected some of "
                           f"{', '.join(PROFILE_KEYS)} (stages required)")
        stages = {int(k): {int(b): _number(t) for b, t in v.items()} for k, v in data["stages"].items()}
        slowdown = tuple((_number(g), _number(f)) for g, f in data.get("idle_slowdown", []))
        spread = tuple(_number(v) for v in data.get("spread", []))
        work = {str(k): _number(v) if isinstance(v, (int, float)) else tuple((_number(g), _number(w)) for g, w in v)
                for k, v in data.get("batch_overhead", {}).items()}
        interference = _number(data.get("interference", 0.0))
        message_work = _number(data.get("message_work", 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CisError(
            f"--latency-profile {path}: cannot read ({exc.__class__.__name__}: {exc}); expected JSON "
            '{"stages": {STAGE: {BATCH: SECONDS}}, "idle_slowdown": [[IDLE_S, EXTRA_S], ...], "spread": [X, ...], '
            '"batch_overhead": {NODE: SECONDS or [[IDLE_S, SECONDS], ...]}, "interference": X, '
            '"message_work": SECONDS}'
        ) from None
    out = {"latency_profile": stages, "idle_slowdown": slowdown, "service_spread": spread,
           "interference": interference, "message_work": message_work}
    return out | ({"batch_overhead": work} if work else {})


def check_latency_profile(measured: dict, path: str, spec: CisSpec) -> None:
    """A one-line :class:`CisError`, naming the file, for a stage or a node that ``spec`` does not have."""
    from cis.sim.config import check_batch_overhead

    beyond = sorted(k for k in measured["latency_profile"] if not 1 <= k <= spec.num_exits)
    if beyond:
        raise CisError(f"--latency-profile {path}: \"stages\" has stage {beyond[0]}; expected stages 1.."
                       f"{spec.num_exits} (spec {spec.name!r} has {spec.num_exits} exits)")
    _check_stage_times(measured["latency_profile"], path, spec.num_exits)
    _check_profile_costs(measured, path)
    check_batch_overhead(measured.get("batch_overhead", {}), spec, f"--latency-profile {path}: batch_overhead")


def _check_stage_times(stages: dict, path: str, num_exits: int) -> None:
    """Every stage 1..E with a batch-1 time, every batch size >= 1 and every time seconds >= 0, else one line
    naming the file, the stage and the batch."""
    for stage in range(1, num_exits + 1):
        points = stages.get(stage, {})
        bad = [(b, t) for b, t in sorted(points.items()) if b < 1 or not (math.isfinite(t) and t >= 0)]
        if bad and bad[0][0] < 1:
            raise CisError(f"simulate: --latency-profile: stage {stage} has batch {bad[0][0]} in {path}; expected "
                           "batch sizes >= 1")
        if bad or 1 not in points:
            b, t = bad[0] if bad else (1, None)
            raise CisError(f"simulate: --latency-profile: stage {stage} has batch-{b} time {t!r} in {path}; "
                           f"expected seconds >= 0 for every stage 1..{num_exits} and batch size (batch 1 required)")


def _check_profile_costs(measured: dict, path: str) -> None:
    """idle_slowdown, spread, interference and message_work of the file: one line naming the file."""
    where = f"--latency-profile {path}"
    for name in ("interference", "message_work"):
        value = measured[name]
        if not (math.isfinite(value) and value >= 0):
            raise CisError(f"{where}: {name} is {value}; expected "
                           f"{'seconds' if name == 'message_work' else 'a number'} >= 0")
    for point in measured["idle_slowdown"]:
        if len(point) != 2 or not all(math.isfinite(v) and v >= 0 for v in point):
            raise CisError(f"{where}: idle_slowdown point {list(point)}; expected [idle seconds >= 0, extra "
                           "seconds >= 0]")
    for value in measured["service_spread"]:
        if not (math.isfinite(value) and value > 0):
            raise CisError(f"{where}: spread has {value}; expected multipliers > 0 (each call's time over the mean)")


def run(args: argparse.Namespace) -> int:
    from cis.core.bundle import load_bundle
    from cis.core.faults import read_faults
    from cis.core.spec import load_spec
    from cis.sim.config import SimConfig, override_nodes
    from cis.sim.output import write_outputs
    from cis.sim.simulation import simulate
    from cis.sim.summary import human_summary
    from cis.sim.sweep import capacity_table, parse_sweep, sweep, write_sweep

    if args.provider is not None and not args.bundle:
        raise CisError("simulate: --provider picks a bundle's latency profile; expected --bundle with it")
    if args.out is not None and not args.out.strip():
        raise CisError("simulate: --out is an empty path; expected a folder for result.json, requests.csv, ...")
    if args.out:
        check_folder(args.out, "--out")  # before the run: a long run or sweep is not lost to a bad path
    spec = override_nodes(
        load_spec(args.spec), workers=args.workers, queue_limit=args.queue_limit, provider=args.provider
    )
    bundle = load_bundle(args.bundle) if args.bundle else None
    kind, _, trace = args.arrivals.partition(":")
    measured = read_latency_profile(args.latency_profile)
    if measured:
        check_latency_profile(measured, args.latency_profile, spec)
    work = measured.pop("batch_overhead", {}) | parse_batch_overhead(args.batch_overhead)  # the flag wins
    config = SimConfig(
        requests=args.requests,
        duration=args.duration,
        arrivals=kind,
        trace=trace or None,
        shares=parse_shares(args.share),
        hop_rtt=parse_visit_cost(args.visit_cost),
        entry_rtt=parse_visit_cost(args.entry_cost, "--entry-cost"),
        batch_overhead=work,
        faults=read_faults(args.faults) if args.faults else (),
        progress=True,
        **{name: getattr(args, name) for name in config_flags()},
        **measured,
    )
    if args.sweep:
        if args.spans:
            raise CisError("simulate: --spans records one run; expected no --sweep with it")
        swept = sweep(spec, config, parse_sweep(args.sweep), args.bundle, args.slo_p99, args.jobs)
        if args.out:
            write_sweep(args.out, swept)
        print_result(args, swept, capacity_table(swept))
        return 0
    if args.slo_p99 is not None or args.jobs is not None:
        raise CisError("--slo-p99 and --jobs apply to --sweep; expected --sweep arrival_rate=LIST with them")
    result = simulate(spec, config, bundle)
    summary = result.summary
    parents = {n.id: n.parent for n in spec.nodes}
    notes = write_outputs(args.out, summary, result.requests, result.spans, parents) if args.out else []
    human = human_summary(summary) + "".join(f"\nnote: {n}" for n in notes)
    if args.out:
        human += f"\nwrote {args.out}/result.json, requests.csv, nodes.csv" + (
            ", spans.jsonl" if result.spans is not None else ""
        ) + ("" if notes else ", latency_cdf.png, utilisation.png")
    print_result(args, {**summary, "notes": notes}, human)
    return 0
