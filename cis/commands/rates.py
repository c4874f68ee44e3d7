"""``cis rates SPEC``: transfer and serving rate per node, serving rate and share per exit."""

from __future__ import annotations

import argparse

from cis.cli import print_result
from cis.rates import compute_rates, rates_to_json
from cis.spec import load_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rates", help="compute the CIS rate calculus of a spec")
    p.add_argument("spec", help="spec file (TOML)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    rates = compute_rates(spec)
    result = rates_to_json(spec, rates)
    lines = [f"{'node':<12}{'exit':>5}{'arrival':>10}{'transfer':>10}{'serving':>10}"]
    for nid, r in result["nodes"].items():
        lines.append(f"{nid:<12}{r['exit']:>5}{r['arrival_rate']:>10.3f}{r['transfer_rate']:>10.3f}{r['serving_rate']:>10.3f}")
    lines.append("")
    lines.append(f"{'exit':<6}{'Lambda_e':>10}{'share':>9}")
    for e, r in result["exits"].items():
        lines.append(f"{e:<6}{r['serving_rate']:>10.3f}{r['share'] * 100:>8.1f}%")
    print_result(args, result, "\n".join(lines))
    return 0
