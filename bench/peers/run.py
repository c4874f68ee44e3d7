"""Ahead of the peers, measured (issue 34): cis against Ray Serve on the same three tiers, and cis's front door
against KServe's and MLServer's servers, in one run on one machine, driven by one load generator.

**The tree** (paper-7: four devices, two edges, a cloud; the same bundle, thresholds and exit policy):
``cis serve --all`` (seven node processes and the launcher) against the same CIS as a Ray Serve app
(bench/peers/ray_serve_cis.py: a deployment per tier, seven replicas, DeploymentHandles between tiers,
``@serve.batch``; Ray's dashboard off). cis runs with ``--no-cap`` (the Ray app has no transfer cap).

1. agreement: the same samples, one at a time, through both: the same class, exit and serving node for every
   sample, on the digits bundle and on a CIFAR-10 bundle (a tiny ``cis train`` run);
2. p50 / p99 at batch 1 under light load (Poisson, 25 requests/s), every sample forced through the three
   tiers (threshold inf below the root) and at the bundle's thresholds;
3. the largest request rate each holds with p99 under 100 ms (every request answered; Poisson arrivals,
   doubling then bisecting), batching on (cis's defaults: ``--max-batch 32 --max-wait 0``);
4. memory: RSS and PSS of every process of each system at rest and under load at that rate;
5. start-up: from the command to the first answered request;
6. 2x that rate for a while: answered, refused, timed out (5 s), and memory before and after.

Each over its native path (cis.Client over ZeroMQ; a Ray Serve DeploymentHandle from a driver) and over
HTTP (cis's Open Inference Protocol front door, when ``cis serve`` has ``--http-port``: else reported as
"pending front door"; Ray Serve's HTTP ingress speaking the same protocol's JSON infer call). Ray Serve's
best configuration: dashboard off, the handle path, batching tuned over ``--ray-configs``
(max_batch_size/batch_wait_timeout_s; Ray's default 10/0.01 among them), replicas with num_cpus=0 and
``max_ongoing_requests`` twice the batch; every configuration tried is in the results.

**One tier** (the cloud node's stages alone, what a single-model server does): cis (``cis serve --node
cloud``, its front door when it has one; cis.Client as a reference), KServe's ``ModelServer`` with a
``kserve.Model`` and MLServer with an ``MLModel`` (custom runtimes running the same ONNX stages with
onnxruntime; MLServer with 0 and 1 parallel workers), all driven by tritonclient's HTTP client
(``tritonclient.http``, each request body made once): p50 / p99 at batch 1, the largest rate under p99 100 ms
and each side's CPU per request, the load generator on a core of its own and the servers on the others; a null
endpoint (``null_oip.py``) and the stages timed alone give the floor of every HTTP p50. Triton's own server
is not a Python package: it is not on the package index, so it is not compared.

The load generator, cis.Client, tritonclient and the Ray driver run in this process (the project's venv);
the servers in their own processes. Setup (once; ray[serve] in the project's venv, kserve and mlserver in
their own venvs because they pin other fastapi/uvicorn versions)::

    bash scripts/peers_setup.sh          # or: python -m bench.peers --setup

Runs::

    python -m bench.peers                 # the full run, about 20 minutes: results/peers.{json,md}
    python -m bench.peers --quick         # smoke run on the digits bundle (CI): results/peers-quick.*
    python -m bench.peers --report        # peers.md and docs/runtime.md's figures again from peers.json
    python -m bench.peers --p50-only --bundle B --inputs X.npz --out FILE.json   # scripts/gpu_peers.sh
    python -m bench.peers --only tree       # then --only one-tier, then --merge: peers.json from two runs
    python -m bench.peers --profile one-tier --profile-path http --profile-server mlserver   # py-spy

A missing peer (kserve or mlserver venv, tritonclient, ray[serve]) is reported as not installed, never
faked. Bundles and inputs are cached in ``--work`` (default /tmp/cis-bench/peers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.harness import REPO, RESULTS, Served, ensure_cifar, machine, write_results
from bench.peers.loadgen import CisNative, OipHttp, RayHandle, drive, drive_sync, holds, offsets_of
from bench.peers.systems import (
    VENVS,
    MemoryPeak,
    RayServer,
    SingleServer,
    cis_has_front_door,
    cis_node,
    cis_tree,
    cpu_seconds,
    descendants,
    machine_busy,
    memory,
    missing_peers,
    oip_body,
    split_cpus,
    versions,
    wait_http,
)

PENDING_DOOR = "pending front door (cis serve has no --http-port yet: issue 33)"
P99_LIMIT = 0.100
LIGHT_RATE = 25.0
GOALS = {  # issue 34's goals: (figure, comparison, bound)
    "p50_three_tiers": ("cis p50 / Ray Serve p50, three tiers forced, batch 1", "<=", 0.25),
    "largest_rate": ("cis / Ray Serve largest rate under p99 100 ms", ">=", 8.0),
    "memory": ("cis / Ray Serve RSS of the 7-node tree", "<=", 0.3),
    "startup": ("cis / Ray Serve start-up to the first answer", "<=", 0.3),
    "door_p50_kserve": ("cis front door p50 / KServe p50, one tier, binary input", "<=", 0.5),
    "door_p50_mlserver": ("cis front door p50 / MLServer p50, one tier, JSON input", "<=", 0.5),
    "door_rate_kserve": ("cis front door / KServe largest rate, binary input", ">=", 2.0),
    "door_rate_mlserver": ("cis front door / MLServer largest rate, JSON input", ">=", 2.0),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: digits bundle, short phases (CI)")
    ap.add_argument("--setup", action="store_true", help="install the peers (scripts/peers_setup.sh) and stop")
    ap.add_argument("--report", action="store_true", help="rebuild peers.md and docs/runtime.md's figures")
    ap.add_argument("--p50-only", action="store_true", help="p50 through three tiers only (GPU machine)")
    ap.add_argument("--only", choices=["tree", "one-tier"],
                    help="one section alone: results/peers[-quick]-SECTION.* (--merge joins the two)")
    ap.add_argument("--merge", action="store_true",
                    help="peers.json (and the docs' figures) from peers-tree.json and peers-one-tier.json, two runs "
                         "each in a window of its own (a machine where one run may take at most 15 minutes)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="one tier: do not pin the load generator to its own core and the servers to the others")
    ap.add_argument("--profile", choices=["tree", "one-tier"], help="py-spy every process under load instead")
    ap.add_argument("--profile-path", choices=["native", "http", "binary"], default="native",
                    help="--profile's client path (http: JSON input; binary: Triton's binary extension)")
    ap.add_argument("--profile-server", choices=["cis", "kserve", "mlserver", "null"], default="cis",
                    help="--profile one-tier: the server profiled (all but cis over HTTP)")
    ap.add_argument("--profile-rate", type=float, default=300.0, help="--profile's request rate (Poisson)")
    ap.add_argument("--profile-seconds", type=float, default=10.0, help="--profile's duration")
    ap.add_argument("--work", default="/tmp/cis-bench/peers", help="bundles, inputs, logs")
    ap.add_argument("--data", default="/tmp/cifar10", help="CIFAR-10 folder (unzipped when missing)")
    ap.add_argument("--bundle", help="the bundle to time (default: the CIFAR-10 bundle; --quick: digits)")
    ap.add_argument("--inputs", help="an .npz with x (N, C, H, W) to send (default: the bundle's test split)")
    ap.add_argument("--ray-configs", default=None,
                    help="Ray batching tried, MAX_BATCH/WAIT_S,... (default 10/0.01,1/0,32/0,32/0.002; --quick 32/0; "
                         "--p50-only 32/0,10/0.01,1/0)")
    ap.add_argument("--out", default=None, help="result file (default results/peers.json, peers-quick.json)")
    args = ap.parse_args(argv)
    default = "32/0,10/0.01,1/0" if args.p50_only else "32/0" if args.quick else "10/0.01,1/0,32/0,32/0.002"
    text = args.ray_configs or default
    args.configs = [{"max_batch_size": int(b), "batch_wait_timeout_s": float(w)}
                    for b, w in (c.split("/") for c in text.split(","))]  # fmt: skip
    args.light_n = 20 if args.quick else 200
    args.step_s = 0.5 if args.quick else 3.0
    args.sweep = {"start": 50.0, "cap": 400.0, "bisect": 0} if args.quick else {}
    args.overload_s = 1.0 if args.quick else 10.0
    args.cost_rate, args.cost_s = (50.0, 1.0) if args.quick else (200.0, 5.0)
    args.agree_n = 40 if args.quick else 200
    return args


# ---------------------------------------------------------------- bundles and inputs


def digits_bundle(work: Path) -> Path:
    bundle = work / "digits" / "bundle"
    if not (bundle / "manifest.json").is_file():
        from cis.exporter.fixture_bundle import make_demo_bundle

        make_demo_bundle(work / "digits", steps=300)
    return bundle


def cifar_bundle(work: Path, data: str) -> Path:
    """A tiny CIFAR-10 run (``cis train``, ResNet18EE at width 0.25, 3 rounds of 20 local steps), exported."""
    bundle, run = work / "cifar10" / "bundle", work / "cifar10" / "run"
    if (bundle / "manifest.json").is_file():
        return bundle
    ensure_cifar(Path(data))
    cli = [sys.executable, "-m", "cis.cli.main"]
    if not (run / "checkpoint.pt").is_file():
        subprocess.run([*cli, "train", "--dataset", f"cifar10:{data}", "--serving", "60-30-10", "--rounds", "3",
                        "--width", "0.25", "--local-steps", "20", "--threads", "1", "--no-progress",
                        "--out", str(run)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([*cli, "export", str(run), "--out", str(bundle)], check=True, stdout=subprocess.DEVNULL)
    return bundle


def inputs_of(bundle: Path, work: Path, n: int, given: str | None = None) -> np.ndarray:
    """``n`` test inputs of the bundle's data set (normalised, float32), cached as an .npz in ``work``."""
    if given:
        with np.load(given) as z:
            return z["x"][:n].astype(np.float32)
    from cis.core.bundle import load_bundle

    dataset = load_bundle(bundle, verify=False).manifest.get("dataset", "digits")
    path = work / f"inputs-{dataset.split(':')[0]}.npz"
    if not path.is_file():
        from cis.training.data.loading import load_dataset

        x = load_dataset(dataset).test.x[:2000].astype(np.float32)
        np.savez_compressed(path, x=x)
    with np.load(path) as z:
        x = z["x"]
    reps = math.ceil(n / len(x))
    return np.concatenate([x] * reps)[:n] if reps > 1 else x[:n]


