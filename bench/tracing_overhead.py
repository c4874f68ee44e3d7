"""What tracing costs per hop: one-sample requests through device -> edge -> cloud, five ways side by side.

Three ``cis serve --node`` processes per way (device0 -> edge0 -> cloud of a paper-7 bundle, thresholds
+inf below the root and ``--no-cap``, so every request crosses all three hops), the client sending one
request as soon as the last is answered:

- ``baseline``: the nodes run the cis package of ``--baseline-ref`` (default ``main``: the code path
  before tracing; after the merge, name the commit before it), taken out with ``git archive``;
- ``off``: this tree, no tracing, no trace context (the cost must be nothing measurable: a None check);
- ``context``: this tree, no tracing at the nodes, the client sends a traceparent (passed on upward);
- ``spans``: every node writes its spans file (``--spans-file``), the client sends a traceparent;
- ``otlp``: every node exports over OTLP/HTTP to a local receiver that drops them (the 'otel' extra).

The ways run at once (idle nodes only heartbeat) and take turns in blocks, so a slow minute of a shared
machine touches all of them; per way the median over blocks of each block's p50 (and p99) round trip,
and per hop the p50 added to ``baseline`` ((p50 - baseline p50) / 3). The bundle is the digits fixture
(``cis.exporter.fixture_bundle``: a tiny CNN, stages of tens of microseconds), so the hop itself is most of
the time, or ``--bundle PATH``.

    python -m bench.tracing_overhead                # 7 blocks of 2,000 requests per way
    python -m bench.tracing_overhead --quick        # smoke run: 2 blocks of 100

Writes bench/results/tracing_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from bench.harness import REPO, machine, write_results

PATH = ("device0", "edge0", "cloud")  # leaf to root
HOPS = 3  # client -> device -> edge -> cloud
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WAYS = ("baseline", "off", "context", "spans", "otlp")


def baseline_package(ref: str, into: Path) -> Path:
    """The cis package of git ``ref``, unpacked under ``into`` (a folder to put first on PYTHONPATH)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "cis"], capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"--baseline-ref {ref}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


class Drop(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes the spans and drops them."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class Chain:
    """Three ``cis serve --node`` processes of one way, on free loopback ports. Not the harness's cluster: a way
    runs the cis package its environment names (the baseline: another git ref's, first on PYTHONPATH), from a
    folder outside the repository (whose cis/ ``python -m`` would put first on the path)."""

    def __init__(self, way: str, bundle: Path, work: Path, env: dict, flags: list[str]) -> None:
        from cis.runtime.launcher import free_port

        self.way = way
        self.addr = {n: f"tcp://127.0.0.1:{free_port()}" for n in PATH}
        self.procs = []
        for i, node in enumerate(PATH):
            parent = ["--parent", self.addr[PATH[i + 1]], "--threshold", "inf"] if i + 1 < len(PATH) else []
            argv = [sys.executable, "-m", "cis.cli.main", "serve", str(bundle), "--node", node,
                    "--bind", self.addr[node],
                    *parent, "--no-cap", "--provider", "cpu", "--heartbeat", "0.2", *flags]  # fmt: skip
            log = open(work / f"{way}.{node}.log", "w")
            # cwd: not the repository, whose cis/ python -m would put first on the path
            self.procs.append(subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT))

    def ready(self, x: np.ndarray, timeout: float = 90) -> None:
        from cis.runtime.client import Client

        end = time.monotonic() + timeout
        with Client(self.addr[PATH[0]], timeout=2) as c:
            while time.monotonic() < end:
                try:
                    if c.infer(x[:1]).served_by == [PATH[-1]]:
                        return
                except Exception:
                    time.sleep(0.2)
        sys.exit(f"{self.way}: the chain did not answer from {PATH[-1]} within {timeout} s (see its logs)")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(30)


def block(chain: Chain, x: np.ndarray, n: int, traceparent: str | None) -> np.ndarray:
    """Round-trip seconds of n one-sample requests sent back to back."""
    from cis.runtime.client import Client

    out = np.empty(n)
    with Client(chain.addr[PATH[0]], timeout=10) as c:
        for i in range(n):
            t = time.perf_counter()
            c.infer(x[i % len(x) : i % len(x) + 1], traceparent=traceparent)
            out[i] = time.perf_counter() - t
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", help="bundle folder (default: the digits fixture, built into --work)")
    ap.add_argument("--baseline-ref", default="main", help="git ref whose cis package is the baseline (default main)")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--requests", type=int, default=2000, help="requests per block and way")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "cis-tracing-bench"))
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 blocks of 100 requests")
    args = ap.parse_args()
    if args.quick:
        args.blocks, args.requests = 2, 100
    return args


