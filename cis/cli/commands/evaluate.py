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
    from cis.core.spec import load_spec, parse_spec
    from cis.core.topologies import apply_serving, parse_serving
    from cis.training.evaluate import format_cis_report
    from cis.training.run import evaluate_run

    spec = None
    if args.spec:
        spec = load_spec(args.spec)
    elif args.serving:
        import json
        from pathlib import Path

        from cis.core.errors import CisError

        meta_path = Path(args.run_dir) / "checkpoint.json"
        if not meta_path.is_file():
            raise CisError(f"{args.run_dir}: no checkpoint; expected checkpoint.json (written by 'cis train')")
        base = parse_spec(json.loads(meta_path.read_text())["spec"], str(meta_path))
        spec = apply_serving(base, parse_serving(args.serving, base.num_exits))
    result = evaluate_run(args.run_dir, spec, args.confidence, args.allow_model_change)
    human = f"{args.run_dir} (round {result['round']}) under {result['spec']}" + (
        f" serving {args.serving}" if args.serving else ""
    )
    print_result(args, result, human + "\n" + format_cis_report(result))
    return 0
