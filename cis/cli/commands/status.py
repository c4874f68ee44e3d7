"""``cis status --spec SPEC`` (or ``--connect ADDR``, or ``--cluster LOG_DIR``): each live node's counters.

A node with replicas is one row per replica (``cloud#0``, ``cloud#1``: :mod:`cis.core.replicas`); a row of a
node whose parent has replicas says how many of them are up (``parents up 2/3``).

With ``--cluster`` the nodes are those a ``cis serve --all --log-dir LOG_DIR``
started (``LOG_DIR/cluster.json``), and the launcher's view is shown beside each
node's own: whether it is up or down, its pid, how often it was restarted, its
last exit status.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cis.cli.main import print_result, seconds
from cis.core.errors import CisError
from cis.core.records import format_ms


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show the counters of live nodes (and restarts / down nodes of 'serve --all')")
    p.add_argument("--spec", help="spec file: ask every node at its address")
    p.add_argument("--connect", action="append", help="a node address (repeatable, or ADDR,ADDR,...)")
    p.add_argument(
        "--cluster", help="the --log-dir of 'cis serve --all' (or its cluster.json): its nodes and their restarts"
    )
    p.add_argument("--timeout", type=seconds, default=1.0, help="seconds to wait for each node (default 1)")
    p.add_argument("--curve-key", help="own CurveZMQ .key_secret, for nodes that run CurveZMQ")
    p.add_argument("--server-key", help="the nodes' public .key")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def read_cluster(path: str) -> dict:
    """The state a ``cis serve --all --log-dir DIR`` writes, from DIR or its cluster.json (status and rollout take
    either), checked: ``nodes`` maps each node id to a dict with its ``address``."""
    from cis.runtime.launcher import CLUSTER_FILE

    f = Path(path)
    if f.is_dir():
        f = f / CLUSTER_FILE
    if not f.is_file():
        raise CisError(
            f"{f}: not found; expected the {CLUSTER_FILE} that 'cis serve --all --log-dir DIR' writes in DIR"
        )
    try:
        state = json.loads(f.read_text())
        for value in state["nodes"].values():
            value["address"]  # noqa: B018 (each node has one: a missing key is a KeyError, below)
        return state
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CisError(f"{f}: not a cluster state file ({type(exc).__name__}: {exc})") from None


def _cluster(path: str) -> dict[str, dict]:
    return {nid: dict(v) for nid, v in read_cluster(path)["nodes"].items() if isinstance(v["address"], str)}


def run(args: argparse.Namespace) -> int:
    from cis.runtime.client import Client, ServerError
    from cis.runtime.security import CurveConfig

    if args.server_key and not args.curve_key:
        raise CisError("status: --server-key goes with --curve-key (CurveZMQ needs this client's own key too)")
    curve = CurveConfig(args.curve_key, None, args.server_key) if args.curve_key else None
    targets: dict[str, str] = {}
    launcher: dict[str, dict] = {}
    if args.spec:
        from cis.core.spec import load_spec

        spec = load_spec(args.spec)
        for n in spec.nodes:
            if n.replica_addresses is None:
                raise CisError(f"{args.spec}: node {n.id!r} has no address; expected one to query")
            targets.update(zip(n.replica_ids, n.replica_addresses))  # each replica of a node with replicas
    if args.cluster:
        launcher = _cluster(args.cluster)
        targets.update({nid: v["address"] for nid, v in launcher.items()})
    for a in (part.strip() for given in args.connect or [] for part in given.split(",")):
        targets[a] = a
    if not targets:
        raise CisError("status: nothing to ask; pass --spec SPEC, --cluster LOG_DIR or --connect ADDR")
    result: dict[str, dict] = {}
    for key, addr in targets.items():
        with Client(addr, curve=curve) as c:
            try:
                result[key] = {"address": addr, "live": True, **c.status(args.timeout)}
            except TimeoutError:
                result[key] = {"address": addr, "live": False}
            except ServerError as exc:  # a node that answers with an error (another version): its row says so
                result[key] = {"address": addr, "live": False, "error": " ".join(str(exc).split())}
        if key in launcher:
            result[key]["launcher"] = {
                k: launcher[key].get(k) for k in ("state", "pid", "restarts", "last_exit", "log")
            }
    print_result(args, {"nodes": result}, _table(result))
    return 0 if all(s["live"] for s in result.values()) else 1


def _table(result: dict[str, dict]) -> str:
    cols = ("served", "forwarded", "degraded", "capped", "errors", "overloaded", "queue_depth", "restarts")
    lines = [
        f"{'node':<12}{'live':>5}"
        + "".join(f"{c.replace('_depth', ''):>11}" for c in cols)
        + f"{'p50 ms':>9}{'p99 ms':>9}  threshold"
    ]
    for key, st in result.items():
        sup = st.get("launcher")
        if not st["live"]:
            seen = (
                f"; launcher: {sup['state']}, pid {sup['pid']}, restarts {sup['restarts']}, "
                f"last exit {'-' if sup['last_exit'] is None else sup['last_exit']}"
                if sup
                else ""
            )
            addr = st["address"]
            answer = f"error from {addr}: {st['error']}" if "error" in st else f"no answer from {addr}"
            lines.append(f"{key:<12}{'no':>5}  ({answer}{seen})")
            continue
        lat = st.get("latency") or {}
        lines.append(
            f"{key:<12}{'yes':>5}"
            + "".join(f"{st.get(c, 0):>11}" for c in cols)
            + f"{format_ms(lat.get('p50_s')):>9}{format_ms(lat.get('p99_s')):>9}  {_threshold(st.get('threshold'))}"
            + (f"  adapt {st['adapt']['threshold']:.4f}" if st.get("adapt") else "")
            + _parents(st.get("parents") or [])
        )
    return "\n".join(lines)


def _parents(parents: list[dict]) -> str:
    """How many replicas of the parent are up, and which are down (nothing for a parent of one replica)."""
    if len(parents) < 2:
        return ""
    down = [p["replica"] for p in parents if not p["up"]]
    return f"  parents up {len(parents) - len(down)}/{len(parents)}" + (f" (down: {', '.join(down)})" if down else "")


def _threshold(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
