"""The whole pipeline in one call (``cis demo``): train, export, serve, replay, simulate, report.

    result = run_demo("cis-demo")          # DIR/report.md, DIR/report.json, plots, every artefact

On the built-in defaults (digits, paper-7, 60-30-10, serving-rate weights) with
nothing to download. The phases, each one progress line on stderr:

1. spec      the built-in topology at the request rate (``--rate``: every arrival
             rate and transfer cap scaled together, so the rate calculus keeps its shares);
2. train     ``training.run.train_run`` (Algorithm 1) into DIR/run;
3. export    ``export.bundle_writer.export_bundle`` into DIR/bundle;
4. offline   the bundle's graphs on the test samples (``cis.stages.run_chain``) and
             ``cis.policy.evaluate_cis(policy=bundle.policy)``: the threshold rule the
             runtime applies, on the same samples, with the same entry nodes;
5. serve     ``cis.runtime.launcher.launch``: every node its own process on free loopback
             ports; then the per-hop messaging cost is measured once (ping round trips,
             root round trips) for the simulator;
6. replay    ``cis.runtime.client.infer_spread``: sample i to the leaf
             ``cis.policy.assign_entries`` gives it, at i / rate seconds (what
             ``cis infer --spec --rate`` does);
7. stop      ``Cluster.stop`` — always, also on an error, Ctrl-C or SIGTERM;
8. simulate  ``sim.run.simulate`` with the bundle, the same spec, the same arrival times
             (a trace), the same samples at the same entry nodes (the test-sample
             profile replayed row by row) and the measured messaging cost; and once more
             the way ``cis simulate --bundle`` runs by default (its validation profile,
             Poisson arrivals, the spec's links) for reference;
9. report    :mod:`cis.report` (the same writer as ``cis report``).

torch is imported inside the training and export phases only (``cis`` never imports it
at module level).
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cis.errors import CisError

DEFAULT_ROUNDS = 12
QUICK_ROUNDS = 4
QUICK_N = 200
MARKER = ".cis-demo"  # a folder holding this file may be replaced by another demo run
WINDOW = 32  # requests in flight per leaf (as cis infer)

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pure helpers


def demo_spec(topology: str, serving: str, rate: float | None):
    """The built-in topology under ``serving``; ``rate`` requests/s in total (default: the
    topology's). Arrival rates and transfer caps scale together, so shares stay the calculus'."""
    from cis.topologies import DEFAULT_TOTAL_RATE, make_spec

    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise CisError(f"demo: --rate is {rate}; expected requests per second > 0")
    return make_spec(topology, serving, total_rate=rate or DEFAULT_TOTAL_RATE)


def total_rate(spec) -> float:
    return float(sum(n.arrival_rate for n in spec.nodes))


def replay_indices(n: int, available: int) -> np.ndarray:
    """Sample indices for n requests: the test set in order, cycled when n is larger."""
    return np.arange(n) % available


def replay_trace(entries: dict[str, np.ndarray], rate: float) -> dict[str, list[float]]:
    """The times ``infer_spread`` sends at: request i (in index order) at i / rate."""
    return {nid: (np.asarray(idx, float) / rate).tolist() for nid, idx in entries.items()}


def write_trace(path: Path, trace: dict[str, list[float]]) -> None:
    rows = sorted((t, nid) for nid, ts in trace.items() for t in ts)
    path.write_text("# node,timestamp (s): the runtime replay's send times\n" + "".join(f"{nid},{t:.9f}\n" for t, nid in rows))


def overheads(ping_rtts: list[float], root_rtts: list[float], root_stage_seconds: float) -> dict[str, Any]:
    """Messaging cost for the simulator from round trips on the live cluster.

    A ping round trip (client -> node -> client, nothing run) is what every node
    visit costs in messaging (the request in, the reply out; ZeroMQ, Python and the
    OS waking the process): the simulator draws one of these samples per visit
    (``hop_rtt``). A one-sample request to the root (stages 1..E, no forward) costs
    a round trip plus the node's work: ``visit_overhead`` = its median minus a ping's
    minus the stages' batch-1 time from the bundle's profile (at least 0)."""
    ping = statistics.median(ping_rtts)
    root = statistics.median(root_rtts)
    return {
        "ping_rtt_s": ping,
        "ping_rtt_mean_s": statistics.fmean(ping_rtts),
        "root_rtt_s": root,
        "hop_rtt": [float(v) for v in ping_rtts],
        "visit_overhead": max(0.0, root - ping - root_stage_seconds),
    }


# ---------------------------------------------------------------- cluster probes


def ping_rtts(address: str, count: int = 30, warmup: int = 5, timeout: float = 2.0) -> list[float]:
    """Round trips of ping -> pong to one node (seconds), one at a time."""
    import zmq

    from cis.runtime import protocol as P

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    out = []
    try:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            P.send(sock, P.encode(P.PING, i + 1))
            while True:
                if not sock.poll(int(timeout * 1000)):
                    raise CisError(f"demo: no pong from {address} within {timeout:.0f} s")
                if P.decode(sock.recv_multipart()).kind == P.PONG:
                    break
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    finally:
        sock.close(0)
    return out


def root_rtts(address: str, x: np.ndarray, count: int = 30, warmup: int = 5) -> list[float]:
    """Round trips of one-sample requests to the root (it runs every stage and serves)."""
    from cis.runtime.client import Client

    out = []
    with Client(address, timeout=5.0) as c:
        for i in range(warmup + count):
            r = c.infer(x[i % len(x) : i % len(x) + 1])
            if i >= warmup:
                out.append(r.latency)
    return out


def warm_up(clients: dict, x: np.ndarray, per_client: int = 8) -> None:
    """A few requests through every leaf before anything is measured: sessions, sockets and
    connections are set up on first use (tens of ms), which no steady state has."""
    from cis.runtime.client import infer_spread

    k = min(per_client, len(x))
    xs = np.concatenate([x[:k]] * len(clients))
    infer_spread(clients, xs, {nid: np.arange(j * k, (j + 1) * k) for j, nid in enumerate(clients)}, 4, None, 10.0)


def _ping_loop(addresses: list[str], interval: float, stop, conn) -> None:
    rtts: list[float] = []
    conn.send("ready")
    while not stop.is_set():
        for addr in addresses:
            if stop.is_set():
                break
            try:
                rtts += ping_rtts(addr, count=1, warmup=0, timeout=2.0)
            except CisError:
                pass
            stop.wait(interval)
    conn.send(rtts)
    conn.close()


class Pinger:
    """Ping round trips to every node, round robin, from a separate process, while a load runs.

    On a machine shared with other work the cost of a message hop is mostly the OS
    waking a process, and that depends on how busy the machine is *then*; so the
    simulator's per-visit round trips are measured during the load itself (a ping
    costs a node microseconds). A process, not a thread: a thread would wait for
    the sender's GIL and time that too."""

    def __init__(self, addresses: list[str], interval: float = 0.01):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_ping_loop, args=(list(addresses), interval, self._stop, send), daemon=True)
        self.rtts: list[float] = []

    def __enter__(self) -> "Pinger":
        self._proc.start()
        if self._recv.poll(30):  # imports done: the load starts once the pinger runs
            self._recv.recv()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._recv.poll(10):
            self.rtts = self._recv.recv()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()


