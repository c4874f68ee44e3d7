"""The kernel side of a testbed: namespaces, veth links, addresses, routes and tc shaping, through ``ip`` and ``tc``.

Every change goes through :func:`run`, which raises a one-line
:class:`~cis.core.errors.CisError` naming the command and the kernel's answer.
Shaping is a ``tbf`` qdisc on both ends of a tree link (so each direction
carries ``bandwidth`` bytes/s): rate, a burst of one Ethernet frame
(:data:`BURST` bytes, so a message's time on the link is its size over the
rate), and room for :data:`QUEUE_SECONDS` of traffic. Propagation latency needs
``netem``, which not every kernel has (:func:`has_netem`); where it exists it is
added under the tbf, otherwise the testbed says at start that latency is not emulated.
A partition takes the parent's end of the link down: both directions lose
every packet, and the child's end keeps its routes (it only loses carrier), so
the link heals by bringing that end up again.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

from cis.core.errors import CisError
from cis.runtime.testbed.plan import PREFIX, LinkNet, NetPlan

BURST = 1600  # bytes: one 1514-byte Ethernet frame fits; the sim's --link-burst for a testbed
QUEUE_SECONDS = 10.0  # tbf "latency": how long a packet may wait before tbf drops it
STATE_DIR = Path("/run/cis-testbed")  # RUN.json: the plan and the owner of each running testbed


def run(*args: str, check: bool = True) -> str:
    """Run one command; its stdout, or a one-line CisError with what the kernel said."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CisError(f"{' '.join(args)}: {exc}") from None
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise CisError(f"{' '.join(args)}: {why[0] if why else f'exit status {done.returncode}'}")
    return done.stdout


def require_tools() -> None:
    """Root, ``ip`` and ``tc``: without them a testbed cannot be made (one line says which is missing)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise CisError(
            f"needs the {' and '.join(repr(t) for t in missing)} command{'s' if len(missing) > 1 else ''} "
            "(iproute2), not found on PATH"
        )
    if os.geteuid() != 0:
        raise CisError("needs root (network namespaces, veth links and tc shaping); run it as root")


def has_netem() -> bool:
    """Whether this kernel has the netem qdisc (propagation delay): tried on a scratch namespace's loopback."""
    probe = f"{PREFIX}-probe-{os.getpid()}"
    run("ip", "netns", "add", probe)
    try:
        return (
            subprocess.run(
                ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], capture_output=True
            ).returncode
            == 0
        )
    finally:
        run("ip", "netns", "del", probe, check=False)


def caller_routes() -> list[str]:
    """Destinations of the caller's IPv4 routes in every table (to refuse a subnet that would clash with them): the
    main table's, and the local table's too, where loopback (127.0.0.0/8) and the machine's own addresses are."""
    return [r.get("dst", "") for r in json.loads(run("ip", "-j", "-4", "route", "show", "table", "all") or "[]")]


def shape(ns: str, dev: str, bandwidth: float, latency: float = 0.0, netem: bool = False, change: bool = False) -> None:
    """``bandwidth`` bytes/s out of ``dev`` (tbf; inf: no shaping); with netem, ``latency`` seconds more under it."""
    if math.isinf(bandwidth):
        run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        return
    rate = f"{max(8, round(bandwidth * 8))}bit"
    run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf", "rate", rate, "burst",
        str(BURST), "latency", f"{QUEUE_SECONDS:g}s")
    if netem and latency > 0 and not change:
        run("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:", "handle", "10:", "netem", "delay",
            f"{latency * 1000:.3f}ms")


def build(plan: NetPlan, netem: bool) -> None:
    """Make every namespace and link of ``plan`` (the caller tears down on failure: :func:`teardown`)."""
    for node in plan.nodes.values():
        run("ip", "netns", "add", node.namespace)
        run("ip", "-n", node.namespace, "link", "set", "lo", "up")
        run("ip", "link", "add", node.access_if, "type", "veth", "peer", "name", "acc", "netns", node.namespace)
        run("ip", "addr", "add", f"{node.caller_ip}/30", "dev", node.access_if)
        run("ip", "-n", node.namespace, "addr", "add", f"{node.node_ip}/30", "dev", "acc")
        run("ip", "link", "set", node.access_if, "up")
        run("ip", "-n", node.namespace, "link", "set", "acc", "up")
    for link in plan.links.values():
        child, parent = plan.nodes[link.child].namespace, plan.nodes[link.parent].namespace
        run("ip", "-n", child, "link", "add", link.child_if, "type", "veth", "peer", "name", link.parent_if,
            "netns", parent)
        run("ip", "-n", child, "addr", "add", f"{link.child_ip}/30", "dev", link.child_if)
        run("ip", "-n", parent, "addr", "add", f"{link.parent_ip}/30", "dev", link.parent_if)
        run("ip", "-n", child, "link", "set", link.child_if, "up")
        run("ip", "-n", parent, "link", "set", link.parent_if, "up")
        _route(plan, link)
        shape(child, link.child_if, link.bandwidth, link.latency, netem)
        shape(parent, link.parent_if, link.bandwidth, link.latency, netem)


