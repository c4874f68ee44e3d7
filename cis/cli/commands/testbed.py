"""``cis testbed SPEC BUNDLE``: ``cis serve --all`` with every node in its own network namespace behind shaped links.

The node options are ``cis serve``'s own (copied from its parser, so both take
the same flags); the run is ``cis serve --all``'s, with :func:`cis.runtime.testbed.bed.start`
in place of the launcher's ``launch``. See docs/testbed.md.
"""

from __future__ import annotations

import argparse
import functools
import logging

# serve's options that a testbed sets itself: which nodes, where they listen, the spec (a positional here)
NOT_NODE_OPTIONS = {"help", "bundle", "node", "all", "bind", "parent", "free_ports", "spec", "restarts"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cis.runtime.testbed.plan import DEFAULT_PORT, DEFAULT_SUBNET

    p = sub.add_parser(
        "testbed",
        help="serve every node of a spec in its own network namespace behind links shaped as the spec says (root)",
        description="cis serve --all on an emulated network: each node in a namespace, the tree's links shaped "
        "in both directions to the spec's link.bandwidth (tc tbf), every node reachable from here. Takes cis "
        "serve's node options. Linux, root, iproute2.",
    )
    p.add_argument("spec", help="spec file (TOML): the tree, its links' bandwidth and latency")
    p.add_argument("bundle", help="bundle folder written by 'cis export'")
    p.add_argument("--faults", metavar="FILE", help="link faults on a schedule: lines 'AT down|up NODE' or "
                   "'AT bandwidth NODE BYTES_PER_S' (seconds from when every node serves)")
    p.add_argument("--subnet", default=DEFAULT_SUBNET, help=f"IPv4 network for the nodes' links (default "
                   f"{DEFAULT_SUBNET}); must not overlap this machine's routes")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"every node's port at its own address "
                   f"(default {DEFAULT_PORT})")
    for action in _serve_node_actions():
        p._add_action(action)
    p.set_defaults(func=run)


def _serve_node_actions() -> list[argparse.Action]:
    """cis serve's options, less those a testbed sets itself: one definition of each node flag."""
    from cis.cli.commands import serve

    scratch = argparse.ArgumentParser(add_help=False).add_subparsers()
    serve.add_parser(scratch)
    parser = scratch.choices["serve"]
    return [a for a in parser._actions if a.dest not in NOT_NODE_OPTIONS]


def run(args: argparse.Namespace) -> int:
    from cis.cli.commands import serve
    from cis.cli.main import NEEDS
    from cis.core.extras import require
    from cis.core.faults import read_faults
    from cis.runtime.testbed import bed, net

    for extra in NEEDS["serve"]:  # the onnxruntime the nodes run on, checked as cis serve checks it: before any
        require(extra)  # namespace is made
    net.require_tools()  # before the bundle is read: one line where a testbed cannot run
    faults = read_faults(args.faults) if args.faults else ()
    args.all, args.node, args.bind, args.parent, args.free_ports, args.restarts = True, None, None, None, False, 0
    args.start_cluster = functools.partial(bed.start, faults=faults, subnet=args.subnet, port=args.port)
    if not logging.getLogger().handlers:  # what the testbed does (links, faults) goes to stderr
        logging.basicConfig(level=logging.INFO, format="cis testbed: %(message)s")
    return serve.run(args)
