"""``cis report PATH``: the report of a run dir, a bundle, a simulation folder or a demo folder.

One writer for all of them (:mod:`cis.cli.reports.builder`), the same one ``cis demo`` uses.
"""

from __future__ import annotations

import argparse

from cis.cli.main import print_result


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="report of a run dir, bundle, simulation or demo folder (markdown with plots)")
    p.add_argument(
        "path",
        help="run dir (cis train), bundle (cis export), simulation folder (cis simulate --out) or demo folder (cis "
             "demo)",
    )
    p.add_argument("--out", help="write the markdown report to FILE and its plots to plots/ beside it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.cli.reports.builder import build_report, write_report
    from cis.cli.reports.render import text_summary
    from cis.core.errors import CisError

    if args.out is not None and not args.out.strip():
        raise CisError("report: --out is an empty path; expected a file for the markdown report (e.g. report.md)")
    report = build_report(args.path)
    notes = write_report(report, args.out) if args.out else []
    human = text_summary(report) + "".join(f"\nnote: {n}" for n in notes)
    if args.out:
        human += f"\nwrote {args.out}" + ("" if notes else " and plots/")
    print_result(args, report, human)
    return 0
