"""``cis rates SPEC``: the rate calculus of a spec; ``cis rates --measured SOURCE``: what a CIS measured beside it.

SOURCE is a spec (its live nodes), a ``cis serve --all`` log folder, a requests file or a saved
measurement (:mod:`cis.runtime.measure`); ``--connect ADDR`` asks live nodes by address instead.
"""

from __future__ import annotations

import argparse

from cis.cli.main import print_result, seconds
from cis.core.errors import CisError
from cis.core.rates import RATE_KEYS, compare_rates, compute_rates, rates_to_json
from cis.core.spec import load_spec

HELP = {
    "spec": "spec file (TOML): its calculus; with --measured or --connect the design to compare with (and the tree "
    "of a requests file)",
    "measured": "measure: a spec (its live nodes), a 'cis serve --all' log folder, a requests file (.csv) or a saved "
    "measurement (.json); see docs/closed-loop.md",
    "connect": "measure the live node at ADDR (repeatable): a ZeroMQ address (its status) or an "
    "http://HOST:PORT/metrics URL",
    "window": "live: two snapshots SECONDS apart (default: the counters since the nodes started); a requests file: "
    "its last SECONDS (default: all of it)",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rates", help="the CIS rate calculus of a spec, or the rates a running CIS measured beside it")
    p.add_argument("spec", nargs="?", help=HELP["spec"])
    p.add_argument("--measured", metavar="SOURCE", help=HELP["measured"])
    p.add_argument("--connect", action="append", metavar="ADDR", help=HELP["connect"])
    p.add_argument("--window", type=float, metavar="SECONDS", help=HELP["window"])
    p.add_argument("--timeout", type=seconds, default=1.0, help="live: seconds to wait for each node (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for flag, value in (("SPEC", args.spec), ("--measured", args.measured)):
        if value is not None and not value.strip():
            raise CisError(f"{flag} is empty ({value!r}); expected a path")
    spec = load_spec(args.spec) if args.spec else None
    if args.measured is None and not args.connect:
        if spec is None:
            raise CisError("rates: nothing to compute; pass SPEC, --measured SOURCE or --connect ADDR")
        return _calculus(args, spec)
    from cis.runtime.measure import design_of, measure

    m = measure(args.measured, spec, args.connect or (), args.window, args.timeout)
    design = (spec, args.spec) if spec is not None else design_of(args.measured)
    result = measured_json(m, *(design or (None, None)))
    print_result(args, result, _measured_text(result))
    return 0


def _calculus(args: argparse.Namespace, spec) -> int:
    result = rates_to_json(spec, compute_rates(spec))
    lines = [f"{'node':<12}{'exit':>5}{'arrival':>10}{'transfer':>10}{'serving':>10}"]
    for nid, r in result["nodes"].items():
        lines.append(f"{nid:<12}{r['exit']:>5}{r['arrival_rate']:>10.3f}{r['transfer_rate']:>10.3f}{r['serving_rate']:>10.3f}")
    lines.append("")
    lines.append(f"{'exit':<6}{'Lambda_e':>10}{'share':>9}")
    for e, r in result["exits"].items():
        lines.append(f"{e:<6}{r['serving_rate']:>10.3f}{r['share'] * 100:>8.1f}%")
    print_result(args, result, "\n".join(lines))
    return 0


def measured_json(m, design=None, design_label: str | None = None) -> dict:
    """The ``cis rates --measured --json`` result: the counts (a saved measurement), the measured rates and,
    given the design spec, its calculus and the difference."""
    out = m.to_json()
    rates = m.rates()
    shares = rates.exit_share
    compared = None
    if design is not None:
        m.check_tree(design, design_label or "the spec")
        compared = compare_rates(design, rates)
    out["design"] = design_label
    for i, row in out["nodes"].items():
        row.update(compared["nodes"][i] if compared else {"measured": {k: getattr(rates, k)[i] for k in RATE_KEYS}})
    out["exits"] = {}
    for e, r in rates.exit_serving_rate.items():
        served = sum(n.served_per_exit.get(e, 0) for n in m.nodes.values())
        row = {"served": served, "measured": {"serving_rate": r, "share": shares[e]}}
        if compared:
            row.update({k: compared["exits"][str(e)][k] for k in ("spec", "difference")})
        out["exits"][str(e)] = row
    return out


def _pair(row: dict, key: str) -> str:
    m = f"{row['measured'][key]:.3f}"
    return m + (f" ({row['spec'][key]:.3f})" if "spec" in row else "")


def _measured_text(result: dict) -> str:
    head = result["measurement"]
    compared = result["design"] is not None
    lines = [
        f"measured {head['source']} ({head['kind']}): {head['served']} samples served; {head['window']} "
        f"({head['seconds']:.3f} s)",
        f"rates in requests/s{', the spec in parentheses: ' + result['design'] if compared else ''}",
        "",
        f"{'node':<12}{'exit':>5}{'arrived':>9}{'forwarded':>10}{'served':>8}"
        f"{'arrival':>20}{'transfer':>20}{'serving':>20}",
    ]
    for nid, r in result["nodes"].items():
        lines.append(
            f"{nid:<12}{r['exit']:>5}{r['arrived']:>9}{r['forwarded']:>10}{r['served']:>8}"
            + "".join(f"{_pair(r, k):>20}" for k in RATE_KEYS)
        )
    diff_head = f"{'share diff':>12}" if compared else ""
    lines += ["", f"{'exit':<6}{'served':>8}{'Lambda_e':>20}{'share':>16}{diff_head}"]
    for e, r in result["exits"].items():
        share = f"{100 * r['measured']['share']:.1f}%" + (f" ({100 * r['spec']['share']:.1f}%)" if compared else "")
        diff = f"{100 * r['difference']['share']:>+11.1f}p" if compared else ""
        lines.append(f"{e:<6}{r['served']:>8}{_pair(r, 'serving_rate'):>20}{share:>16}{diff}")
    if not compared:
        lines.append("(no spec to compare with: pass it, cis rates SPEC --measured SOURCE)")
    return "\n".join(lines)