def measure_messaging(cluster, spec, bundle, x: np.ndarray) -> dict[str, Any]:
    """Ping round trips to every node (round robin) and one-sample round trips to the root, at rest."""
    root = next(nd.id for nd in spec.nodes if nd.parent is None)
    pings: list[float] = []
    for _ in range(2):
        for nd in spec.nodes:
            pings += ping_rtts(cluster.addresses[nd.id], count=10, warmup=1)
    stage_s = sum(bundle.latency_profile()[k][1] for k in range(1, bundle.num_exits + 1))
    return overheads(pings, root_rtts(cluster.addresses[root], x), stage_s)


def under_load(at_rest: dict[str, Any], rtts: list[float]) -> dict[str, Any]:
    """The messaging cost with the round trips measured during the load (when there are enough)."""
    if len(rtts) < 20:
        return {**at_rest, "measured": "at rest (too few pings during the load)"}
    return {
        **at_rest,
        "ping_rtt_at_rest_s": at_rest["ping_rtt_s"],
        "ping_rtt_s": statistics.median(rtts),
        "ping_rtt_mean_s": statistics.fmean(rtts),
        "hop_rtt": [float(v) for v in rtts],
        "measured": "during the load",
    }


# ---------------------------------------------------------------- the demo


class _Phases:
    def __init__(self, log: Log, total: int):
        self.log, self.total, self.k = log, total, 0
        self.seconds: dict[str, float] = {}

    def run(self, name: str, what: str, fn: Callable[[], Any]) -> Any:
        self.k += 1
        self.log(f"[{self.k}/{self.total}] {name}: {what} ...")
        t0 = time.perf_counter()
        out = fn()
        self.seconds[name] = time.perf_counter() - t0
        return out

    def done(self, line: str) -> None:
        name = list(self.seconds)[-1]
        self.log(f"      {line} ({self.seconds[name]:.1f} s)")