def entry_nodes(bundle: Path, n: int) -> list[str]:
    """The entry node of each of ``n`` requests (``assign_entries`` of cis.core.policy.exit_policy,
    as ``cis infer --spec`` sends)."""
    from cis.core.bundle import load_bundle
    from cis.core.policy.exit_policy import assign_entries

    spec = load_bundle(bundle, verify=False).spec
    assert spec is not None
    nodes = [""] * n
    for node, idx in assign_entries(spec, n).items():
        for i in idx:
            nodes[int(i)] = node
    return nodes


# ---------------------------------------------------------------- driving


def run_load(make: Callable[[], object], x: np.ndarray, nodes: list[str], rate: float | None,
             timeout: float = 2.0, keep: bool = False, seed: int = 0):  # fmt: skip
    """One run of the load generator: ``len(nodes)`` requests at ``rate`` (Poisson; None: one by one)."""
    offsets = offsets_of(rate, len(nodes), seed)
    transport = make()
    if isinstance(transport, OipHttp):  # the synchronous HTTP client: greenlets, no asyncio
        try:
            return drive_sync(transport, x, nodes, offsets, timeout, keep, rate)
        finally:
            transport.close()

    async def go():
        try:
            return await drive(transport, x, nodes, offsets, timeout, keep, rate)  # type: ignore[arg-type]
        finally:
            await transport.close()  # type: ignore[attr-defined]

    return asyncio.run(go())


def repeat(x: np.ndarray, nodes: list[str], n: int) -> tuple[np.ndarray, list[str]]:
    """``n`` requests: the inputs and entry nodes repeated as often as needed."""
    reps = math.ceil(n / len(x))
    return (np.concatenate([x] * reps)[:n], (nodes * reps)[:n]) if reps > 1 else (x[:n], nodes[:n])


def settle(make: Callable[[], object], x: np.ndarray, node: str, limit: float = 20.0) -> float:
    """After an overload: wait until three lone requests are answered within the p99 limit again (a backlog
    drained)."""
    start = time.monotonic()
    time.sleep(0.5)
    while time.monotonic() - start < limit:
        run = run_load(make, x[:3], [node] * 3, None, timeout=5.0)
        lats = [o.latency for o in run.outcomes if o.error is None]
        if len(lats) == 3 and max(lats) < P99_LIMIT:  # type: ignore[type-var]
            break
        time.sleep(0.5)
    return time.monotonic() - start


def light(make, x, nodes, n: int) -> dict:
    """p50 / p99 at batch 1 under light load (Poisson at LIGHT_RATE), after 20 warm-up requests."""
    run_load(make, x[:20], nodes[:20], None)
    return run_load(make, x[:n], nodes[:n], LIGHT_RATE, seed=1).summary()


def sweep(make, x, nodes, step_s: float, start: float = 25.0, cap: float = 4000.0, bisect: int = 3,
          floor: float = 1.0) -> dict:  # fmt: skip
    """The largest Poisson rate held with p99 < 100 ms and every request answered: doubling from ``start``
    (halving when it does not hold there, down to ``floor``), then ``bisect`` geometric bisections."""
    steps: list[dict] = []

    def at(rate: float) -> bool:
        xs, ns = repeat(x, nodes, max(30, int(rate * step_s)))
        s = run_load(make, xs, ns, rate, seed=len(steps) + 2).summary()
        s["rate"] = rate
        s["held"] = holds(s, P99_LIMIT)
        steps.append(s)
        if not s["held"]:
            s["settle_s"] = settle(make, x, nodes[0])
        return s["held"]

    lo, hi, rate = None, None, start
    while floor <= rate <= cap:  # up from the start while it holds, or down from it until it holds
        if at(rate):
            lo = rate
            if hi is not None:
                break
            rate *= 2
        else:
            hi = rate
            if lo is not None:
                break
            rate /= 2
    if lo is not None and hi is not None:
        for _ in range(bisect):
            mid = math.sqrt(lo * hi)
            if at(mid):
                lo = mid
            else:
                hi = mid
    return {"largest_rate": lo or 0.0, "first_failed": hi, "steps": steps, "step_s": step_s}


def overload(make, x, nodes, rate: float, seconds: float, roots: list[int]) -> dict:
    """``rate`` (twice the largest held) for ``seconds``: answered, refused, timed out; memory around it."""
    before = memory(sorted({p for r in roots for p in descendants(r)}))
    xs, ns = repeat(x, nodes, max(30, int(rate * seconds)))
    with MemoryPeak(roots) as peak:
        s = run_load(make, xs, ns, rate, timeout=5.0, seed=99).summary()
    drained = settle(make, x, nodes[0])
    after = memory(sorted({p for r in roots for p in descendants(r)}))
    s.update(rate=rate, seconds=seconds, rss_before_mb=before["rss_mb"], rss_peak_mb=peak.peak["rss_mb"],
             rss_after_mb=after["rss_mb"], drained_s=drained,
             rss_growth_mb=round(after["rss_mb"] - before["rss_mb"], 1))  # fmt: skip
    return s


def under_load(make, x, nodes, rate: float, seconds: float, roots: list[int]) -> dict:
    """Memory of every process while the largest held rate runs."""
    xs, ns = repeat(x, nodes, max(30, int(rate * seconds)))
    with MemoryPeak(roots) as peak:
        s = run_load(make, xs, ns, rate, seed=98).summary()
    return {"rate": rate, "run": s, **peak.peak}


def at_rest(roots: list[int]) -> dict:
    time.sleep(1.0)
    return memory(sorted({p for r in roots for p in descendants(r)}))


# ---------------------------------------------------------------- transports per system


def cis_native(tree: Served) -> Callable[[], CisNative]:
    return lambda: CisNative({n: tree.address(n) for n in tree.nodes})


def cis_http(tree: Served, model: str = "cis", binary: bool = False) -> Callable[[], OipHttp] | None:
    urls = {n: u for n in tree.nodes if (u := tree.url(n))}
    if not urls:
        return None
    name = door_input_name(next(iter(urls.values())), model)
    return lambda: OipHttp(urls, model, input_name=name, binary=binary)


def door_input_name(url: str, model: str) -> str:
    """The model's input name from its metadata (``GET /v2/models/{model}``)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/v2/models/{model}", timeout=5) as r:
        return json.loads(r.read())["inputs"][0]["name"]


def first_answer(make, x, node: str, timeout: float = 120.0) -> float:
    """Seconds (monotonic clock) at which ``node`` first answered a request."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        run = run_load(make, x[:1], [node], None, timeout=1.0)
        if run.outcomes and run.outcomes[0].error is None:
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"peers: {node} gave no answer within {timeout:.0f} s")