def setups_of(args: argparse.Namespace, work: Path, sink_port: int) -> dict[str, tuple[dict, list[str]]]:
    """Each way's (environment, node flags): the baseline runs the cis package of --baseline-ref."""
    base = baseline_package(args.baseline_ref, Path(tempfile.mkdtemp(prefix="cis-baseline-", dir=work)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CIS_"))}
    setups = {
        "baseline": ({**env, "PYTHONPATH": str(base)}, []),
        "off": (env, []),
        "context": (env, []),
        "spans": (env, ["--spans-file", str(work / "spans" / "{node}.jsonl")]),
        "otlp": (env, ["--otlp-endpoint", f"http://127.0.0.1:{sink_port}"]),
    }
    for w in ("baseline", "off"):  # each way runs the code it names
        where = subprocess.run([sys.executable, "-c", "import cis; print(cis.__file__)"], env=setups[w][0], cwd=work,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        assert where.startswith(str(base)) == (w == "baseline"), (w, where)
    return setups


def interleaved(chains: dict, ways: list[str], x: np.ndarray, args: argparse.Namespace) -> tuple[dict, dict]:
    """({way: each block's p50}, {way: each block's p99}): every block times every way, in alternating order."""
    p50: dict[str, list[float]] = {w: [] for w in ways}
    p99: dict[str, list[float]] = {w: [] for w in ways}
    for c in chains.values():
        c.ready(x)
    for b in range(args.blocks):
        for w in ways if b % 2 == 0 else ways[::-1]:  # alternate the order: no way always goes first
            tp = None if w in ("baseline", "off") else TRACEPARENT
            t = block(chains[w], x, args.requests, tp)
            p50[w].append(float(np.percentile(t, 50)))
            p99[w].append(float(np.percentile(t, 99)))
        print(f"block {b + 1}/{args.blocks}: " + ", ".join(f"{w} {p50[w][-1] * 1e6:.0f} us" for w in ways),
              file=sys.stderr)  # fmt: skip
    return p50, p99


def report(out: dict, args: argparse.Namespace) -> list[str]:
    smoke = "QUICK SMOKE RUN, not a result. " if args.quick else ""
    lines = [
        "# Tracing overhead (issue 33)",
        "",
        f"{smoke}One-sample requests back to back through {' -> '.join(PATH)} ({HOPS} hops, every node its own "
        f"process), {args.blocks} blocks of {args.requests} requests per way, ways interleaved; baseline = the cis "
        f"package of `{args.baseline_ref}`. Load average at the end: {out['machine']['load_avg'][0]:.2f} on "
        f"{out['machine']['cpus']} CPUs.",
        "",
        "| way | p50 round trip (us) | block p50 range (us) | p99 (us) | p50 added per hop vs baseline (us) |",
        "|---|---|---|---|---|",
    ]
    for w, s in out["ways"].items():
        lo, hi = s["p50_block_range_us"]
        lines.append(f"| {w} | {s['p50_us']:.0f} | {lo:.0f}-{hi:.0f} | {s['p99_us']:.0f} | "
                     f"{s['added_per_hop_p50_us']:+.1f} |")  # fmt: skip
    return [*lines, "", f"Spans written by the `spans` way: {out['spans_written']}."]


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bundle = Path(args.bundle).resolve() if args.bundle else work.resolve() / "bundle"
    if not args.bundle and not (bundle / "manifest.json").is_file():
        from cis.exporter.fixture_bundle import make_demo_bundle

        bundle = make_demo_bundle(work, steps=150)
    from cis.core.bundle import load_bundle
    from cis.core.extras import EXTRAS, installed

    ways = [w for w in WAYS if w != "otlp" or all(map(installed, EXTRAS["otel"]))]
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Drop)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    setups = setups_of(args, work, sink.server_address[1])
    (work / "spans").mkdir(exist_ok=True)
    for f in (work / "spans").glob("*.jsonl"):
        f.unlink()
    shape = load_bundle(bundle).stage(1).inputs[0].shape[1:]
    x = np.random.default_rng(0).standard_normal((64, *shape)).astype(np.float32)
    chains = {w: Chain(w, bundle, work, *setups[w]) for w in ways}
    try:
        p50, p99 = interleaved(chains, ways, x, args)
    finally:
        for c in chains.values():
            c.stop()
        sink.shutdown()
    summary = {}
    for w in ways:
        med, lo, hi = np.median(p50[w]), min(p50[w]), max(p50[w])
        summary[w] = {"p50_us": med * 1e6, "p50_block_range_us": [lo * 1e6, hi * 1e6],
                      "p99_us": float(np.median(p99[w])) * 1e6,
                      "added_per_hop_p50_us": (med - np.median(p50["baseline"])) / HOPS * 1e6}  # fmt: skip
    out = {
        "benchmark": "tracing_overhead",
        "quick": args.quick,
        "scale": {"blocks": args.blocks, "requests": args.requests, "bundle": str(bundle), "path": list(PATH),
                  "baseline_ref": args.baseline_ref},  # fmt: skip
        "ways": summary,
        "spans_written": sum(1 for f in (work / "spans").glob("*.jsonl") for _ in f.open()),
        "machine": machine(),
    }
    write_results("tracing_overhead", out, report(out, args))


if __name__ == "__main__":
    main()
