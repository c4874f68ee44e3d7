"""CPU and memory for each node's container, from the bundle's latency profile and the spec's rate calculus.

The rule (docs/deploy.md, *Resources*), per replica of node i:

- load(i) = lambda_a(i) x sum of t_k over stages 1..E_i  +  sum over children c of lambda_t(c) x sum of t_k over
  stages E_c+1..E_i, in cores: the requests the calculus sends to the node times the seconds its stages take per
  request (t_k: stage k's batch-1 time in the profile of the node's backend, divided by the node's ``speed``);
- CPU request = max(0.1, headroom x load(i) / replicas) cores (headroom 2 by default: a node kept under half busy
  keeps its queueing short); no CPU limit (a CFS quota throttles a node in the middle of a batch);
- memory request = 128 MiB (a node's Python, numpy, onnxruntime and ZeroMQ; one idles at about 80 MiB)
  + 3 x the bytes of its stage files (onnxruntime's copy of the weights and its arenas)
  + (max_batch + queue_limit) x the largest tensor per sample among its stages' inputs and outputs
  (a full queue and a batch in flight); memory limit = 2 x the request;
- a node whose provider (the spec's, or every node's with ``--set provider=``) is ``cuda`` or ``tensorrt`` asks for
  one ``nvidia.com/gpu``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cis.core.bundle import Bundle
from cis.core.errors import CisError
from cis.core.rates import compute_rates
from cis.core.spec import CisSpec, Node
from cis.runtime.node_config import node_default

MIN_CPU = 0.1  # cores: the poll loop, heartbeats and metrics of an idle node
BASE_MEMORY = 128 * 2**20  # bytes
WEIGHT_COPIES = 3
MEMORY_LIMIT_FACTOR = 2
GPU_PROVIDERS = ("cuda", "tensorrt")


@dataclass(frozen=True)
class Resources:
    """One replica's share: what its container requests."""

    load: float  # cores the whole node is expected to keep busy (all replicas together)
    cpu_millis: int  # per replica
    memory_mib: int  # request per replica
    memory_limit_mib: int
    gpus: int
    backend: str  # the latency profile the load comes from

    def to_json(self) -> dict:
        return {
            "load_cores": round(self.load, 6),
            "cpu": f"{self.cpu_millis}m",
            "memory": f"{self.memory_mib}Mi",
            "memory_limit": f"{self.memory_limit_mib}Mi",
            "gpus": self.gpus,
            "profile": self.backend,
        }


def node_resources(
    spec: CisSpec, bundle: Bundle, headroom: float, sets: Mapping[str, str]
) -> tuple[dict[str, Resources], list[str]]:
    """Every node's resources, and notes (a GPU node whose bundle has no profile of its backend). ``sets``:
    the serve options every node gets (``--set``), whose max_batch and queue_limit the memory rule takes."""
    from cis.sim.service import bundle_stage_profiles, node_backend  # the simulator's reading of the same profile

    rates = compute_rates(spec)
    profiles: dict[str, list[dict[int, float]]] = {"cpu": bundle_stage_profiles(bundle, spec.num_exits)}
    notes: list[str] = []
    out = {}
    for n in spec.nodes:
        if sets.get("provider"):  # --set provider: every node's, as its CIS_PROVIDER overrides the spec's
            n = replace(n, provider=sets["provider"])
        backend = node_backend(n)
        if backend not in profiles:
            try:
                profiles[backend] = bundle_stage_profiles(bundle, spec.num_exits, backend)
            except CisError:
                notes.append(
                    f"node {n.id!r} runs on {backend} but bundle {bundle.root} has no {backend} latency profile; its "
                    "CPU request comes from the cpu profile (an upper bound: the stages run on the GPU)"
                )
                backend = "cpu"
        seconds = [p[1] / n.speed for p in profiles[backend]]  # per request, batch 1, stage k at index k-1
        load = n.arrival_rate * sum(seconds[: n.exit]) + sum(
            rates.transfer_rate[c.id] * sum(seconds[c.exit : n.exit]) for c in spec.children(n.id)
        )
        cpu = max(MIN_CPU, headroom * load / n.replicas)
        memory = _memory(n, bundle, sets)
        out[n.id] = Resources(
            load=load,
            cpu_millis=math.ceil(cpu * 1000),
            memory_mib=math.ceil(memory / 2**20),
            memory_limit_mib=MEMORY_LIMIT_FACTOR * math.ceil(memory / 2**20),
            gpus=1 if n.provider in GPU_PROVIDERS else 0,
            backend=backend,
        )
    return out, notes


def _memory(node: Node, bundle: Bundle, sets: Mapping[str, str]) -> int:
    """Bytes: the base, the node's weights, and a full queue plus a batch of its largest tensor per sample."""
    stages = [bundle.stage(k) for k in range(1, node.exit + 1)]
    weights = sum(int(bundle.manifest["stages"][s.index - 1].get("bytes") or bundle.path(s.file).stat().st_size)
                  for s in stages)
    per_sample = max(t.bytes_per_sample() for s in stages for t in (*s.inputs, *s.outputs))
    queue = int(sets.get("queue_limit") or node.queue_limit or node_default("queue_limit"))
    batch = int(sets.get("max_batch") or node_default("max_batch"))
    return BASE_MEMORY + WEIGHT_COPIES * weights + (batch + queue) * per_sample