# ---------------------------------------------------------------- 1. agreement


def agreement(bundle: Path, x: np.ndarray, ray: RayServer, logs: Path) -> dict:
    """The same samples, one at a time, through cis and the Ray Serve app: class, exit, serving node."""
    nodes = entry_nodes(bundle, len(x))
    tree = cis_tree(bundle, logs, ["--no-cap"], http=False)
    try:
        ours = run_load(cis_native(tree), x, nodes, None, timeout=10.0, keep=True).outcomes
    finally:
        tree.stop()
    ray.redeploy(bundle)
    theirs = run_load(lambda: RayHandle(ray.handle()), x, nodes, None, timeout=10.0, keep=True).outcomes
    pairs = [(a.answer, b.answer) for a, b in zip(ours, theirs)]
    answered = [(a, b) for a, b in pairs if a is not None and b is not None]
    same = {k: sum(a[k] == b[k] for a, b in answered) for k in ("cls", "exit", "node")}
    gap = max((abs(p - q) for a, b in answered for p, q in zip(a["confidence"], b["confidence"])), default=None)
    exits = [e for a, _ in answered for e in a["exit"]]
    return {
        "bundle": str(bundle),
        "samples": len(x),
        "answered_both": len(answered),
        "same_class": same["cls"],
        "same_exit": same["exit"],
        "same_node": same["node"],
        "max_confidence_gap": gap,
        "identical": len(answered) == len(x) and all(v == len(x) for v in same.values()),
        "served_share_per_exit": {str(e): exits.count(e) / max(len(exits), 1) for e in sorted(set(exits))},
    }


# ---------------------------------------------------------------- 2. the tree


def tree_cis(bundle: Path, x: np.ndarray, nodes: list[str], args, door: bool) -> dict:
    logs = Path(args.work) / "logs"
    out: dict = {"command": "cis serve BUNDLE --all --no-cap" + (" --http-port 0" if door else "")}
    tree = cis_tree(bundle, logs, ["--no-cap"], http=door)
    native = cis_native(tree)
    try:
        out["startup_s"] = first_answer(native, x, nodes[0]) - tree.started
        out["ready_s"] = tree.ready_s
        roots = [tree.proc.pid]
        run_load(native, x[:20], nodes[:20], None)
        out["rss_rest"] = at_rest(roots)
        paths = {"native": native, "http": cis_http(tree) if door else None}
        out["paths"] = {}
        for name, make in paths.items():
            if make is None:
                out["paths"][name] = {"pending": PENDING_DOOR}
                continue
            p = out["paths"][name] = {"light_spec": light(make, x, nodes, args.light_n)}
            p["sweep"] = sweep(make, x, nodes, args.step_s, **args.sweep)
            p["largest_rate"] = p["sweep"]["largest_rate"]
        rate = out["paths"]["native"]["largest_rate"]
        if rate:
            out["rss_load"] = under_load(native, x, nodes, rate, args.overload_s, roots)
        for name, make in paths.items():
            p = out["paths"][name]
            if make is not None and p.get("largest_rate"):
                p["overload_2x"] = overload(make, x, nodes, 2 * p["largest_rate"], args.overload_s, roots)
    finally:
        tree.stop()
    tree = cis_tree(bundle, logs, ["--no-cap", "--threshold", "inf"], http=door)
    try:
        for name, make in {"native": cis_native(tree), "http": cis_http(tree) if door else None}.items():
            if make is not None:
                out["paths"][name]["light_forced"] = light(make, x, nodes, args.light_n)
    finally:
        tree.stop()
    return out


def tree_ray(bundle: Path, x: np.ndarray, nodes: list[str], args, agree: dict[str, tuple[Path, np.ndarray]]) -> dict:
    """Ray Serve: start-up and memory at rest (first configuration), agreement, every batching configuration
    on the handle path (light load, both thresholds; the sweep), HTTP and overload with the best."""
    work = Path(args.work)
    first = args.configs[0]
    cmd = ["--max-batch-size", str(first["max_batch_size"]), "--batch-wait-timeout-s",
           str(first["batch_wait_timeout_s"])]  # fmt: skip
    ray = RayServer(bundle, work / "ray.log", cmd, first)
    out: dict = {"command": "python bench/peers/ray_serve_cis.py --bundle BUNDLE " + " ".join(cmd)}
    try:
        http = ray_http(ray, nodes)
        body = oip_body(x[:1])
        waited = wait_http(f"{ray.url}/v2/models/{nodes[0]}/infer", body, 120, ray.proc)
        out["startup_s"] = None if waited is None else time.monotonic() - ray.t0
        out["ready_s"] = ray.ready_s
        roots = [ray.proc.pid]
        handle = ray_native(ray)
        run_load(handle, x[:20], nodes[:20], None)
        out["rss_rest"] = at_rest(roots)
        out["agreement"] = {name: agreement(b, xs, ray, work / "logs") for name, (b, xs) in agree.items()}
        tried = []
        for cfg in args.configs:
            row: dict = {**cfg, "redeploy_s": ray.redeploy(bundle, **cfg)}
            row["light_spec"] = light(handle, x, nodes, args.light_n)
            row["sweep"] = sweep(handle, x, nodes, args.step_s, **args.sweep)
            row["largest_rate"] = row["sweep"]["largest_rate"]
            ray.redeploy(bundle, threshold=math.inf, **cfg)
            row["light_forced"] = light(handle, x, nodes, args.light_n)
            tried.append(row)
        out["configs_tried"] = tried
        by_rate = max(tried, key=lambda r: (r["largest_rate"], -(r["light_spec"]["p50_s"] or 1e9)))
        by_p50 = min(tried, key=lambda r: r["light_forced"]["p50_s"] or 1e9)
        best = {k: by_rate[k] for k in ("max_batch_size", "batch_wait_timeout_s")}
        out["best_for_rate"], out["best_for_p50"] = best, {k: by_p50[k] for k in best}
        native = {"light_forced": by_p50["light_forced"], "light_spec": by_rate["light_spec"],
                  "sweep": by_rate["sweep"], "largest_rate": by_rate["largest_rate"]}  # fmt: skip
        out["paths"] = {"native": native}
        ray.redeploy(bundle, threshold=math.inf, **out["best_for_p50"])  # (runs already when it was the last)
        p = out["paths"]["http"] = {"light_forced": light(http, x, nodes, args.light_n)}
        ray.redeploy(bundle, **best)
        p["light_spec"] = light(http, x, nodes, args.light_n)
        p["sweep"] = sweep(http, x, nodes, args.step_s, **args.sweep)
        p["largest_rate"] = p["sweep"]["largest_rate"]
        if native["largest_rate"]:
            out["rss_load"] = under_load(handle, x, nodes, native["largest_rate"], args.overload_s, roots)
        for name, make in (("native", handle), ("http", http)):
            q = out["paths"][name]
            if q.get("largest_rate"):
                q["overload_2x"] = overload(make, x, nodes, 2 * q["largest_rate"], args.overload_s, roots)
    finally:
        ray.stop()
    return out


def ray_native(ray: RayServer) -> Callable[[], RayHandle]:
    return lambda: RayHandle(ray.handle())


def ray_http(ray: RayServer, nodes: list[str]) -> Callable[[], OipHttp]:
    """Ray's HTTP ingress: one URL, the model named after the entry node."""
    return lambda: OipHttp({n: ray.url for n in set(nodes)}, model=None)


# ---------------------------------------------------------------- 3. one tier


def single(bundle: Path, x: np.ndarray, args, door: bool) -> dict:
    """The cloud node's stages alone behind cis, KServe and MLServer, and a null endpoint (the client's floor);
    tritonclient's HTTP client drives all, from a core of its own (``--pin``: the servers on the others)."""
    nodes = ["cloud"] * len(x)
    cpus = split_cpus() if args.pin else None
    client_cpus, server_cpus = cpus if cpus else (None, None)
    out: dict = {"pinning": {"load_generator": sorted(client_cpus), "servers": sorted(server_cpus)} if cpus
                 else None}  # fmt: skip
    before = os.sched_getaffinity(0)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    try:
        out.update(single_servers(bundle, x, nodes, args, door, server_cpus))
    finally:
        os.sched_setaffinity(0, before)
    return out


