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
import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.harness import REPO, RESULTS, Served, ensure_cifar, machine, write_results
from bench.peers.loadgen import CisNative, OipHttp, RayHandle, drive, drive_sync, holds, offsets_of
from bench.peers.report import PENDING_DOOR, best_ray, fill_docs, fmt, headline, markdown, ratio
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

P99_LIMIT = 0.100
# Ray Serve's modes: the environment its processes (the server's and this driver's: Serve reads it at import) start
# with. "throughput": Ray's throughput-optimized serving (gRPC between replicas by default, direct ingress, ...)
RAY_MODES = {"default": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}, "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}}
LIGHT_RATE = 25.0


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
    ap.add_argument("--ray-modes", default=None,
                    help="Ray Serve's modes, each measured in a driver process of its own: default, throughput "
                         "(RAY_SERVE_THROUGHPUT_OPTIMIZED=1, Ray's throughput-optimized serving); the best of them is "
                         "the comparison (default both; --quick default)")
    ap.add_argument("--ray-only", metavar="MODE", help=argparse.SUPPRESS)  # one mode's tree_ray, in a child process
    ap.add_argument("--ray-configs", default=None,
                    help="Ray batching tried in each mode, MAX_BATCH/WAIT_S,... (default 10/0.01,1/0,32/0; --quick "
                         "32/0; --p50-only 32/0,10/0.01,1/0)")
    ap.add_argument("--out", default=None, help="result file (default results/peers.json, peers-quick.json)")
    args = ap.parse_args(argv)
    default = "32/0,10/0.01,1/0" if args.p50_only else "32/0" if args.quick else "10/0.01,1/0,32/0"
    text = args.ray_configs or default
    args.configs = [{"max_batch_size": int(b), "batch_wait_timeout_s": float(w)}
                    for b, w in (c.split("/") for c in text.split(","))]  # fmt: skip
    args.modes = (args.ray_modes or ("default" if args.quick else ",".join(RAY_MODES))).split(",")
    unknown = sorted(set(args.modes) - set(RAY_MODES))
    if unknown:
        ap.error(f"--ray-modes: unknown {', '.join(unknown)}; expected some of {', '.join(RAY_MODES)}")
    args.light_n = 20 if args.quick else 200
    args.step_s = 0.5 if args.quick else 3.0
    args.sweep = {"start": 50.0, "cap": 100.0, "bisect": 0, "floor": 25.0} if args.quick else {}  # quick: 2-3 steps
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


@functools.cache
def driver_loop() -> asyncio.AbstractEventLoop:
    """One event loop for every asyncio load of this process, running all the time in a thread of its own. Ray
    Serve's throughput-optimized mode runs a driver handle's router, and the long-poll client that tells it of new
    replicas, on the event loop it is first used on (the default mode gives them a loop of their own): a loop per
    load (``asyncio.run``) would leave the handle on a closed loop, and a loop that runs only during loads drops
    the news of a redeploy between them."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="driver-loop", daemon=True).start()
    return loop


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

    return asyncio.run_coroutine_threadsafe(go(), driver_loop()).result()


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
    if ray.deployed[0] != str(bundle) or any(k == "threshold" for k, _ in ray.deployed[1]):
        ray.redeploy(bundle)  # the spec's thresholds (any batching: it does not change an answer)
    theirs = run_load(ray_native(ray), x, nodes, None, timeout=10.0, keep=True).outcomes
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
    mode = args.ray_only or "default"
    ray = RayServer(bundle, work / f"ray-{mode}.log", cmd, first)
    out: dict = {"command": "python -m bench.peers.ray_serve_cis --bundle BUNDLE " + " ".join(cmd), "mode": mode,
                 "env": RAY_MODES[mode], "serve_constants": serve_constants()}  # fmt: skip
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


def serve_constants() -> dict:
    """What Ray Serve read from this driver's environment at import: its throughput-optimized mode and what that
    mode turns on (the handle path's gRPC, direct ingress)."""
    from ray.serve._private import constants as c

    names = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_USE_GRPC_BY_DEFAULT", "RAY_SERVE_ENABLE_DIRECT_INGRESS",
             "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD")
    return {k: getattr(c, k, None) for k in names}


def ray_modes(args) -> dict:
    """Each of Ray Serve's modes (``--ray-modes``) measured by :func:`tree_ray` in a driver process of its own,
    started with the mode's environment (Serve reads it at import, in the server's processes and in the driver's
    handles), one after another: {mode: its result, or why it failed}."""
    configs = ",".join(f"{c['max_batch_size']}/{c['batch_wait_timeout_s']:g}" for c in args.configs)
    out = {}
    for mode in args.modes:
        path = Path(args.work) / f"ray-{mode}.json"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "bench.peers", "--ray-only", mode, "--out", str(path), "--work", args.work,
               "--data", args.data, "--ray-configs", configs, *(["--quick"] if args.quick else []),
               *(["--bundle", args.bundle] if args.bundle else []), *(["--inputs", args.inputs] if args.inputs else [])]
        print(f"peers: Ray Serve, {mode} mode", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, env={**os.environ, **RAY_MODES[mode]}, cwd=REPO)
        out[mode] = json.loads(path.read_text()) if done.returncode == 0 and path.is_file() else {
            "failed": f"exit {done.returncode}; see {Path(args.work) / f'ray-{mode}.log'}"}  # fmt: skip
    return out


