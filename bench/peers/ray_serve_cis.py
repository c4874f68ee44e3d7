"""The same CIS in Ray Serve, as a Ray Serve user would write it: one deployment per tier, handles between tiers.

A cis bundle's tree (paper-7: four devices, two edges, a cloud) becomes three deployments, ``devices``
(one replica per device node), ``edges`` and ``cloud``, each running its tier's ONNX stages from the same
bundle with onnxruntime (:class:`cis.core.stages.runner.StageRunner`, one thread per session as ``cis serve``'s
default),
the same exit policy (:meth:`cis.core.policy.exit_policy.ExitPolicy.batch`, the one decision cis nodes make) and the
same
thresholds (the bundle's, or one ``threshold`` for every node below the root, as ``cis serve --threshold``).
A request names the node it enters at; its threshold is that node's. A sample the decision does not serve
goes to the parent tier's deployment through a :class:`ray.serve.handle.DeploymentHandle` with the carry
and the parent node's id, as a cis node forwards to its parent. Requests are micro-batched with
``@serve.batch`` (``max_batch_size``, ``batch_wait_timeout_s``), where a cis node batches (``--max-batch``,
``--max-wait``); access logs off and warnings only (:data:`QUIET`), replicas ``num_cpus=0`` and
``max_ongoing_requests`` twice the batch (Ray's default, 5, would cap a replica's batch at 5). Not modelled:
the transfer cap (run cis with ``--no-cap`` to compare), the patience rule, deadlines, degraded serving when
a tier is down.

Two ways in: the handle (``handle.infer.remote(node, x)``, the native path) and Ray Serve's HTTP ingress on
the devices deployment, which speaks the Open Inference Protocol's infer call in JSON
(``POST /v2/models/{entry node}/infer``), so tritonclient's HTTP client drives it as it drives cis's front
door, KServe and MLServer. ``GET /v2/health/ready`` answers 200.

As a program (what ``bench/peers/run.py`` starts; Ray's dashboard off, every replica ``num_cpus=0`` so
that seven replicas fit on a small machine)::

    python -m bench.peers.ray_serve_cis --bundle BUNDLE [--http-port 8000] [--threshold inf]
        [--max-batch-size 32] [--batch-wait-timeout-s 0]

prints one JSON line (``{"gcs_address": ..., "http": ..., "pid": ...}``) once the app runs, and serves until
SIGTERM or SIGINT. Another process reaches the handle with ``ray.init(address=GCS)`` and
``serve.get_app_handle("cis")``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence

import numpy as np

# Ray on one machine, on loopback only (as Ray runs on macOS and Windows): its GCS, raylet and agents bind
# and advertise 127.0.0.1 instead of the host's address. Read when ray is imported: set before.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray import serve  # noqa: E402

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.policy.exit_policy import ExitPolicy  # noqa: E402
from cis.core.stages.contract import INPUT, LOGITS, carry_of  # noqa: E402
from cis.core.stages.runner import StageRunner  # noqa: E402

APP = "cis"
# part of the best configuration: no access log line per request, warnings only (cis nodes log events, not requests)
QUIET = {"log_level": "WARNING", "enable_access_log": False}
TIERS = ("devices", "edges", "cloud")  # by exit 1, 2, 3 of paper-7's tree


def answer(cls: np.ndarray, confidence: np.ndarray, exit: np.ndarray, node: list[str]) -> dict:
    """Per sample of one request: class, confidence, the exit and the node that served it (a plain dict: it
    crosses processes as Ray serialises it)."""
    return {"cls": cls, "confidence": confidence, "exit": exit, "node": node}


def tier_policy(bundle_dir: str, threshold: float | None) -> ExitPolicy:
    """The bundle's exit policy, or ``threshold`` at every node but the root (``cis serve --threshold``)."""
    policy = load_bundle(bundle_dir, verify=False).policy
    if policy is None or policy.uses_patience:
        raise ValueError(f"{bundle_dir}: the Ray Serve app needs a thresholded policy (not patience)")
    if threshold is not None:
        policy = ExitPolicy(policy.measure, {k: (v if math.isinf(v) and v < 0 else threshold)
                                             for k, v in policy.thresholds.items()})  # fmt: skip
    return policy


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Tier:
    """One tier of the tree: the nodes of one exit, their stages 1..exit, a handle to the parent tier."""

    def __init__(self, bundle_dir: str, exit: int, parent=None, threshold: float | None = None,
                 max_batch_size: int = 32, batch_wait_timeout_s: float = 0.0, threads: int = 1):  # fmt: skip
        bundle = load_bundle(bundle_dir)  # every sha256 checked, as a cis node does
        assert bundle.spec is not None, "a bundle with its spec"
        self.spec, self.exit, self.parent = bundle.spec, exit, parent
        self.root = exit == max(n.exit for n in bundle.spec.nodes)
        self.policy = tier_policy(bundle_dir, threshold)
        self.runners = {k: StageRunner(bundle, k, threads=threads) for k in range(1, exit + 1)}
        self.parent_of = {n.id: n.parent for n in bundle.spec.nodes}
        self.nodes = [n.id for n in bundle.spec.nodes if n.exit == exit]  # the nodes this tier stands for
        self._run.set_max_batch_size(max_batch_size)
        self._run.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0)
    async def _run(self, items: list[tuple[str, int, dict]]) -> list[tuple[dict, dict]]:
        """One micro-batch: each item (node, entry stage, tensors) runs its stages up to this tier's exit;
        the decision of the item's node splits it into (answered samples, carry of the rest)."""
        logits = run_batch(self.runners, [(stage, tensors) for _, stage, tensors in items], self.exit)
        out = []
        for (node, _, _), (z, carry) in zip(items, logits):
            v = self.policy.batch(node, self.exit, self.root).verdict(z)
            serve_mask = np.ones(len(z), bool) if v.serve is None else v.serve
            answered = {"cls": v.cls, "confidence": v.conf, "serve": serve_mask}
            out.append((answered, {k: a[~serve_mask] for k, a in carry.items()}))
        return out

    async def forward(self, node: str, stage: int, tensors: dict) -> dict:
        """A request entering this tier at ``node`` and ``stage``: its answer, the parent's for what it forwards."""
        answered, carry = await self._run((node, stage, tensors))
        serve_mask = answered["serve"]
        n = len(serve_mask)
        ans = answer(answered["cls"].astype(np.int64), answered["confidence"].astype(np.float32),
                     np.full(n, self.exit, np.int32), [node] * n)  # fmt: skip
        if serve_mask.all():
            return ans
        up = await self.parent.forward.remote(self.parent_of[node], self.exit + 1, carry)
        rest = np.flatnonzero(~serve_mask)
        for key in ("cls", "confidence", "exit"):
            ans[key][rest] = up[key]
        for i, who in zip(rest, up["node"]):
            ans["node"][i] = who
        return ans

    async def infer(self, node: str, x: np.ndarray) -> dict:
        """A client's request of ``len(x)`` samples entering at device ``node`` (the native path)."""
        return await self.forward(node, 1, {INPUT: np.ascontiguousarray(x, dtype=np.float32)})

    async def __call__(self, request) -> object:
        """HTTP ingress: the Open Inference Protocol's JSON infer call; the model name is the entry node."""
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        if request.method == "GET":
            return JSONResponse({"live": True} if path.endswith("live") else {"ready": True})
        parts = path.split("/")
        if len(parts) < 4 or parts[-1] != "infer" or parts[-3] != "models":
            return JSONResponse({"error": f"unknown path {path}; expected /v2/models/NODE/infer"}, status_code=404)
        node = parts[-2]
        if node not in self.nodes:
            return JSONResponse({"error": f"unknown model {node!r}; expected one of {self.nodes}"}, status_code=404)
        try:
            body = await request.json()
            first = body["inputs"][0]
            x = np.asarray(first["data"], dtype=np.float32).reshape(first["shape"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return JSONResponse({"error": f"bad request: {exc}"}, status_code=400)
        ans = await self.infer(node, x)
        n = len(ans["cls"])
        outputs = [
            {"name": "class", "datatype": "INT64", "shape": [n], "data": ans["cls"].tolist()},
            {"name": "confidence", "datatype": "FP32", "shape": [n], "data": ans["confidence"].tolist()},
            {"name": "exit", "datatype": "INT32", "shape": [n], "data": ans["exit"].tolist()},
        ]
        reply = {"model_name": node, "outputs": outputs, "parameters": {"served_by": ",".join(ans["node"])}}
        if "id" in body:
            reply["id"] = body["id"]
        return JSONResponse(reply)


def run_batch(runners: dict, items: Sequence[tuple[int, dict]], exit: int) -> list[tuple[np.ndarray, dict]]:
    """Run requests entering at different stages through stages ..``exit`` in shared batches (as a cis node:
    requests entering at different stages share the later stages). Per item: (logits at ``exit``, its carry)."""
    carry: list[dict | None] = [None] * len(items)
    logits: list[np.ndarray | None] = [None] * len(items)
    for k in range(min(stage for stage, _ in items), exit + 1):
        members = [i for i, (stage, _) in enumerate(items) if stage <= k]
        feeds = [items[i][1] if items[i][0] == k else carry[i] for i in members]
        sizes = [len(next(iter(f.values()))) for f in feeds]  # type: ignore[union-attr]
        batch = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}  # type: ignore[index]
        out = runners[k].run(batch)
        cuts = np.cumsum(sizes)[:-1]
        parts = {name: np.split(a, cuts) for name, a in out.items()}
        for j, i in enumerate(members):
            logits[i] = parts[LOGITS][j]
            carry[i] = carry_of({name: p[j] for name, p in parts.items()})
    return [(z, c) for z, c in zip(logits, carry)]  # type: ignore[misc]


def build_app(bundle: str, threshold: float | None = None, max_batch_size: int = 32,
              batch_wait_timeout_s: float = 0.0, max_ongoing_requests: int | None = None):  # fmt: skip
    """The application: devices -> edges -> cloud, one replica per node of the bundle's tree."""
    spec = load_bundle(bundle, verify=False).spec
    assert spec is not None, f"{bundle}: a bundle with its spec"
    exits = sorted({n.exit for n in spec.nodes})
    count = {e: sum(1 for n in spec.nodes if n.exit == e) for e in exits}
    ongoing = max_ongoing_requests or max(8, 2 * max_batch_size)  # a batch can fill: Ray's default is 5
    parent = None
    for e in reversed(exits):  # the root first: each tier is bound with its parent's handle
        name = TIERS[exits.index(e)] if len(exits) == 3 else f"exit{e}"
        options = {"name": name, "num_replicas": count[e], "max_ongoing_requests": ongoing, "logging_config": QUIET}
        parent = Tier.options(**options).bind(bundle, e, parent, threshold, max_batch_size, batch_wait_timeout_s)
    return parent


def main(argv: list[str] | None = None) -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--threshold", type=float, default=None, help="every node below the root (default: bundle's)")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-timeout-s", type=float, default=0.0)
    ap.add_argument("--max-ongoing-requests", type=int, default=None)
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count())
    ap.add_argument("--redeploy", metavar="GCS_ADDRESS",
                    help="run the app again with these options on the cluster at GCS_ADDRESS, then exit (a driver of "
                         "its own: the benchmark's driver keeps its handles and their event loop)")  # fmt: skip
    args = ap.parse_args(argv)
    app = build_app(args.bundle, args.threshold, args.max_batch_size, args.batch_wait_timeout_s,
                    args.max_ongoing_requests)  # fmt: skip
    if args.redeploy:
        ray.init(address=args.redeploy, configure_logging=False, log_to_driver=False)
        serve.run(app, name=APP, route_prefix="/", logging_config=QUIET)
        ray.shutdown()
        return 0
    # Ray starts its workers (the replicas) at niceness 15, below the load generator and cis's nodes (0): at 0 the
    # replicas compete for the CPU as cis's nodes do
    ray.init(include_dashboard=False, num_cpus=args.num_cpus, configure_logging=False, log_to_driver=False,
             _system_config={"worker_niceness": 0})  # fmt: skip
    serve.start(http_options={"host": "127.0.0.1", "port": args.http_port}, logging_config=QUIET)
    serve.run(app, name=APP, route_prefix="/", logging_config=QUIET)
    gcs = ray.get_runtime_context().gcs_address
    print(json.dumps({"gcs_address": gcs, "http": f"http://127.0.0.1:{args.http_port}", "pid": os.getpid()}),
          flush=True)  # fmt: skip
    done: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))
    signal.signal(signal.SIGINT, lambda *_: done.append(1))
    while not done:
        time.sleep(0.2)
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