def stages_alone(bundle: Path, x: np.ndarray, n: int) -> dict:
    """The cloud node's stages and decision alone, in this process, one sample at a time (node_stages.py, what
    every server here runs per request): the part of each round trip no server can save. Timed back to back,
    and spaced as the light load spaces requests (an idle core between them: what a request at light load meets)."""
    from bench.peers.node_stages import NodeStages

    stages = NodeStages(str(bundle))
    for i in range(20):
        stages(x[i : i + 1])
    out: dict = {"samples": n}
    for key, gap in (("back_to_back", 0.0), ("light", 1.0 / LIGHT_RATE)):
        times = []
        for i in range(n):
            time.sleep(gap)
            t = time.perf_counter()
            stages(x[i : i + 1])
            times.append(time.perf_counter() - t)
        out[key] = {"p50_s": float(np.median(times)), "mean_s": float(np.mean(times))}
    out["p50_s"] = out["light"]["p50_s"]
    return out


def single_servers(bundle: Path, x: np.ndarray, nodes: list[str], args, door: bool, cpus: set[int] | None) -> dict:
    out: dict = {"stages_alone": stages_alone(bundle, x, args.light_n)}
    work = Path(args.work)
    null = SingleServer("null", bundle, work, cpus=cpus)
    try:
        if wait_http(f"{null.url}/v2/models/cis/infer", oip_body(x[:1]), 30, null.proc) is None:
            raise SystemExit(f"peers: the null endpoint did not start; see {null.log}")
        for key, binary in (("null", False), ("null_binary", True)):
            make = lambda url=null.url, b=binary: OipHttp({"cloud": url}, binary=b)  # noqa: E731
            out[key] = {"encoding": "binary" if binary else "JSON", **one_tier(make, x, nodes, args, [null.proc.pid])}
    finally:
        null.stop()
    node = cis_node(bundle, "cloud", http=door, cpus=cpus)
    try:
        native = cis_native(node)
        startup = first_answer(native, x, "cloud") - node.started
        out["cis"] = {"startup_s": startup, "native": {"startup_s": startup,
                                                       **one_tier(native, x, nodes, args, [node.proc.pid])}}
        for key, binary in (("http", False), ("http_binary", True)):  # JSON, as MLServer; binary, as KServe
            make = cis_http(node, binary=binary) if door else None
            out["cis"][key] = ({"startup_s": startup, **one_tier(make, x, nodes, args, [node.proc.pid])} if make
                               else {"pending": PENDING_DOOR})  # fmt: skip
    finally:
        node.stop()
    if door:  # where a request's time goes at light load: the same node busy-polling its core instead of sleeping
        node = cis_node(bundle, "cloud", http=True, cpus=cpus, args=("--spin",))
        try:
            first_answer(cis_native(node), x, "cloud")
            make = cis_http(node, binary=True)
            run_load(make, x[:20], nodes[:20], None)
            out["cis"]["http_binary_spin"] = {"light": light(make, x, nodes, args.light_n),
                                              "cost": cost(make, x, nodes, args.cost_rate, args.cost_s,
                                                           [node.proc.pid])}  # fmt: skip
        finally:
            node.stop()
    for kind, workers in (("kserve", 1), ("mlserver", 0), ("mlserver", 1)):
        key = kind if kind == "kserve" else f"mlserver_workers{workers}"
        if not (VENVS[kind] / "bin" / "python").exists():
            out[key] = {"not_installed": f"{VENVS[kind]} missing: bash scripts/peers_setup.sh"}
            continue
        server = SingleServer(kind, bundle, work, workers, cpus=cpus)
        try:
            waited = wait_http(f"{server.url}/v2/models/cis/infer", oip_body(x[:1]), 120, server.proc)
            if waited is None:
                out[key] = {"failed": f"no answer (exit status {server.proc.poll()}); see {server.log}"}
                continue
            binary = kind == "kserve"  # KServe reads Triton's binary extension; MLServer only JSON
            make = lambda url=server.url, b=binary: OipHttp({"cloud": url}, binary=b)  # noqa: E731
            out[key] = {"startup_s": time.monotonic() - server.t0, "workers": workers,
                        "encoding": "binary" if binary else "JSON",
                        **one_tier(make, x, nodes, args, [server.proc.pid])}  # fmt: skip
        finally:
            server.stop()
    return out


def one_tier(make, x, nodes, args, roots: list[int]) -> dict:
    """p50 / p99 under light load, CPU per request, the largest rate, memory; and how busy other processes kept
    the machine meanwhile (``others_cores``: the cores they used on average; on a quiet machine about 0)."""
    run_load(make, x[:20], nodes[:20], None)
    t0, busy0, ours0 = time.monotonic(), machine_busy(), time.process_time() + cpu_seconds(_pids(roots))
    out = {"rss_rest": at_rest(roots)["rss_mb"], "light": light(make, x, nodes, args.light_n)}
    out["cost"] = cost(make, x, nodes, args.cost_rate, args.cost_s, roots)
    with MemoryPeak(roots) as peak:
        out["sweep"] = sweep(make, x, nodes, args.step_s, **args.sweep)
    out["largest_rate"] = out["sweep"]["largest_rate"]
    out["rss_peak"] = peak.peak["rss_mb"]
    others = machine_busy() - busy0 - (time.process_time() + cpu_seconds(_pids(roots)) - ours0)
    out["others_cores"] = round(max(others, 0.0) / (time.monotonic() - t0), 3)
    return out


def _pids(roots: list[int]) -> list[int]:
    return sorted({p for r in roots for p in descendants(r)})


def cost(make, x, nodes, rate: float, seconds: float, roots: list[int]) -> dict:
    """CPU per request at a fixed rate, each side's own: the load generator's (this process: the client) and the
    server's (every process of it), from the kernel's accounting (user + system time)."""
    xs, ns = repeat(x, nodes, max(30, int(rate * seconds)))
    transport = make()
    if isinstance(transport, OipHttp):
        transport.prepare(xs)  # the bodies are made once, before any timed run: not the client's cost here
    else:
        asyncio.run(transport.close())
    pids = _pids(roots)
    server0, client0 = cpu_seconds(pids), time.process_time()
    s = run_load(make, xs, ns, rate, seed=97).summary()
    client, server = time.process_time() - client0, cpu_seconds(pids) - server0
    done = max(s["answered"], 1)
    return {"rate": rate, "requests": s["requests"], "answered": s["answered"], "p50_s": s["p50_s"],
            "client_cpu_ms": 1000 * client / done, "server_cpu_ms": 1000 * server / done,
            "server_busy": server / max(s["requests"] / rate, 1e-9)}  # fmt: skip


# ---------------------------------------------------------------- the GPU machine's variant


def p50_only(args) -> dict:
    """p50 at batch 1 through three tiers (forced), cis against Ray Serve (each configuration), start-up."""
    bundle, work = Path(args.bundle), Path(args.work)
    x = inputs_of(bundle, work, 400, args.inputs)
    nodes = entry_nodes(bundle, len(x))
    out: dict = {"benchmark": "peers --p50-only", "machine": machine(), "versions": versions(), "bundle": str(bundle)}
    tree = cis_tree(bundle, work / "logs", ["--no-cap", "--threshold", "inf"], http=False)
    try:
        native = cis_native(tree)
        out["cis"] = {"startup_s": first_answer(native, x, nodes[0]) - tree.started,
                      "light_forced": light(native, x, nodes, args.light_n)}  # fmt: skip
    finally:
        tree.stop()
    first = args.configs[0]
    cmd = ["--threshold", "inf", "--max-batch-size", str(first["max_batch_size"]), "--batch-wait-timeout-s",
           str(first["batch_wait_timeout_s"])]  # fmt: skip
    ray = RayServer(bundle, work / "ray.log", cmd, {"threshold": math.inf, **first})
    try:
        waited = wait_http(f"{ray.url}/v2/models/{nodes[0]}/infer", oip_body(x[:1]), 120, ray.proc)
        out["ray"] = {"startup_s": None if waited is None else time.monotonic() - ray.t0, "configs_tried": []}
        for cfg in args.configs:
            ray.redeploy(bundle, threshold=math.inf, **cfg)
            out["ray"]["configs_tried"].append({**cfg, "light_forced": light(ray_native(ray), x, nodes,
                                                                             args.light_n)})  # fmt: skip
    finally:
        ray.stop()
    best = min(out["ray"]["configs_tried"], key=lambda r: r["light_forced"]["p50_s"] or 1e9)
    out["ray"]["light_forced"] = best["light_forced"]
    out["p50_ratio"] = ratio(out["cis"]["light_forced"]["p50_s"], best["light_forced"]["p50_s"])
    return out


