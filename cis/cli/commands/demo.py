"""``cis demo``: the whole pipeline on built-in defaults — train, export, serve, replay, simulate, report.

The orchestration is :func:`cis.cli.demo.pipeline.run_demo` (torch is imported inside it,
for the training and export phases only); the report is :mod:`cis.cli.reports.builder`, the
same writer as ``cis report``. See docs/demo.md.
"""

from __future__ import annotations

import argparse

from cis.cli.main import print_result, seed


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="the whole pipeline on built-in defaults: train, export, serve, replay, simulate, report"
    )
    p.add_argument("--out", default="cis-demo", help="folder for everything the demo writes (default cis-demo)")
    p.add_argument("--serving", default="60-30-10", help="x-y-z shares served at exits 1-2-3 (default 60-30-10)")
    p.add_argument("--topology", default="paper-7", help="built-in topology (default paper-7)")
    p.add_argument("--rounds", type=int, help="training rounds (default 12; 4 with --quick)")
    p.add_argument(
        "--rate",
        type=float,
        help="requests per second in total (default: the topology's, 100); arrival rates and transfer caps scale "
             "together",
    )
    p.add_argument(
        "--n",
        type=int,
        help="requests to replay (default: the whole test set; 200 with --quick; more cycles the test set)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of training, data split and entry assignment (default 0)")
    p.add_argument("--quick", action="store_true", help="reduced mode: fewer rounds and requests (for tests)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.cli.demo.pipeline import QUICK_N, run_demo
    from cis.cli.reports.render import text_summary

    n = args.n if args.n is not None else (QUICK_N if args.quick else None)
    settings = {k: getattr(args, k) for k in ("serving", "topology", "rounds", "rate", "quick", "seed")}
    report = run_demo(args.out, n=n, **settings)
    human = text_summary(report) + f"\nwrote {args.out}/report.md, report.json, plots/"
    print_result(args, report, human)
    return 0
