"""``cis status --spec SPEC`` (or ``--connect ADDR``): each live node's counters."""

from __future__ import annotations

import argparse

from cis.cli import print_result
from cis.errors import CisError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show the counters of live nodes")
    p.add_argument("--spec", help="spec file: ask every node at its address")
    p.add_argument("--connect", action="append", help="a node address (repeatable)")
    p.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each node (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.2f}"


def run(args: argparse.Namespace) -> int:
    from cis.runtime.client import Client

    targets: dict[str, str] = {}
    if args.spec:
        from cis.spec import load_spec

        spec = load_spec(args.spec)
        for n in spec.nodes:
            if n.address is None:
                raise CisError(f"{args.spec}: node {n.id!r} has no address; expected one to query")
            targets[n.id] = n.address
    for a in args.connect or []:
        targets[a] = a
    if not targets:
        raise CisError("status: nothing to ask; pass --spec SPEC or --connect ADDR")
    result: dict[str, dict] = {}
    for key, addr in targets.items():
        with Client(addr) as c:
            try:
                result[key] = {"address": addr, "live": True, **c.status(args.timeout)}
            except TimeoutError:
                result[key] = {"address": addr, "live": False}
    cols = ("served", "forwarded", "degraded", "capped", "errors", "queue_depth")
    lines = [f"{'node':<12}{'live':>5}" + "".join(f"{c.replace('_depth', ''):>11}" for c in cols) + f"{'p50 ms':>9}{'p99 ms':>9}  threshold"]
    for key, st in result.items():
        if not st["live"]:
            lines.append(f"{key:<12}{'no':>5}  (no answer from {st['address']})")
            continue
        lines.append(
            f"{key:<12}{'yes':>5}" + "".join(f"{st.get(c, 0):>11}" for c in cols)
            + f"{_ms(st.get('latency_p50')):>9}{_ms(st.get('latency_p99')):>9}  {_threshold(st.get('threshold'))}"
            + (f"  adapt {st['adapt']['threshold']:.4f}" if st.get("adapt") else "")
        )
    print_result(args, {"nodes": result}, "\n".join(lines))
    return 0 if all(s["live"] for s in result.values()) else 1


def _threshold(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