# ---------------------------------------------------------------- where the time goes


def profile(args) -> dict:
    """py-spy on every process of a system (and the load generator) while it serves ``--profile-rate`` for a
    while: cis's tree or its cloud node, or (``--profile one-tier --profile-server``) KServe, MLServer (0 parallel
    workers) or the null endpoint; one tier pinned as in the benchmark (``--no-pin``: not)."""
    from bench.peers.profile_spy import record, summary

    work = Path(args.work)
    bundle = Path(args.bundle) if args.bundle else cifar_bundle(work, args.data)
    x = inputs_of(bundle, work, 2000, args.inputs)
    http, binary = args.profile_path != "native", args.profile_path == "binary"
    server = args.profile_server if args.profile == "one-tier" else "cis"
    if http and server == "cis" and not cis_has_front_door():
        raise SystemExit(f"peers: --profile-path {args.profile_path}: {PENDING_DOOR}")
    if server != "cis" and not http:
        raise SystemExit(f"peers: --profile-server {server} is reached over HTTP: --profile-path http or binary")
    cpus = split_cpus() if args.pin and args.profile == "one-tier" else None
    before = os.sched_getaffinity(0)
    system: Served | SingleServer
    if args.profile == "tree":
        system = cis_tree(bundle, work / "logs", ["--no-cap"], http=http)
        nodes = entry_nodes(bundle, len(x))
        pids = {n: int(v["pid"]) for n, v in system.nodes.items()}
    elif server == "cis":
        system = cis_node(bundle, "cloud", http=http, cpus=cpus and cpus[1])
        nodes = ["cloud"] * len(x)
        pids = {"cloud": system.proc.pid}
    else:
        system = SingleServer(server, bundle, work, 0, cpus=cpus and cpus[1])
        nodes = ["cloud"] * len(x)
        if wait_http(f"{system.url}/v2/models/cis/infer", oip_body(x[:1]), 120, system.proc) is None:
            system.stop()
            raise SystemExit(f"peers: {server} did not start; see {system.log}")
        pids = {server: system.proc.pid}
    pids["load-generator"] = os.getpid()
    tag = f"-{server}" if args.profile == "one-tier" else ""
    folder = work / f"profile-{args.profile}-{args.profile_path}{tag}"
    try:
        if cpus:
            os.sched_setaffinity(0, cpus[0])
        if isinstance(system, SingleServer):
            make: Callable | None = lambda: OipHttp({"cloud": system.url}, binary=binary)  # noqa: E731
        else:
            first_answer(cis_native(system), x, nodes[0])  # up (the front door's metadata is read when it serves)
            make = cis_http(system, binary=binary) if http else cis_native(system)
        assert make is not None
        run_load(make, x[:50], nodes[:50], None)
        xs, ns = repeat(x, nodes, int(args.profile_rate * args.profile_seconds))
        if http:
            make().prepare(xs)  # the bodies, before the profile
        spies = record(pids, args.profile_seconds, folder)
        run = run_load(make, xs, ns, args.profile_rate, seed=7).summary()
        for p in spies.values():
            p.wait(60)
    finally:
        os.sched_setaffinity(0, before)
        system.stop()
    return {"benchmark": "peers --profile", "what": args.profile, "path": args.profile_path, "server": server,
            "bundle": str(bundle), "rate": args.profile_rate, "seconds": args.profile_seconds, "machine": machine(),
            "pinned": bool(cpus), "run": run, "raw": str(folder),
            "processes": {name: summary(folder / f"{name}.txt") for name in pids}}  # fmt: skip


def profile_markdown(r: dict) -> list[str]:
    run = r["run"]
    lines = [f"# Where the time goes: {r.get('server', 'cis')}, {r['what']}, {r['path']} path, {r['rate']:.0f} "
             f"requests/s for "
             f"{r['seconds']:.0f} s (py-spy, 250 Hz)", "",
             f"{r['machine']['cpus']} cores, load average {r['machine']['load_avg'][0]:.1f}. Bundle `{r['bundle']}`. "
             f"Answered {run['answered']} of {run['requests']}, p50 {fmt(run['p50_s'], 'ms')}, "
             f"p99 {fmt(run['p99_s'], 'ms')}. Raw stacks: `{r['raw']}`.", ""]  # fmt: skip
    for name, p in r["processes"].items():
        parts = ", ".join(f"{k} {v:.0%}" for k, v in p["parts"].items())
        lines += [f"## {name} ({p['samples']} samples)", "", f"By part: {parts}.", "",
                  "| self | function | inclusive | function |", "|---|---|---|---|"]  # fmt: skip
        for a, b in zip(p["self"], p["inclusive"]):
            lines.append(f"| {a['share']:.1%} | `{a['function']}` | {b['share']:.1%} | `{b['function']}` |")
        lines.append("")
    return lines


# ---------------------------------------------------------------- the figures


def ratio(a, b) -> float | None:
    return None if a is None or b is None or not b else a / b