def _route(plan: NetPlan, link: LinkNet) -> None:
    """The child reaches its parent's address through the shaped link."""
    parent_ip = plan.nodes[link.parent].node_ip
    run("ip", "-n", plan.nodes[link.child].namespace, "route", "replace", f"{parent_ip}/32", "via", link.parent_ip,
        "dev", link.child_if)


def set_link(plan: NetPlan, name: str, up: bool | None = None, bandwidth: float | None = None) -> None:
    """Partition (``up=False``) or heal the link ``name`` (a child's to its parent, or to one replica of it:
    NetPlan.links), or change its bandwidth."""
    link = plan.links[name]
    parent_ns = plan.nodes[link.parent].namespace
    if up is not None:
        run("ip", "-n", parent_ns, "link", "set", link.parent_if, "up" if up else "down")
        if up:
            _route(plan, link)
    if bandwidth is not None:
        shape(plan.nodes[link.child].namespace, link.child_if, bandwidth, change=True)
        shape(parent_ns, link.parent_if, bandwidth, change=True)


def link_state(plan: NetPlan, name: str) -> dict:
    """What the kernel says of link ``name`` now: up or down, and each direction's rate in bytes/s."""
    link = plan.links[name]
    parent_ns, child_ns = plan.nodes[link.parent].namespace, plan.nodes[link.child].namespace
    flags = json.loads(run("ip", "-j", "-n", parent_ns, "link", "show", "dev", link.parent_if))[0]["flags"]
    rates = [
        next((q["options"]["rate"] for q in json.loads(run("tc", "-j", "-n", ns, "qdisc", "show", "dev", dev))
              if q.get("kind") == "tbf"), None)
        for ns, dev in ((child_ns, link.child_if), (parent_ns, link.parent_if))
    ]
    # no tbf: unshaped (None)
    return {"state": "up" if "UP" in flags else "down", "up_bytes_per_s": rates[0], "down_bytes_per_s": rates[1]}


def teardown(plan: NetPlan) -> None:
    """Remove the plan's namespaces (their links and the caller's ends of the access links go with them)."""
    for node in plan.nodes.values():
        _remove_namespace(node.namespace)
        run("ip", "link", "del", node.access_if, check=False)
    (STATE_DIR / f"{plan.run}.json").unlink(missing_ok=True)


def _remove_namespace(ns: str) -> None:
    for pid in run("ip", "netns", "pids", ns, check=False).split():  # processes a killed run left inside
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    run("ip", "netns", "del", ns, check=False)


# ---------------------------------------------------------------- running testbeds, and stale ones


def _started(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), or None when it does not exist."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record(plan: NetPlan, extra: dict) -> None:
    """STATE_DIR/RUN.json: the plan and this process as its owner (what ``cis link`` reads)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    data = {"pid": os.getpid(), "started": _started(os.getpid()), "plan": plan.to_json(), **extra}
    tmp = STATE_DIR / f"{plan.run}.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(STATE_DIR / f"{plan.run}.json")


def _alive(state: dict) -> bool:
    return _started(int(state["pid"])) == state.get("started")


def running() -> dict[str, dict]:
    """Run id -> state of every testbed whose owner is alive."""
    out = {}
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(state):
            out[path.stem] = state
    return out


def remove_stale() -> list[str]:
    """Remove what testbeds whose owner died left behind (namespaces, their processes, state files); the names."""
    removed = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = None
        if state is None or not _alive(state):
            if state is not None:
                teardown(NetPlan.from_json(state["plan"]))
                removed.append(state["plan"]["run"])
            path.unlink(missing_ok=True)
    live = {str(s["pid"]) for s in running().values()}
    for ns in run("ip", "netns", "list").split("\n"):
        name = ns.split(" ")[0]
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == PREFIX and parts[1].isdigit() and parts[1] not in live:
            if not Path(f"/proc/{parts[1]}").exists():  # no state file: only a dead owner's are removed
                _remove_namespace(name)
                removed.append(name)
    return removed
