"""A running testbed: the spec's nodes, each in its own network namespace behind shaped links.

:func:`start` is a sibling of :func:`cis.runtime.launcher.launch` (same
arguments, same supervision): it builds the network (:mod:`cis.runtime.testbed.net`),
then lets the launcher start the very same ``cis serve --node`` processes, each
prefixed by ``ip netns exec`` into its namespace. No node knows where it runs.

    with start(bundle, spec, faults=read_faults("faults.txt")) as bed:
        Client(bed.addresses["device0"]).infer(x)
        bed.link_down("edge0"); ...; bed.link_up("edge0")
        bed.set_bandwidth("device1", 250_000)      # bytes/s, both directions

Nodes the spec puts on one host (``host``, ``[hosts]`` with ``cores``) run on that
host's share of this machine's cores (``taskset``: :func:`cis.runtime.testbed.plan.core_sets`).

The network is removed on :meth:`Testbed.stop` (also on an error while
starting); what a killed testbed left behind is removed by the next
:func:`start` (namespaces are named ``cistb-RUN-I``, RUN the owner's pid).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from cis.core.errors import CisError
from cis.core.faults import Fault, check_faults
from cis.core.spec import CisSpec
from cis.core.spec import Node as SpecNode
from cis.runtime.launcher import Cluster, launch
from cis.runtime.testbed import net
from cis.runtime.testbed.plan import (
    DEFAULT_PORT,
    DEFAULT_SUBNET,
    NetPlan,
    core_sets,
    link_names,
    overlaps,
    plan_network,
)

log = logging.getLogger(__name__)


class Testbed:
    """The cluster of a testbed, its network plan and its fault schedule; what ``cis serve --all`` drives."""

    def __init__(
        self, plan: NetPlan, cluster: Cluster, faults: Sequence[Fault], netem: bool,
        cores: dict[str, list[int]] | None = None,
    ):
        self.plan, self.cluster, self.netem = plan, cluster, netem
        self.cores = cores or {}  # node -> the cores it is pinned to (its host's); absent: not pinned
        self.pending = sorted(faults, key=lambda f: f.at)
        self.started = time.monotonic()
        self.applied: list[dict] = []  # each fault applied: {at, action, node, value, t} (t: seconds from start)

    @property
    def addresses(self) -> dict[str, str]:
        return self.cluster.addresses

    @property
    def procs(self):
        return self.cluster.procs

    @property
    def metrics(self) -> dict[str, str]:
        return self.cluster.metrics

    @property
    def doors(self) -> dict[str, dict[str, str]]:
        return self.cluster.doors

    @property
    def run(self) -> str:
        return self.plan.run

    def supervise(self, now: float | None = None) -> list[str]:
        """Apply the faults that are due, then the launcher's supervision (restarts)."""
        now = time.monotonic() if now is None else now
        while self.pending and now - self.started >= self.pending[0].at:
            fault = self.pending.pop(0)
            self.apply(fault)
        return self.cluster.supervise(now)

    def apply(self, fault: Fault) -> None:
        if fault.action == "bandwidth":
            assert fault.value is not None  # cis.core.faults: a bandwidth change carries its rate
            self.set_bandwidth(fault.node, fault.value)
        elif fault.action == "down":
            self.link_down(fault.node)
        else:
            self.link_up(fault.node)

    def _did(self, action: str, node: str, value: float | None = None) -> None:
        t = time.monotonic() - self.started
        self.applied.append({"action": action, "node": node, "value": value, "t": t})
        link = self.plan.links[self._links(node)[0]]
        what = f"bandwidth {value:g} bytes/s" if action == "bandwidth" else action
        log.info("testbed %s: %.2f s: link %s->%s %s", self.run, t, node, link.parent, what)

    def link_down(self, node: str) -> None:
        """Partition the link from ``node`` to its parent (both directions lose every packet); a node's replicas'
        links, and those to each replica of the parent, all of them (:func:`link_names`)."""
        for name in self._links(node):
            net.set_link(self.plan, name, up=False)
        self._did("down", node)

    def link_up(self, node: str) -> None:
        for name in self._links(node):
            net.set_link(self.plan, name, up=True)
        self._did("up", node)

    def set_bandwidth(self, node: str, bandwidth: float) -> None:
        """Bytes/s of both directions of the link from ``node`` to its parent."""
        for name in self._links(node):
            net.set_link(self.plan, name, bandwidth=bandwidth)
        self._did("bandwidth", node, bandwidth)

    def _links(self, node: str) -> list[str]:
        names = link_names(self.plan, node)
        if not names:
            raise CisError(
                f"testbed {self.run}: node {node!r} has no link to a parent; expected one of "
                f"{', '.join(self.plan.links)}"
            )
        return names

    def describe(self, node: str | None = None) -> dict:
        """What ``--json`` adds: per node its namespace and uplink; for None, the testbed itself."""
        if node is None:
            return {"testbed": {"run": self.run, "subnet": self.plan.subnet, "latency_emulated": self.netem,
                                "burst_bytes": net.BURST}}
        names = link_names(self.plan, node)
        link = self.plan.links[names[0]] if names else None  # a parent's replicas: its links are alike
        uplink = None
        if link is not None:
            uplink = {"bandwidth": link.bandwidth, "latency": link.latency if self.netem else 0.0}
        return {"namespace": self.plan.nodes[node].namespace, "link": uplink, "cores": self.cores.get(node)}

    def stop(self, grace: float = 15.0) -> dict[str, int | None]:
        """Stop every node, then remove the network."""
        try:
            return self.cluster.stop(grace)
        finally:
            net.teardown(self.plan)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(
    bundle: str | Path,
    spec: CisSpec,
    spec_file: str | None = None,
    free_ports: bool = False,
    extra_args: Sequence[str] = (),
    node_args: dict[str, Sequence[str]] | None = None,
    *,
    faults: Sequence[Fault] = (),
    subnet: str = DEFAULT_SUBNET,
    port: int = DEFAULT_PORT,
    node_prefix: dict[str, Sequence[str]] | None = None,
    **launch_options,
) -> Testbed:
    """Build the network for ``spec`` and start its nodes in it; the arguments are :func:`launch`'s
    (``free_ports`` is ignored: every node listens on ``port`` at its own address), plus the fault
    schedule, the subnet the addresses come from, and a command prefix per node inside its namespace
    (e.g. ``taskset -c 1``)."""
    net.require_tools()
    for name in net.remove_stale():
        log.warning("removed testbed %s, left behind by a testbed that was killed", name)
    check_faults(tuple(faults), spec, "--faults")
    run = str(os.getpid())
    if run in net.running():
        raise CisError(f"this process already runs testbed {run}; stop it before starting another")
    plan = plan_network(spec, run, subnet, port)
    cores = core_sets(spec, sorted(os.sched_getaffinity(0)))
    if cores and shutil.which("taskset") is None:
        raise CisError(f"spec {spec.name!r} has [hosts]: pinning their nodes needs the 'taskset' command "
                       "(util-linux), not found on PATH")
    clash = overlaps(plan, net.caller_routes())
    if clash:
        raise CisError(f"--subnet {plan.subnet} overlaps this machine's route to {clash}; pick another")
    netem = net.has_netem()
    if not netem:
        log.warning(
            "testbed %s: this kernel has no netem qdisc: links are shaped to the spec's bandwidth, but their latency "
            "is not emulated (0 s added)", run,
        )
    net.record(plan, {"spec": spec.name, "latency_emulated": netem})
    try:
        net.build(plan, netem)
        placed = spec.replace_nodes(_placed(n, plan) for n in spec.nodes)
        prefix: dict[str, Sequence[str]] = {
            rid: ["ip", "netns", "exec", plan.nodes[rid].namespace, *_pin(cores.get(rid)),
                  *(node_prefix or {}).get(rid, ())]
            for rid in plan.nodes
        }
        cluster = launch(bundle, placed, spec_file, False, extra_args, node_args, node_prefix=prefix, **launch_options)
    except BaseException:
        net.teardown(plan)
        raise
    log.info(
        "testbed %s: %d nodes in namespaces %s-%s-*, links shaped with tbf (burst %d bytes)%s",
        run, len(spec.nodes), "cistb", run, net.BURST, " and netem" if netem else "",
    )
    if cores:
        log.info("testbed %s: nodes pinned to their host's cores: %s", run,
                 ", ".join(f"{nid} {','.join(map(str, c))}" for nid, c in cores.items()))
    return Testbed(plan, cluster, faults, netem, cores)


def _placed(node: SpecNode, plan: NetPlan) -> SpecNode:
    """The node at its testbed address (each replica at its own host's: an addresses list)."""
    if node.replicas == 1:
        return replace(node, address=plan.nodes[node.id].address, addresses=None)
    return replace(node, address=None, addresses=tuple(plan.nodes[r].address for r in node.replica_ids))


def _pin(cores: list[int] | None) -> list[str]:
    """The command prefix that keeps a node on its host's cores (none for a node without a host)."""
    return [] if not cores else ["taskset", "-c", ",".join(map(str, cores))]