def dig(d: dict | None, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def best_of(one: dict, prefix: str, keys: tuple[str, ...], pick=min):
    """The best figure among the configurations of one single-model server (MLServer: 0 and 1 workers)."""
    vals = [v for k, row in one.items() if k.startswith(prefix) if (v := dig(row, *keys)) is not None]
    return pick(vals) if vals else None


def headline(r: dict) -> dict:
    """The issue's goals, each as cis's figure, the peer's, their ratio and whether the goal is met."""
    cis, ray, one = dig(r, "tree", "cis") or {}, dig(r, "tree", "ray") or {}, r.get("single", {})
    door, binary = dig(one, "cis", "http") or {}, dig(one, "cis", "http_binary") or {}  # JSON, binary inputs
    pairs = {
        "p50_three_tiers": (dig(cis, "paths", "native", "light_forced", "p50_s"),
                            dig(ray, "paths", "native", "light_forced", "p50_s")),
        "largest_rate": (dig(cis, "paths", "native", "largest_rate"), dig(ray, "paths", "native", "largest_rate")),
        "memory": (dig(cis, "rss_load", "rss_mb"), dig(ray, "rss_load", "rss_mb")),
        "startup": (cis.get("startup_s"), ray.get("startup_s")),
        "door_p50_kserve": (dig(binary, "light", "p50_s"), dig(one, "kserve", "light", "p50_s")),
        "door_p50_mlserver": (dig(door, "light", "p50_s"), best_of(one, "mlserver", ("light", "p50_s"))),
        "door_rate_kserve": (binary.get("largest_rate"), dig(one, "kserve", "largest_rate")),
        "door_rate_mlserver": (door.get("largest_rate"), best_of(one, "mlserver", ("largest_rate",), max)),
    }  # fmt: skip
    out = {}
    for key, (ours, theirs) in pairs.items():
        what, op, bound = GOALS[key]
        q = ratio(ours, theirs)
        met = None if q is None else (q <= bound if op == "<=" else q >= bound)
        row = {"what": what, "cis": ours, "peer": theirs, "ratio": q, "goal": f"{op} {bound}", "met": met}
        if key.startswith("door") and "pending" in door:
            row["pending"] = PENDING_DOOR
        out[key] = row
    return out


def fmt(v, kind: str) -> str:
    """A figure as the docs and the markdown print it; ``pending`` when it was not measured."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "pending"
    if kind == "ms":
        return f"{v * 1000:.2f} ms"
    if kind == "x":
        return f"{v:.2f}x"
    if kind == "rate":
        return f"{v:,.0f}/s"
    if kind == "mb":
        return f"{v:,.0f} MB"
    if kind == "s":
        return f"{v:.1f} s"
    if kind == "cpu":
        return f"{v:.2f} ms"
    return str(v)


SHORT = {  # the goals as the README's sentence names them
    "p50_three_tiers": "p50 through three tiers against Ray Serve",
    "largest_rate": "largest rate against Ray Serve",
    "memory": "memory of the tree against Ray Serve",
    "startup": "start-up against Ray Serve",
    "door_p50_kserve": "front door p50 against KServe (binary input)",
    "door_p50_mlserver": "front door p50 against MLServer (JSON input)",
    "door_rate_kserve": "front door rate against KServe (binary input)",
    "door_rate_mlserver": "front door rate against MLServer (JSON input)",
}


def verdict(h: dict) -> str:
    """The goals met and the goals missed, each with its ratio: one sentence for the README."""
    said = {True: [], False: []}  # type: dict[bool, list[str]]
    for key, row in h.items():
        if row.get("met") is not None and "pending" not in row:
            said[row["met"]].append(f"{SHORT[key]} {fmt(row['ratio'], 'x')} ({row['goal']})")
    met = "; ".join(said[True]) or "none"
    missed = "; ".join(said[False]) or "none"
    return f"Goals met: {met}. Goals missed: {missed}"


def peer_ahead(h: dict) -> str:
    """The goals' figures where the peer does better than cis (not merely where a goal is missed), with both
    figures; "none" when cis is ahead on every one measured."""
    kinds = {"memory": "mb", "startup": "s"}
    ahead = []
    for key, row in h.items():
        q = row.get("ratio")
        if q is None or "pending" in row:
            continue
        if (q > 1) if row["goal"].startswith("<=") else (q < 1):
            kind = kinds.get(key, "ms" if "p50" in key else "rate")
            ahead.append(f"{SHORT[key]}: cis {fmt(row['cis'], kind)}, the peer {fmt(row['peer'], kind)}")
    return "; ".join(ahead) or "none"


def figures(r: dict) -> dict[str, str]:
    """The figures docs/runtime.md shows ("cis or Ray Serve?"), by name, formatted, all from the result."""
    cis, ray, one, h = dig(r, "tree", "cis") or {}, dig(r, "tree", "ray") or {}, r.get("single", {}), r["headline"]
    nat, rnat = dig(cis, "paths", "native") or {}, dig(ray, "paths", "native") or {}
    http, rhttp = dig(cis, "paths", "http") or {}, dig(ray, "paths", "http") or {}
    best = ray.get("best_for_rate") or {}
    agree = ray.get("agreement", {})
    f = {
        "machine": f"{r['machine']['cpus']} cores, load average {r['machine']['load_avg'][0]:.1f} at the start",
        "date": r.get("date", "pending"),
        "ray_version": r["versions"].get("ray") or "pending",
        "kserve_version": dig(r["versions"], "kserve", "kserve") or "pending",
        "mlserver_version": dig(r["versions"], "mlserver", "mlserver") or "pending",
        "ray_best": (f"max_batch_size {best['max_batch_size']}, batch_wait_timeout_s {best['batch_wait_timeout_s']}"
                     if best else "pending"),
        "p50_cis": fmt(dig(nat, "light_forced", "p50_s"), "ms"),
        "p50_ray": fmt(dig(rnat, "light_forced", "p50_s"), "ms"),
        "p50_ratio": fmt(h["p50_three_tiers"]["ratio"], "x"),
        "p99_cis": fmt(dig(nat, "light_forced", "p99_s"), "ms"),
        "p99_ray": fmt(dig(rnat, "light_forced", "p99_s"), "ms"),
        "p50_spec_cis": fmt(dig(nat, "light_spec", "p50_s"), "ms"),
        "p50_spec_ray": fmt(dig(rnat, "light_spec", "p50_s"), "ms"),
        "rate_cis": fmt(nat.get("largest_rate"), "rate"),
        "rate_ray": fmt(rnat.get("largest_rate"), "rate"),
        "rate_ratio": fmt(h["largest_rate"]["ratio"], "x"),
        "rss_cis": fmt(dig(cis, "rss_load", "rss_mb"), "mb"),
        "rss_ray": fmt(dig(ray, "rss_load", "rss_mb"), "mb"),
        "rss_ratio": fmt(h["memory"]["ratio"], "x"),
        "pss_cis": fmt(dig(cis, "rss_load", "pss_mb"), "mb"),
        "pss_ray": fmt(dig(ray, "rss_load", "pss_mb"), "mb"),
        "procs_cis": str(dig(cis, "rss_load", "processes") or "pending"),
        "procs_ray": str(dig(ray, "rss_load", "processes") or "pending"),
        "startup_cis": fmt(cis.get("startup_s"), "s"),
        "startup_ray": fmt(ray.get("startup_s"), "s"),
        "startup_ratio": fmt(h["startup"]["ratio"], "x"),
        "http_p50_cis": fmt(dig(http, "light_forced", "p50_s"), "ms"),
        "http_p50_ray": fmt(dig(rhttp, "light_forced", "p50_s"), "ms"),
        "http_rate_cis": fmt(http.get("largest_rate"), "rate"),
        "http_rate_ray": fmt(rhttp.get("largest_rate"), "rate"),
        "door_p50": fmt(h["door_p50_mlserver"]["cis"], "ms"),
        "door_p50_binary": fmt(h["door_p50_kserve"]["cis"], "ms"),
        "kserve_p50": fmt(h["door_p50_kserve"]["peer"], "ms"),
        "mlserver_p50": fmt(h["door_p50_mlserver"]["peer"], "ms"),
        "door_rate": fmt(h["door_rate_mlserver"]["cis"], "rate"),
        "door_rate_binary": fmt(h["door_rate_kserve"]["cis"], "rate"),
        "kserve_rate": fmt(h["door_rate_kserve"]["peer"], "rate"),
        "mlserver_rate": fmt(h["door_rate_mlserver"]["peer"], "rate"),
        "one_tier_native_p50": fmt(dig(one, "cis", "native", "light", "p50_s"), "ms"),
        "one_tier_native_rate": fmt(dig(one, "cis", "native", "largest_rate"), "rate"),
        "door_p50_spin": fmt(dig(one, "cis", "http_binary_spin", "light", "p50_s"), "ms"),
        "null_p50": fmt(dig(one, "null", "light", "p50_s"), "ms"),
        "null_p50_binary": fmt(dig(one, "null_binary", "light", "p50_s"), "ms"),
        "null_rate": fmt(dig(one, "null", "largest_rate"), "rate"),
        "null_rate_binary": fmt(dig(one, "null_binary", "largest_rate"), "rate"),
        "client_cpu": fmt(dig(one, "null", "cost", "client_cpu_ms"), "cpu"),
        "client_cpu_binary": fmt(dig(one, "null_binary", "cost", "client_cpu_ms"), "cpu"),
        "server_cpu_cis": fmt(dig(one, "cis", "http", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_cis_binary": fmt(dig(one, "cis", "http_binary", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_cis_native": fmt(dig(one, "cis", "native", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_kserve": fmt(dig(one, "kserve", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_mlserver": fmt(dig(one, "mlserver_workers0", "cost", "server_cpu_ms"), "cpu"),
        "cost_rate": fmt(next((dig(p, "cost", "rate") for p in one.values() if dig(p, "cost", "rate")), None), "rate"),
        "verdict": verdict(h),
        "peer_ahead": peer_ahead(h),
        "stages_alone": fmt(dig(one, "stages_alone", "p50_s"), "ms"),
        "floor": (floors(one) or {}).get("text", "pending"),
        "stages_alone_b2b": fmt(dig(one, "stages_alone", "back_to_back", "p50_s"), "ms"),
        **{f"above_floor_{k}": fmt(v, "ms") for k, v in ((floors(one) or {}).get("above") or {}).items()},
    }  # fmt: skip
    for who, p in (("cis", nat), ("ray", rnat)):
        o = p.get("overload_2x") or {}
        f[f"overload_{who}"] = (
            f"{o['answered']:,} answered, {o['refused']:,} refused, {o['timed_out']:,} timed out of "
            f"{o['requests']:,}; RSS {o['rss_before_mb']:,.0f} -> {o['rss_after_mb']:,.0f} MB"
            if o else "pending"
        )
    for name in ("digits", "cifar10"):
        a = agree.get(name)
        f[f"agree_{name}"] = (f"{min(a['same_class'], a['same_exit'], a['same_node'])}/{a['samples']}"
                              if a else "pending")  # fmt: skip
    return f


MARK = re.compile(r"<!--peers (?P<key>\w+)-->(?P<value>.*?)<!--/peers-->", re.S)


DOCS = (REPO / "docs" / "runtime.md", REPO / "README.md")


def fill_docs(r: dict, paths: tuple[Path, ...] = DOCS) -> int:
    """Write the figures into the docs where ``<!--peers NAME-->...<!--/peers-->`` marks them; how many."""
    f = figures(r)
    n = 0
    for path in paths:
        text = path.read_text()
        unknown = sorted({m["key"] for m in MARK.finditer(text)} - set(f))
        if unknown:
            raise SystemExit(f"peers: {path}: unknown figure(s) {', '.join(unknown)}; expected one of {', '.join(f)}")
        new, k = MARK.subn(lambda m: f"<!--peers {m['key']}-->{f[m['key']]}<!--/peers-->", text)
        path.write_text(new)
        n += k
    return n


def _tree_row(label: str, p: dict) -> str:
    if "pending" in p:
        return f"| {label} | {p['pending']} | | | | | | |"
    o = p.get("overload_2x") or {}
    cells = [fmt(dig(p, phase, q), "ms") for phase in ("light_forced", "light_spec") for q in ("p50_s", "p99_s")]
    cells.append(fmt(p.get("largest_rate"), "rate"))
    if o:
        cells += [f"{o['answered']} / {o['refused']} / {o['timed_out']} of {o['requests']} at {o['rate']:.0f}/s",
                  f"{o['rss_before_mb']:.0f} -> {o['rss_after_mb']:.0f} MB"]  # fmt: skip
    else:
        cells += ["-", "-"]
    return f"| {label} | " + " | ".join(cells) + " |"


def _one_tier_row(label: str, p: dict | None) -> str:
    why = next((p[k] for k in ("pending", "not_installed", "failed") if p and k in p), None)
    if p is None or why:
        return f"| {label} | {why or 'not measured'} | | | | | | | |"
    given = lambda key, kind: fmt(p[key], kind) if key in p else "-"  # noqa: E731  (a row measured in part)
    cells = [fmt(dig(p, "light", "p50_s"), "ms"), fmt(dig(p, "light", "p99_s"), "ms"), given("largest_rate", "rate"),
             fmt(dig(p, "cost", "client_cpu_ms"), "cpu"), fmt(dig(p, "cost", "server_cpu_ms"), "cpu"),
             given("startup_s", "s"), given("rss_rest", "mb"), given("rss_peak", "mb")]  # fmt: skip
    return f"| {label} | " + " | ".join(cells) + " |"


ONE_TIER_ROWS = (  # (label, keys into the one-tier result)
    ("null endpoint, JSON (the client's floor)", ("null",)),
    ("null endpoint, binary (the client's floor)", ("null_binary",)),
    ("cis --node cloud, cis.Client (reference, not HTTP)", ("cis", "native")),
    ("cis front door, JSON (as MLServer)", ("cis", "http")),
    ("cis front door, binary (as KServe)", ("cis", "http_binary")),
    ("cis front door, binary, --spin (its core busy-polled: not compared)", ("cis", "http_binary_spin")),
)


def one_tier_markdown(r: dict) -> list[str]:
    one = r.get("single", {})
    pin = one.get("pinning")
    where = (f"The load generator ran on core {pin['load_generator']}, every server on cores {pin['servers']} "
             "(taskset)." if pin else "The load generator and the servers shared every core (no pinning).")  # fmt: skip
    rate = next((dig(p, "cost", "rate") for p in one.values() if dig(p, "cost", "rate")), None)
    lines = ["", "## One tier: the cloud node's stages behind cis, KServe and MLServer (tritonclient HTTP)", "",
             f"{where} CPU per request: user + system time of the load generator's process (client) and of every "
             f"process of the server (server), over a run at {fmt(rate, 'rate')}, divided by the answers.", "",
             "| server | p50 | p99 | largest rate, p99 < 100 ms | client CPU / request | server CPU / request "
             "| start-up | RSS at rest | RSS peak |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [_one_tier_row(label, dig(one, *keys)) for label, keys in ONE_TIER_ROWS if dig(one, *keys)]
    lines += [_one_tier_row(f"{k} ({p.get('encoding', '-')})", p) for k, p in one.items()
              if k not in ("cis", "null", "null_binary", "pinning", "stages_alone")]  # fmt: skip
    others = {k: p["others_cores"] for k, p in _one_tier_results(one) if p.get("others_cores") is not None}
    if others:
        lines += ["", "Other processes on the machine meanwhile, cores used on average: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in others.items()) + "."]  # fmt: skip
    floor = floors(one)
    if floor:
        lines += ["", f"The floor of every HTTP p50 here: the client alone (the null endpoint's p50) plus the stages "
                  f"alone (onnxruntime and the decision, one sample at a time in the load generator's process, spaced "
                  f"as the light load: {fmt(dig(one, 'stages_alone', 'p50_s'), 'ms')}; back to back "
                  f"{fmt(dig(one, 'stages_alone', 'back_to_back', 'p50_s'), 'ms')}): {floor['text']}."]  # fmt: skip
    return lines


def _one_tier_results(one: dict) -> list[tuple[str, dict]]:
    """(name, result) of every one-tier row measured."""
    rows = [(k, p) for k, p in one.items() if k not in ("cis", "pinning", "stages_alone") and isinstance(p, dict)]
    return [*((f"cis {k}", p) for k, p in (one.get("cis") or {}).items() if isinstance(p, dict)), *rows]


def floors(one: dict) -> dict | None:
    """The best p50 any server could give with this client and these stages, per encoding, and what that best
    would be as a ratio of each peer's p50 (a goal below it cannot be met by the server alone)."""
    stages = dig(one, "stages_alone", "p50_s")
    json_floor, bin_floor = dig(one, "null", "light", "p50_s"), dig(one, "null_binary", "light", "p50_s")
    if stages is None or json_floor is None or bin_floor is None:
        return None
    json_floor, bin_floor = json_floor + stages, bin_floor + stages
    ks = ratio(bin_floor, dig(one, "kserve", "light", "p50_s"))
    ml = ratio(json_floor, best_of(one, "mlserver", ("light", "p50_s")))
    text = (f"{fmt(bin_floor, 'ms')} with binary input ({fmt(ks, 'x')} of KServe's p50), {fmt(json_floor, 'ms')} "
            f"with JSON ({fmt(ml, 'x')} of MLServer's)")  # fmt: skip
    above = {"cis_binary": (dig(one, "cis", "http_binary", "light", "p50_s"), bin_floor),
             "kserve": (dig(one, "kserve", "light", "p50_s"), bin_floor),
             "cis_json": (dig(one, "cis", "http", "light", "p50_s"), json_floor),
             "mlserver": (best_of(one, "mlserver", ("light", "p50_s")), json_floor)}  # fmt: skip
    over = {k: None if v is None else v - f for k, (v, f) in above.items()}
    return {"binary_s": bin_floor, "json_s": json_floor, "kserve_ratio": ks, "mlserver_ratio": ml, "text": text,
            "above": over}


def markdown(r: dict) -> list[str]:
    v, m = r["versions"], r["machine"]
    smoke = " -- QUICK SMOKE RUN, not a result" if r["quick"] else ""
    load = ", ".join(f"{x:.1f}" for x in m["load_avg"])
    lines = [
        f"# cis against its peers (issue 34){smoke}",
        "",
        f"{m['cpus']} cores, load average {load} at the start, {r['date']}, {r['seconds'] / 60:.1f} min. "
        f"Timed bundle: `{r['bundle']}`. Versions: cis {v.get('cis')}, Ray {v.get('ray')}, KServe "
        f"{dig(v, 'kserve', 'kserve')}, MLServer {dig(v, 'mlserver', 'mlserver')}, tritonclient "
        f"{v.get('tritonclient')}, onnxruntime {v.get('onnxruntime')}, Python {v.get('python')}.",
        "",
        *(["Run in two windows (`--only tree`, `--only one-tier`, then `--merge`): " + "; ".join(
            f"{name} {p['date']}, load average {p['machine']['load_avg'][0]:.1f} at its start, "
            f"{p['seconds'] / 60:.1f} min" for name, p in r["parts"].items()) + ".", ""] if r.get("parts") else []),
        "## The goals",
        "",
        "| figure | cis | peer | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for key, h in r["headline"].items():
        kind = "ms" if "p50" in key else "rate" if "rate" in key else "mb" if key == "memory" else "s"
        met = h.get("pending") or {True: "yes", False: "**no**", None: "-"}[h["met"]]
        cells = [h["what"], fmt(h["cis"], kind), fmt(h["peer"], kind), fmt(h["ratio"], "x"), h["goal"], met]
        lines.append("| " + " | ".join(cells) + " |")
    if r.get("tree"):
        lines += ["", "## The tree: paper-7, batch 1", "",
                  "| path | p50 forced | p99 forced | p50 thresholds | p99 thresholds | largest rate, p99 < 100 ms "
                  "| 2x that rate: answered / refused / timed out | RSS before -> after 2x |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for who, label in (("cis", "cis"), ("ray", "Ray Serve")):
            lines += [_tree_row(f"{label} {path}", p) for path, p in (r["tree"][who].get("paths") or {}).items()]
        lines += ["", "## Memory and start-up", "",
                  "| system | processes | RSS at rest | RSS under load | PSS under load | start-up to first answer |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for who, label in (("cis", "cis serve --all"), ("ray", "Ray Serve app")):
            t = r["tree"][who]
            cells = [label, str(dig(t, "rss_load", "processes")), fmt(dig(t, "rss_rest", "rss_mb"), "mb"),
                     fmt(dig(t, "rss_load", "rss_mb"), "mb"), fmt(dig(t, "rss_load", "pss_mb"), "mb"),
                     fmt(t.get("startup_s"), "s")]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        for who in ("cis", "ray"):
            rows = sorted(dig(r["tree"][who], "rss_load", "per_process") or [], key=lambda p: -p["rss_mb"])
            each = "; ".join(f"`{p['name']}` {p['rss_mb']:.0f} / {p['pss_mb'] or 0:.0f}" for p in rows)
            lines += ["", f"Processes of {who} under load (RSS / PSS, MB): {each}"]
        lines += ["", "## Ray Serve configurations tried (handle path)", "",
                  "| max_batch_size | batch_wait_timeout_s | p50 forced | p50 thresholds | largest rate |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for c in r["tree"]["ray"].get("configs_tried", []):
            cells = [str(c["max_batch_size"]), str(c["batch_wait_timeout_s"]),
                     fmt(dig(c, "light_forced", "p50_s"), "ms"), fmt(dig(c, "light_spec", "p50_s"), "ms"),
                     fmt(c["largest_rate"], "rate")]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    if r.get("single"):
        lines += one_tier_markdown(r)
    lines += ["", "## The Ray Serve app answers what cis answers", ""] if r.get("tree") else []
    for name, a in (dig(r, "tree", "ray", "agreement") or {}).items():
        lines.append(f"- {name}: {a['samples']} samples one at a time; same class {a['same_class']}, same exit "
                     f"{a['same_exit']}, same serving node {a['same_node']}; largest confidence gap "
                     f"{a['max_confidence_gap']}; served per exit {a['served_share_per_exit']}")  # fmt: skip
    lines += ["", "## Notes", "", *[f"- {n}" for n in r["notes"]]]
    return lines


NOTES = [
    "Triton Inference Server itself is not compared: its server is not a Python package and is not on the package "
    "index; its HTTP client (tritonclient) drives every HTTP path here.",
    "cis runs with --no-cap: the Ray Serve app has no transfer cap (a cis node past its cap would serve here, "
    "flagged capped, which is cheaper). Both use the bundle's per-node thresholds; 'forced' is threshold inf below "
    "the root.",
    "One load generator (open loop, Poisson arrivals, one sample per request) in one process drives every system: "
    "asyncio for cis.Client and Ray's handle; for every HTTP path the same tritonclient client "
    "(tritonclient.http, its synchronous geventhttpclient client, a greenlet per request in flight), each sample's "
    "request body made once with tritonclient's generate_request_body before the timed run and posted as infer "
    "posts it. A rate is held when every request was answered, p99 < 100 ms and the generator kept up.",
    "One tier: the load generator runs on a core of its own and every server on the others (taskset; --no-pin: "
    "not); a null endpoint (bench/peers/null_oip.py: a canned answer, no work) measures the client alone, and "
    "the stages alone are timed in the load generator's process: together, the floor of every HTTP p50. CPU per "
    "request is each side's own user + system time (the kernel's accounting) over a run at a fixed rate.",
    "Ray Serve: dashboard off (Ray still starts its dashboard head process for its APIs), Ray on loopback, "
    "replicas num_cpus=0 (seven replicas on few cores), "
    "max_ongoing_requests twice the batch; HTTP ingress on the devices deployment (one proxy actor).",
    "One tier: tritonclient sends the input as JSON to MLServer (it has no binary tensor extension) and with "
    "Triton's binary extension to KServe; cis's front door is measured both ways and compared like for like. "
    "KServe: one uvicorn worker, gRPC off. MLServer: parallel_workers 0 (the model in the server's process) and 1 "
    "(its default: a separate inference process), metrics server off. Both run a custom model (no mlserver-onnx on "
    "the package index) calling the same onnxruntime stages (bench/peers/node_stages.py).",
    "Memory: RSS sums count pages shared between processes once per process; PSS splits them. A system's processes "
    "are the process started and all its descendants (Ray: its driver, GCS, raylet, agents, controller, proxy, "
    "replicas and idle workers).",
]


def merge(tree: dict, one: dict) -> dict:
    """One result from a ``--only tree`` run and a ``--only one-tier`` run: each section as its run measured it,
    each run's date, machine and length kept (``parts``); the goals from both."""
    r = {**tree, "single": one["single"]}
    r["parts"] = {name: {k: part.get(k) for k in ("date", "machine", "seconds", "bundle", "versions")}
                  for name, part in (("tree", tree), ("one-tier", one))}  # fmt: skip
    r["seconds"] = tree["seconds"] + one["seconds"]
    r["date"] = f"{tree['date']} (tree), {one['date']} (one tier)"
    r["headline"] = headline(r)
    return r


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.setup:
        return subprocess.run(["bash", str(REPO / "scripts" / "peers_setup.sh")]).returncode
    name = ("peers-quick" if args.quick else "peers") + (f"-{args.only}" if args.only else "")
    if args.merge:
        r = merge(*(json.loads((RESULTS / f"{name}-{part}.json").read_text()) for part in ("tree", "one-tier")))
        write_results(name, r, markdown(r))
        if not r["quick"]:
            print(f"docs/runtime.md and README.md: {fill_docs(r)} figures", file=sys.stderr)
        return 0
    if args.report:
        r = json.loads((Path(args.out) if args.out else RESULTS / f"{name}.json").read_text())
        write_results(name, r, markdown(r))
        if not r["quick"] and r.get("tree"):
            print(f"docs/runtime.md and README.md: {fill_docs(r)} figures", file=sys.stderr)
        return 0
    missing = missing_peers(http=not args.p50_only)  # --p50-only: the handle path alone, no HTTP client
    if missing:
        print(f"peers: needs {', '.join(missing)}: bash scripts/peers_setup.sh (or pip install '.[peers]')",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    if args.profile:
        out = profile(args)
        tag = f"-{args.profile_server}" if args.profile == "one-tier" else ""
        write_results(f"peers-profile-{args.profile}-{args.profile_path}{tag}", out, profile_markdown(out))
        return 0
    if args.p50_only:
        if not args.bundle:
            args.bundle = str(cifar_bundle(work, args.data))
        out = p50_only(args)
        path = Path(args.out or RESULTS / "peers-p50.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2, default=float))
        print(json.dumps({"p50_cis_s": out["cis"]["light_forced"]["p50_s"],
                          "p50_ray_s": out["ray"]["light_forced"]["p50_s"], "ratio": out["p50_ratio"]}))  # fmt: skip
        return 0
    start = time.perf_counter()
    r: dict = {"benchmark": "peers", "quick": args.quick, "machine": machine(), "versions": versions(),
               "date": time.strftime("%Y-%m-%d %H:%M"), "notes": NOTES}  # fmt: skip
    digits = digits_bundle(work)
    agree = {"digits": (digits, inputs_of(digits, work, args.agree_n))}
    if not args.quick and args.only != "one-tier":
        cifar = cifar_bundle(work, args.data)
        agree["cifar10"] = (cifar, inputs_of(cifar, work, args.agree_n))
    bundle = Path(args.bundle) if args.bundle else digits if args.quick else cifar_bundle(work, args.data)
    r["bundle"] = str(bundle)
    x = inputs_of(bundle, work, 2000, args.inputs)
    nodes = entry_nodes(bundle, len(x))
    door = cis_has_front_door()
    r["front_door"] = door or PENDING_DOOR
    r["ray_configs"] = args.configs
    print(f"peers: timing {bundle}; front door {'yes' if door else 'pending'}", file=sys.stderr)
    if args.only != "one-tier":
        r["tree"] = {"cis": tree_cis(bundle, x, nodes, args, door), "ray": tree_ray(bundle, x, nodes, args, agree)}
    if args.only != "tree":
        r["single"] = single(bundle, x, args, door)
    r["headline"] = headline(r)
    r["seconds"] = time.perf_counter() - start
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=2, default=float))
    else:
        write_results(name, r, markdown(r))
    if not args.quick and not args.out and not args.bundle and not args.only:
        print(f"docs/runtime.md and README.md: {fill_docs(r)} figures", file=sys.stderr)
    for key, h in r["headline"].items():
        print(f"{key:22s} cis {h['cis']}  peer {h['peer']}  ratio {h['ratio']}  goal {h['goal']}  met {h['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
