"""``cis evaluate RUN_DIR``: per-exit and CIS accuracy of a trained run under any serving setting."""

from __future__ import annotations

import argparse

from cis.cli.main import print_result


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cis.core.spec import CONFIDENCE_MEASURES

    p = sub.add_parser("evaluate", help="evaluate a trained run under a CIS spec or serving setting")
    p.add_argument("run_dir", help="run directory written by 'cis train'")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--spec", help="CIS spec (TOML) to evaluate under (default: the run's spec)")
    g.add_argument("--serving", help="x-y-z: the run's topology under another serving setting")
    p.add_argument("--confidence", choices=CONFIDENCE_MEASURES, help="confidence measure (default: the spec's)")
    p.add_argument(
        "--allow-model-change", action="store_true",
        help="rebuild a user model whose file changed since the run (default: one line, exit 2)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.core.spec import load_spec
    from cis.core.topologies import apply_serving, parse_serving
    from cis.training.checkpoint import read_meta, run_spec
    from cis.training.evaluate import format_cis_report
    from cis.training.run import evaluate_run

    spec = None
    if args.spec is not None:
        spec = load_spec(args.spec)
    elif args.serving is not None:  # '' too: parse_serving refuses it
        base = run_spec(*read_meta(args.run_dir))
        spec = apply_serving(base, parse_serving(args.serving, base.num_exits))
    result = evaluate_run(args.run_dir, spec, args.confidence, args.allow_model_change, args.spec)
    round_ = f" (round {result['round']})" if result.get("round") is not None else ""
    human = f"{args.run_dir}{round_} under {result['spec']}" + (
        f" serving {args.serving}" if args.serving else ""
    )
    print_result(args, result, human + "\n" + format_cis_report(result))
    return 0
