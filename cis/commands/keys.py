"""``cis keys DIR --name NAME``: make a CurveZMQ key pair (NAME.key public, NAME.key_secret secret)."""

from __future__ import annotations

import argparse

from cis.cli import print_result


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="make CurveZMQ key pairs for encrypted, authenticated serving")
    p.add_argument("folder", help="folder to write the keys into")
    p.add_argument("--name", action="append", help="key pair name (repeatable; default 'node')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.runtime.security import make_keys

    made = {}
    for name in args.name or ["node"]:
        public, secret = make_keys(args.folder, name)
        made[name] = {"public": str(public), "secret": str(secret)}
    lines = [f"{n}: public {v['public']}  secret {v['secret']}" for n, v in made.items()]
    lines.append("copy a peer's public .key into a node's --allow folder to authorise it; keep .key_secret files private")
    print_result(args, {"keys": made}, "\n".join(lines))
    return 0
