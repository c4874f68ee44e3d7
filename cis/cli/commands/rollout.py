"""``cis rollout NEW_BUNDLE --spec SPEC`` (or ``--cluster LOG_DIR``): a new bundle on every node, no downtime.

Checks the new bundle here first (sha256 of every file, ``--trust``'s signature), that every node answers
and that the bundle fits every node of the spec (with the node's ``--threshold``, from its status), then
loads it on every node (parents first), switches them (parents first) and drops the old bundle (children
first); a failed load or a node that does not come back rolls everything back, and so does Ctrl-C or
SIGTERM (exit 130, one line). The order and its guarantees: :mod:`cis.runtime.rollout`, docs/runtime.md,
*Updating a model*.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cis.cli.main import print_result, seconds
from cis.core.errors import CisError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rollout",
        help="put a new bundle on every node of a running tree without downtime",
        description="Load NEW_BUNDLE beside the served one on every node (parents first), switch every node to it "
        "between two batches (parents first), drop the old bundle (children first). A failed load or verification, "
        "or Ctrl-C, rolls back: every node serves as before. NEW_BUNDLE must be at the same path on every node's "
        "machine.",
    )
    p.add_argument("bundle", metavar="NEW_BUNDLE", help="the new bundle folder (written by 'cis export')")
    p.add_argument("--spec", help="the spec the nodes serve: the tree, and the nodes' addresses")
    p.add_argument(
        "--cluster",
        help="the --log-dir of 'cis serve --all' or 'cis testbed': the nodes' addresses (and the spec it serves); "
        "its restarted nodes then start with the new bundle",
    )
    p.add_argument("--trust", help="Ed25519 public key (PEM): refuse NEW_BUNDLE unless signed by it")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=120.0,
        help="seconds to wait for a node's answer, a load included, or for a restarted node (default 120)",
    )
    p.add_argument("--curve-key", help="own CurveZMQ .key_secret, for nodes that run CurveZMQ")
    p.add_argument("--server-key", help="the nodes' public .key")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from cis.cli.interrupt import sigterm_as_interrupt
    from cis.core.bundle import load_bundle
    from cis.runtime.rollout import Interrupted, Rollout, targets_of
    from cis.runtime.security import CurveConfig

    if args.server_key and not args.curve_key:
        raise CisError("rollout: --server-key goes with --curve-key (CurveZMQ needs this client's own key too)")
    try:
        bundle = load_bundle(Path(args.bundle).resolve(), trust=args.trust)  # every file's sha256, the signature
    except CisError as exc:
        raise CisError(f"{exc}; nothing was changed") from None
    spec, addresses = _tree(args)
    curve = CurveConfig(args.curve_key, None, args.server_key) if args.curve_key else None
    say = logging.getLogger("cis.cli.commands.rollout").info
    cluster = Path(args.cluster) if args.cluster else None  # LOG_DIR, or its cluster.json: rollout.json goes beside
    log_dir = None if cluster is None else str(cluster if cluster.is_dir() else cluster.parent)
    rollout = Rollout(bundle, targets_of(spec, addresses), args.timeout, curve, log_dir, say, spec)
    restore = sigterm_as_interrupt()  # a SIGTERM rolls back too, as Ctrl-C does
    try:
        report = rollout.run()  # checks that the bundle fits each node (its --threshold from its status) first
    except Interrupted as exc:  # rolled back, or what is left: said in one line
        print(f"cis rollout: {exc}", file=sys.stderr)
        return 130
    finally:
        restore()
        rollout.close()
    human = (
        f"bundle {report['bundle']} serves on {len(report['nodes'])} nodes ({report['outcome']}, "
        f"{report['seconds']:.1f} s; before: {', '.join(sorted(set(report['previous'].values())))})"
        + (f"; restarted meanwhile: {', '.join(report['restarted'])}" if report["restarted"] else "")
    )
    print_result(args, report, human)
    return 0


def _tree(args: argparse.Namespace):
    """(the spec, {process id: address}: a replica's id for a node with replicas): the spec from --spec, else the
    one the cluster serves; addresses from --cluster, else the spec's."""
    from cis.core.bundle import load_bundle
    from cis.core.spec import load_spec

    if not args.spec and not args.cluster:
        raise CisError("rollout: which nodes? pass --spec SPEC (their addresses) or --cluster LOG_DIR")
    state: dict = {}
    if args.cluster:
        from cis.cli.commands.status import read_cluster

        state = read_cluster(args.cluster)
        addresses = {nid: v["address"] for nid, v in state["nodes"].items()}
    if args.spec:
        spec = load_spec(args.spec)
    elif state.get("spec"):
        spec = load_spec(state["spec"])
    else:
        served = load_bundle(state["bundle"], verify=False).spec
        if served is None:
            raise CisError(f"{args.cluster}: the served bundle has no spec; pass --spec")
        spec = served
    if not args.cluster:
        from cis.runtime.rollout import spec_addresses

        addresses = spec_addresses(spec)
    return spec, addresses
