"""``cis spec new``: write a spec for a built-in topology and serving setting."""

from __future__ import annotations

import argparse

from cis.cli import print_result
from cis.spec import dumps_spec, spec_to_dict, write_spec
from cis.topologies import DEFAULT_TOTAL_RATE, TOPOLOGIES, make_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spec", help="make CIS spec files")
    specsub = p.add_subparsers(dest="spec_command", metavar="ACTION")
    specsub.required = True
    new = specsub.add_parser("new", help="write a spec for a built-in topology")
    new.add_argument("--topology", default="paper-7", choices=sorted(TOPOLOGIES))
    new.add_argument("--serving", default="80-15-5", help="share served at exits 1-2-3, e.g. 80-15-5")
    new.add_argument("--total-rate", type=float, default=DEFAULT_TOTAL_RATE, help="requests/s arriving over all leaves")
    new.add_argument("--classes", type=int, default=10)
    new.add_argument("-o", "--out", help="file to write (default: print to stdout)")
    new.add_argument("--json", action="store_true", help="print the spec as JSON")
    new.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = make_spec(args.topology, args.serving, args.total_rate, args.classes)
    if args.out:
        write_spec(spec, args.out)
        print_result(
            args,
            {"written": args.out, "spec": spec_to_dict(spec)},
            f"wrote {args.out} ({args.topology}, serving {args.serving})",
        )
    else:
        print_result(args, spec_to_dict(spec), dumps_spec(spec).rstrip())
    return 0
