"""``cis link show|down|up|set``: look at or change the links of a running testbed (``cis testbed``).

    cis link show [--run RUN] [--json]
    cis link down NODE            # partition NODE's link to its parent (both directions)
    cis link up NODE
    cis link set NODE --bandwidth BYTES_PER_S

``--run`` names the testbed (its run id, printed at start); without it, the only
one running. See docs/testbed.md.
"""

from __future__ import annotations

import argparse

from cis.cli.main import print_result
from cis.core.errors import CisError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("link", help="show, partition, heal or reshape a link of a running testbed (root)")
    p.add_argument("action", choices=("show", "down", "up", "set"), help="show every link, or change one")
    p.add_argument("node", nargs="?", help="down/up/set: the node whose link to its parent changes")
    p.add_argument("--bandwidth", metavar="BYTES_PER_S", help="set: the link's new rate in bytes/s, both directions")
    p.add_argument("--run", help="the testbed's run id (default: the only testbed running)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _testbed(run_id: str | None) -> tuple[str, dict]:
    from cis.runtime.testbed import net

    live = net.running()
    if run_id is not None:
        if run_id not in live:
            raise CisError(f"link: no testbed {run_id!r} is running; running: {', '.join(live) or 'none'}")
        return run_id, live[run_id]
    if len(live) != 1:
        raise CisError(
            "link: no testbed is running (start one with cis testbed SPEC BUNDLE)" if not live else
            f"link: {len(live)} testbeds are running ({', '.join(live)}); expected --run RUN"
        )
    return next(iter(live.items()))


def _rate(bytes_per_s: float | None) -> str:
    return "unshaped" if bytes_per_s is None else f"{bytes_per_s:g} bytes/s"


def run(args: argparse.Namespace) -> int:
    from cis.core.faults import parse_bandwidth
    from cis.runtime.testbed import net
    from cis.runtime.testbed.plan import NetPlan, link_names

    net.require_tools()
    run_id, state = _testbed(args.run)
    plan = NetPlan.from_json(state["plan"])
    if args.action == "show":
        if args.node is not None:
            raise CisError("link show takes no NODE; expected 'cis link show [--run RUN]'")
        links = {name: {"parent": link.parent, **net.link_state(plan, name)} for name, link in plan.links.items()}
        human = "\n".join(
            f"{name}->{v['parent']}: {v['state']}, {_rate(v['up_bytes_per_s'])} up, {_rate(v['down_bytes_per_s'])} "
            "down"
            for name, v in links.items()
        )
        print_result(args, {"run": run_id, "links": links}, f"testbed {run_id}\n{human}")
        return 0
    names = link_names(plan, args.node) if args.node is not None else []
    if not names:
        raise CisError(
            f"link {args.action}: {'no NODE given' if args.node is None else f'node {args.node!r} has no link'}; "
            f"expected one of {', '.join(plan.links)}"
        )
    if args.action == "set" and args.bandwidth is None:
        raise CisError("link set: expected --bandwidth BYTES_PER_S")
    if args.action != "set" and args.bandwidth is not None:
        raise CisError(f"link {args.action}: --bandwidth goes with 'set'")
    for name in names:  # a node with replicas, or whose parent has: each of its links
        if args.action == "set":
            net.set_link(plan, name, bandwidth=parse_bandwidth(args.bandwidth, "link set --bandwidth"))
        else:
            net.set_link(plan, name, up=args.action == "up")
    now = {name: net.link_state(plan, name) for name in names}
    first, link = now[names[0]], plan.links[names[0]]
    print_result(
        args, {"run": run_id, "link": names[0], "parent": link.parent, **first,
               "links": {n: {"parent": plan.links[n].parent, **v} for n, v in now.items()}},
        "\n".join(f"testbed {run_id}: link {n}->{plan.links[n].parent} {v['state']}, {_rate(v['up_bytes_per_s'])}"
                  for n, v in now.items()),
    )
    return 0