def ray_only(args, bundle: Path, x: np.ndarray, nodes: list[str], agree: dict) -> int:
    """``--ray-only MODE``: :func:`tree_ray` in this process, started with the mode's environment; --out."""
    want = RAY_MODES[args.ray_only]
    got = {k: os.environ.get(k) for k in want}
    if got != want:
        raise SystemExit(f"peers: --ray-only {args.ray_only} needs the environment {want}; this process has {got}")
    Path(args.out).write_text(json.dumps(tree_ray(bundle, x, nodes, args, agree), indent=2, default=float))
    return 0


def ray_native(ray: RayServer) -> Callable[[], RayHandle]:
    return lambda: RayHandle(ray.handle)


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
        asyncio.run_coroutine_threadsafe(transport.close(), driver_loop()).result()
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


NOTES = [
    "Triton Inference Server itself is not compared: its server is not a Python package and is not on the package "
    "index; its HTTP client (tritonclient) drives every HTTP path here.",
    "cis runs with --no-cap: the Ray Serve app has no transfer cap (a cis node past its cap would serve here, "
    "flagged capped, which is cheaper). Both use the bundle's per-node thresholds; 'forced' is threshold inf below "
    "the root.",
    "One load generator (open loop, Poisson arrivals, one sample per request) in one process drives every system: "
    "the load generator of cis bench (cis.runtime.loadgen, asyncio) for cis.Client and Ray's handle; for every "
    "HTTP path the same tritonclient client "
    "(tritonclient.http, its synchronous geventhttpclient client, a greenlet per request in flight), each sample's "
    "request body made once with tritonclient's generate_request_body before the timed run and posted as infer "
    "posts it. A rate is held when every request was answered, p99 < 100 ms and the generator kept up.",
    "One tier: the load generator runs on a core of its own and every server on the others (taskset; --no-pin: "
    "not); a null endpoint (bench/peers/null_oip.py: a canned answer, no work) measures the client alone, and "
    "the stages alone are timed in the load generator's process: together, the floor of every HTTP p50. CPU per "
    "request is each side's own user + system time (the kernel's accounting) over a run at a fixed rate.",
    "Ray Serve in each of its modes (--ray-modes: default, and throughput-optimized with "
    "RAY_SERVE_THROUGHPUT_OPTIMIZED=1), each in a driver process of its own started with the mode's environment (Serve "
    "reads it at import: in the server's processes and in the driver's handles); every Ray figure compared is the "
    "best of its modes, and which mode gave it is said.",
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
    # each system's version from the run that measured it: a window without the peers' venvs knows none of theirs
    r["versions"] = {**{k: v for k, v in one.get("versions", {}).items() if v is not None},
                     **{k: v for k, v in tree.get("versions", {}).items() if v is not None}}  # fmt: skip
    r["date"] = f"{tree['date']} (tree), {one['date']} (one tier)"
    r["headline"] = headline(r)
    return r


def from_files(args, name: str) -> int:
    """``--merge`` (peers.json from the tree's and the one tier's runs) or ``--report`` (from the JSON again):
    peers.md, and the docs' figures of a full run."""
    if args.merge:
        r = merge(*(json.loads((RESULTS / f"{name}-{part}.json").read_text()) for part in ("tree", "one-tier")))
    else:
        r = json.loads((Path(args.out) if args.out else RESULTS / f"{name}.json").read_text())
    write_results(name, r, markdown(r))
    if not r["quick"] and r.get("tree"):
        print(f"docs/runtime.md and README.md: {fill_docs(r)} figures", file=sys.stderr)
    return 0


def partial_run(args, work: Path) -> int:
    """``--profile`` (py-spy under load) or ``--p50-only`` (the GPU machine's p50 through three tiers)."""
    if args.profile:
        out = profile(args)
        tag = f"-{args.profile_server}" if args.profile == "one-tier" else ""
        write_results(f"peers-profile-{args.profile}-{args.profile_path}{tag}", out, profile_markdown(out))
        return 0
    if not args.bundle:
        args.bundle = str(cifar_bundle(work, args.data))
    out = p50_only(args)
    path = Path(args.out or RESULTS / "peers-p50.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps({"p50_cis_s": out["cis"]["light_forced"]["p50_s"],
                      "p50_ray_s": out["ray"]["light_forced"]["p50_s"], "ratio": out["p50_ratio"]}))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.setup:
        return subprocess.run(["bash", str(REPO / "scripts" / "peers_setup.sh")]).returncode
    name = ("peers-quick" if args.quick else "peers") + (f"-{args.only}" if args.only else "")
    if args.merge or args.report:
        return from_files(args, name)
    missing = missing_peers(http=not args.p50_only)  # --p50-only: the handle path alone, no HTTP client
    if missing:
        print(f"peers: needs {', '.join(missing)}: bash scripts/peers_setup.sh (or pip install '.[peers]')",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    if args.profile or args.p50_only:
        return partial_run(args, work)
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
    r["ray_configs"], r["ray_modes"] = args.configs, args.modes
    print(f"peers: timing {bundle}; front door {'yes' if door else 'pending'}", file=sys.stderr)
    if args.ray_only:
        return ray_only(args, bundle, x, nodes, agree)
    if args.only != "one-tier":
        r["tree"] = {"cis": tree_cis(bundle, x, nodes, args, door), "ray_modes": ray_modes(args)}
        r["tree"]["ray"] = best_ray(r["tree"]["ray_modes"])
        r["machine_end"] = machine()
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