def _prepare(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise CisError(f"{out}: folder is not empty and holds no earlier demo; expected a new folder (or an old demo to replace) for --out")
        for sub in ("run", "bundle", "runtime", "sim", "sim-bundle", "plots"):
            if (out / sub).is_dir():
                shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by cis demo\n")


def _sigterm_as_interrupt() -> Callable[[], None]:
    """Turn SIGTERM into KeyboardInterrupt while the cluster runs, so it is stopped."""
    try:
        old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, old)


def run_demo(
    out: str | Path = "cis-demo",
    serving: str = "60-30-10",
    topology: str = "paper-7",
    rounds: int | None = None,
    rate: float | None = None,
    n: int | None = None,
    quick: bool = False,
    seed: int = 0,
    log: Log = _stderr,
) -> dict:
    """Run the pipeline into ``out``; returns the report (also DIR/report.json)."""
    from cis.bundle import load_bundle
    from cis.policy import assign_entries, evaluate_cis, exit_confidences, exit_correct
    from cis.rates import compute_rates
    from cis.report import build_report, write_report
    from cis.spec import write_spec
    from cis.stages import run_chain

    t_start = time.perf_counter()
    out = Path(out)
    rounds = rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS)
    if rounds < 1:
        raise CisError(f"demo: --rounds is {rounds}; expected an integer >= 1")
    if n is not None and n < 1:
        raise CisError(f"demo: --n is {n}; expected an integer >= 1")
    spec = demo_spec(topology, serving, rate)
    rate = total_rate(spec)
    _prepare(out)
    spec_file = out / "spec.toml"
    write_spec(spec, spec_file)
    ph = _Phases(log, 8)

    # ------------------------------------------------------------ train
    def train():
        from training.config import make_config
        from training.run import train_run

        config = make_config(None, {"dataset": "digits", "spec": str(spec_file), "strategy": "serving-rate", "rounds": rounds, "seed": seed})
        return train_run(config, out / "run", progress=False, log=lambda s: None)

    summary = ph.run("train", f"digits, {spec.name} {serving}, {rounds} rounds, serving-rate weights", train)
    ph.done("exit accuracy " + " ".join(f"{100 * a:.1f}%" for a in summary["test"]["exit_accuracy"].values()))

    # ------------------------------------------------------------ export
    def export():
        from export.bundle_writer import export_bundle

        return export_bundle(out / "run", out / "bundle", spec=spec)

    ph.run("export", "ONNX stages, thresholds, profiles", export)
    bundle = load_bundle(out / "bundle")
    ph.done(f"bundle with {bundle.num_exits} stages")

    # ------------------------------------------------------------ offline (the same test samples)
    def offline():
        from training.data import load_dataset

        test = load_dataset("digits", seed=seed).test
        idx = replay_indices(n or len(test.y), len(test.y))
        x, y = np.ascontiguousarray(test.x[idx]), test.y[idx]
        logits = run_chain(bundle, x)
        ev = evaluate_cis(spec, logits, y, policy=bundle.policy, seed=seed)
        return x, y, logits, ev

    x, y, logits, ev = ph.run("offline", "bundle graphs on the test set, threshold policy", offline)
    ph.done(f"{len(y)} samples, CIS accuracy {100 * ev.accuracy:.2f}%")
    entries = assign_entries(spec, len(y), seed)

    # ------------------------------------------------------------ serve, calibrate, replay, stop
    from cis.runtime.client import Client, infer_spread, summarize
    from cis.runtime.launcher import launch

    restore = _sigterm_as_interrupt()
    cluster = None
    try:
        cluster = ph.run("serve", f"{len(spec.nodes)} node processes on loopback", lambda: launch(out / "bundle", spec, spec_file=str(spec_file), free_ports=True, log_dir=str(out / "runtime" / "logs")))
        clients = {nid: Client(cluster.addresses[nid], timeout=30.0) for nid in entries}
        try:
            warm_up(clients, x)
            rest = measure_messaging(cluster, spec, bundle, x)
            ph.done(f"ready; at rest: ping round trip {1000 * rest['ping_rtt_s']:.2f} ms, one-sample root round trip {1000 * rest['root_rtt_s']:.2f} ms")
            t_replay = time.perf_counter()
            with Pinger([cluster.addresses[nd.id] for nd in spec.nodes]) as pinger:
                results = ph.run("replay", f"{len(y)} requests at {rate:g}/s through the leaves", lambda: infer_spread(clients, x, entries, WINDOW, rate, 30.0))
            replay_wall = time.perf_counter() - t_replay
            cost = under_load(rest, pinger.rtts)
        finally:
            for c in clients.values():
                c.close()
        rt = summarize(results, y)
        ph.done(f"{rt['samples_answered']} answered, accuracy {100 * rt.get('accuracy', float('nan')):.2f}%, errors {rt['errors'] or 'none'}; "
                f"{len(pinger.rtts)} pings meanwhile, round trip median {1000 * cost['ping_rtt_s']:.2f} ms, mean {1000 * cost['ping_rtt_mean_s']:.2f} ms")
    finally:
        if cluster is not None:
            ph.k += 1
            log(f"[{ph.k}/{ph.total}] stop: every node (SIGTERM) ...")
            t0 = time.perf_counter()
            codes = cluster.stop()
            ph.seconds["stop"] = time.perf_counter() - t0
            log(f"      {len(codes)} nodes exited with {sorted(set(codes.values()), key=str)} ({ph.seconds['stop']:.1f} s)")
        restore()
    write_runtime(out / "runtime", spec, results, entries, y, rt, cost, replay_wall)

    # ------------------------------------------------------------ simulate
    def simulate_both():
        from sim.config import SimConfig
        from sim.output import write_outputs
        from sim.run import simulate
        from sim.workload import Profile

        measure = bundle.policy.measure if bundle.policy is not None else spec.confidence
        conf = exit_confidences(logits, measure)
        correct = exit_correct(logits, y)
        E = spec.num_exits
        profile = Profile(np.stack([conf[e] for e in range(1, E + 1)], 1), np.stack([correct[e] for e in range(1, E + 1)], 1))
        (out / "sim").mkdir(parents=True, exist_ok=True)
        trace = out / "sim" / "trace.csv"
        write_trace(trace, replay_trace(entries, rate))
        config = SimConfig(
            requests=len(y), seed=seed, arrivals="trace", trace=str(trace), loopback=True,
            hop_rtt=tuple(cost["hop_rtt"]), visit_overhead=cost["visit_overhead"],
        )
        res = simulate(spec, config, bundle, profile=profile, rows={k: v.tolist() for k, v in entries.items()})
        write_outputs(out / "sim", res.summary, res.requests)
        ref = simulate(spec, SimConfig(requests=max(len(y), 2000), seed=seed), bundle)
        write_outputs(out / "sim-bundle", ref.summary, ref.requests)
        return res.summary, ref.summary

    sim, sim_ref = ph.run("simulate", "same load from the bundle's profiles (SimPy)", simulate_both)
    ph.done(f"accuracy {100 * (sim['accuracy'] or 0):.2f}%, latency p50 {1000 * sim['latency']['p50_s']:.2f} ms")

    # ------------------------------------------------------------ report
    calculus = compute_rates(spec).exit_share
    comparison = {
        "settings": {"dataset": "digits", "topology": topology, "serving": serving, "strategy": "serving-rate", "rounds": rounds,
                     "rate": rate, "requests": int(len(y)), "seed": seed, "quick": quick},
        "accuracy": {"offline": ev.accuracy, "runtime": rt.get("accuracy"), "sim": sim["accuracy"], "sim_bundle_profile": sim_ref["accuracy"]},
        "served_share": {
            "calculus": {str(e): float(s) for e, s in calculus.items()},
            "offline": {str(e): float(s) for e, s in ev.exit_shares.items()},
            "runtime": {str(e): float(rt.get("served_share_per_exit", {}).get(str(e), 0.0)) for e in calculus},
            "sim": {str(e): float(sim["exits"][str(e)]["share"] or 0.0) for e in calculus},
            "sim_bundle_profile": {str(e): float(sim_ref["exits"][str(e)]["share"] or 0.0) for e in calculus},
        },
        "messaging": cost,
        "timings_s": dict(ph.seconds),
    }
    (out / "comparison.json").write_text(json.dumps(comparison, indent=2))
    t0 = time.perf_counter()
    report = build_report(out)
    ph.seconds["report"] = 0.0
    report["timings_s"] = {**ph.seconds, "report": time.perf_counter() - t0, "total": time.perf_counter() - t_start}
    log(f"[8/8] report: {out / 'report.md'}, report.json, plots/ ...")
    write_report(report, out / "report.md")
    report["timings_s"]["report"] = time.perf_counter() - t0
    report["timings_s"]["total"] = time.perf_counter() - t_start
    comparison["timings_s"] = report["timings_s"]
    (out / "comparison.json").write_text(json.dumps(comparison, indent=2))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    log(f"      done in {report['timings_s']['total']:.1f} s")
    return report


def write_runtime(folder: Path, spec, results, entries: dict[str, np.ndarray], labels: np.ndarray, summary: dict, cost: dict, wall: float) -> None:
    """DIR/runtime: summary.json and requests.csv (one row per sample, as the simulator's)."""
    folder.mkdir(parents=True, exist_ok=True)
    entry_of = {int(i): nid for nid, idx in entries.items() for i in idx}
    lines = ["sample,entry,node,exit,correct,flags,latency_s\n"]
    for i, r in enumerate(results):
        if r is None or r.error is not None:
            lines.append(f"{i},{entry_of.get(i, '')},,0,-1,0,\n")
            continue
        lines.append(f"{i},{entry_of.get(i, '')},{r.served_by[0]},{int(r.exit[0])},{int(r.cls[0] == labels[i])},{int(r.flags[0])},{r.latency:.9f}\n")
    (folder / "requests.csv").write_text("".join(lines))
    (folder / "summary.json").write_text(json.dumps({**summary, "messaging": cost, "wall_s": wall, "spec": spec.name}, indent=2))
