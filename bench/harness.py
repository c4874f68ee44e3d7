"""The benchmarks' one harness: start a cluster, drive a load, write results.

- **a cluster**: :func:`cluster` (or :func:`start_cluster`) starts every node of a spec as ``cis serve --all``
  does (:mod:`cis.runtime.launcher`, in this process); :func:`serve_command` runs ``cis serve`` as a user types
  it, in a child process (``--all``, or one ``--node``), for what only the command shows (its start-up, the
  memory of all its processes);
- **a load**: :func:`drive_load`, the open-loop load generator of ``cis bench`` (:mod:`cis.runtime.loadgen`): Poisson
  arrivals to a spec's entry nodes in proportion to their arrival rates, or round robin;
- **results**: the repository, the results folder (``bench/results``), the machine's facts (:func:`machine`, with
  its load), :func:`write_results` (``NAME.json`` and ``NAME.md``), the doc blocks a benchmark writes from its
  JSON, the CIFAR-10 unzip; and a quiet machine for timings (:func:`paused`, :func:`load_now`).

A benchmark runs from the repository root as ``python -m bench.NAME`` (the project from its install, ``pip install
-e .``, or the checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


RESULTS = REPO / "bench" / "results"


CIFAR_ZIP = next(
    (
        p
        for p in (REPO.parent / "shared" / "data" / "cifar10-jpeg.zip", Path("/work/shared/data/cifar10-jpeg.zip"))
        if p.is_file()
    ),
    REPO.parent / "shared" / "data" / "cifar10-jpeg.zip",
)


def ensure_cifar(path: Path) -> Path:
    """CIFAR-10 at ``path`` (an image folder, unzipped from ../shared/data/cifar10-jpeg.zip when missing, or the
    python-pickle layout ``path``/cifar-10-batches-py)."""
    if not (path / "train").is_dir() and not (path / "cifar-10-batches-py").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["unzip", "-q", "-o", str(CIFAR_ZIP), "-d", str(path)], check=True)
    return path


def write_scale(out: Path, scale: dict[str, Any], seeds: list[int]) -> None:
    """Write a campaign folder's scale.json: its scale and planned seeds. A campaign over fewer seeds at the
    same scale (``--seeds 1,2,3`` after a 5-seed one) keeps the seeds planned before, so the report still
    covers every finished run."""
    path = out / "scale.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    planned = old.pop("seeds", [])
    if old != scale:  # another scale: its seeds are not this campaign's
        planned = []
    path.write_text(json.dumps({**scale, "seeds": sorted(set(planned) | set(seeds))}, indent=1))


def machine() -> dict[str, Any]:
    """Where the numbers were measured (say the load: the development machine is shared)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def write_results(name: str, data: dict, markdown: str | list[str] | None = None) -> None:
    """``RESULTS/name.json`` and, given a table, ``RESULTS/name.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    if markdown is not None:
        text = markdown if isinstance(markdown, str) else "\n".join(markdown) + "\n"
        (RESULTS / f"{name}.md").write_text(text)
    print(f"wrote {RESULTS / name}.json" + (" and .md" if markdown is not None else ""), file=sys.stderr)


def vit_result(
    benchmark: str, args: argparse.Namespace, scale_keys: tuple[str, ...], cells: dict, start: float
) -> dict:
    """The result object of flame.py / reefl.py: its scale (the named args), its cells, its seconds."""
    return {
        "benchmark": benchmark,
        "quick": args.quick,
        "scale": {k: getattr(args, k) for k in scale_keys},
        "cells": cells,
        "seconds": time.perf_counter() - start,
    }


def vit_head(name: str, out: dict, setting: str) -> tuple[int, list[str]]:
    """(number of exits, the markdown's title and scale line) of a flame.py / reefl.py result ``out``."""
    exits = len(str(out["scale"]["exits"]).split(","))
    smoke = " (quick smoke run)" if out["quick"] else ""
    scale = f"Scale: {out['scale']}; {setting} Total {out['seconds'] / 60:.1f} min."
    return exits, [f"# {name} benchmark{smoke}", "", scale]


def nested_head(title: str, a: dict, what: str) -> list[str]:
    """The markdown's title and the sentence on the scale of a nested-method run (``a``: its args)."""
    scale = (
        f"{'QUICK SMOKE RUN, not a result. ' if a['quick'] else ''}Reduced scale: ResNet20 at width {a['width']}, "
        f"{a['train_subset']} training images, {a['rounds']} rounds x {a['local_steps']} local steps of "
        f"{a['batch_size']}, test on {a['test']} images, seed {a['seed']}; papers' weighting (--strategy equal)."
    )
    return [f"# {title}", "", f"{scale} {what}", ""]




# ---------------------------------------------------------------- a quiet machine for timings


def _pids_under(paths: list[str]) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if any(cwd == p or cwd.startswith(p.rstrip("/") + "/") for p in paths):
            out.append(int(proc.name))
    return out


@contextlib.contextmanager
def paused(paths: list[str]) -> Iterator[list[int]]:
    """SIGSTOP every process whose working directory is under one of ``paths`` (e.g. a training campaign's
    worktree); SIGCONT them on the way out (also on an exception or Ctrl-C). Yields the pids stopped."""
    from bench.campaign import stopped

    with stopped(_pids_under(paths) if paths else []) as pids:
        if pids:
            time.sleep(0.5)  # let the cores go quiet
        yield pids


def load_now() -> dict:
    """The machine's load (1-minute average) and how busy each core was over the last 0.5 s."""

    def ticks() -> dict[str, tuple[int, int]]:
        rows = [line.split() for line in Path("/proc/stat").read_text().splitlines() if line.startswith("cpu")]
        return {r[0]: (sum(map(int, r[1:])), int(r[4]) + int(r[5])) for r in rows if r[0] != "cpu"}

    a = ticks()
    time.sleep(0.5)
    b = ticks()
    busy = {cpu: 1 - (b[cpu][1] - a[cpu][1]) / max(1, b[cpu][0] - a[cpu][0]) for cpu in a}
    return {"load_avg_1m": os.getloadavg()[0], "busy": busy}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- a cluster


def start_cluster(bundle: str | Path, spec: Any = None, *, spec_file: str | None = None, args: Sequence[str] = (),
                  node_args: Mapping[str, Sequence[str]] | None = None, log_dir: str | Path | None = None,
                  **launch: Any) -> Any:  # fmt: skip
    """Every node of ``spec`` (None: the bundle's) on free loopback ports, as ``cis serve BUNDLE --all`` starts
    them (:func:`cis.runtime.launcher.launch`, the nodes' flags ``args`` and ``node_args``), serving when this
    returns. ``launch``: the launcher's other keywords (``env``, ``node_prefix``, ``door_ports``, ``ready_timeout``).
    Returns the :class:`cis.runtime.launcher.Cluster` (``addresses``, ``doors``, ``kill``, ``stop``...)."""
    from cis.runtime.launcher import launch as start

    if spec is None:
        from cis.core.bundle import load_bundle

        spec = load_bundle(bundle).spec
    return start(bundle, spec, spec_file, True, list(args), node_args,
                 log_dir=None if log_dir is None else str(log_dir), **launch)  # fmt: skip


@contextlib.contextmanager
def cluster(bundle: str | Path, spec: Any = None, **options: Any) -> Iterator[Any]:
    """:func:`start_cluster`, stopped on the way out."""
    running = start_cluster(bundle, spec, **options)
    try:
        yield running
    finally:
        running.stop()


class Served:
    """``cis serve`` as a user runs it, in a child process: ``--all`` (the whole spec) or one ``--node``.
    ``nodes``: {node: {"address": ..., and its doors' and metrics' URLs}}; ``started``: ``time.monotonic()`` when
    the command was started; ``ready_s``: command to serving."""

    def __init__(self, proc: subprocess.Popen, nodes: dict[str, dict], started: float, logs: Path | None):
        self.proc, self.nodes, self.logs, self.started = proc, nodes, logs, started
        self.ready_s = time.monotonic() - started

    def address(self, node: str) -> str:
        return self.nodes[node]["address"]

    def url(self, node: str, door: str = "http") -> str | None:
        """The node's front door (``http``: its URL without the path; ``grpc``: HOST:PORT), None without one."""
        got = self.nodes[node].get(door)
        return None if got is None else str(got).split("/v2")[0].rstrip("/")

    def state(self) -> dict:
        """``--all``: the launcher's cluster.json (each node's pid, state, restarts)."""
        assert self.logs is not None
        return json.loads((self.logs / "cluster.json").read_text())["nodes"]

    def pid(self, node: str) -> int:
        return int(self.state()[node]["pid"])

    def stop(self, grace: float = 40.0) -> int:
        """SIGTERM (the nodes drain), SIGKILL after ``grace`` seconds; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_command(bundle: str | Path, *, node: str | None = None, logs: str | Path | None = None,
                  args: Sequence[str] = (), prefix: Sequence[str] = (), timeout: float = 120.0) -> Served:
    """Start ``cis serve BUNDLE --all --free-ports --json [--log-dir LOGS] ARGS`` (``node`` None) or ``cis serve
    BUNDLE --node NODE --bind tcp://127.0.0.1:PORT ARGS`` (its doors and /metrics URL read from its log lines) behind
    ``prefix`` (e.g. ``taskset -c 0``); return once it serves."""
    from cis.runtime.ports import free_port

    started = time.monotonic()
    cmd = [*prefix, sys.executable, "-m", "cis.cli.main", "serve", str(bundle)]
    if node is None:
        cmd += ["--all", "--free-ports", "--json", *(["--log-dir", str(logs)] if logs else []), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise SystemExit(f"cis serve --all did not start: {(proc.stderr.read() if proc.stderr else '')[-2000:]}")
        return Served(proc, json.loads(line)["nodes"], started, Path(logs) if logs else None)
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([*cmd, "--node", node, "--bind", address, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    text = _read_until(proc, "node_start", timeout)
    threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()  # a full pipe would stop the node
    found = {"address": address}
    for key, pattern in (("http", r"http front door at (\S+)"), ("grpc", r"grpc front door at (\S+)"),
                         ("metrics", r"; metrics (\S+/metrics)")):  # fmt: skip
        hit = re.search(pattern, text)
        if hit:
            found[key] = hit.group(1)
    return Served(proc, {node: found}, started, None)


def _drain(stream: Any) -> None:
    while os.read(stream.fileno(), 65536):
        pass


def _read_until(proc: subprocess.Popen, wanted: str, timeout: float) -> str:
    """A child's stderr up to the line that holds ``wanted`` (what it said, should it exit first)."""
    assert proc.stderr is not None
    text, end = "", time.monotonic() + timeout
    while wanted not in text and time.monotonic() < end:
        if select.select([proc.stderr], [], [], 0.5)[0]:
            text += os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
        if proc.poll() is not None and wanted not in text:
            raise SystemExit(f"cis serve exited ({proc.returncode}): {text[-2000:]}")
    if wanted not in text:
        proc.kill()
        raise SystemExit(f"cis serve: no {wanted!r} within {timeout:g} s: {text[-2000:]}")
    return text


# ---------------------------------------------------------------- a load


def drive_load(addresses: Mapping[str, str], x: np.ndarray, rate: float, *, spec: Any = None,
               seconds: float | None = None, requests: int | None = None, seed: int = 0, timeout: float = 30.0,
               **options: Any) -> Any:  # fmt: skip
    """An open-loop load of the load generator (Poisson unless ``arrivals=`` says otherwise) at ``rate``
    requests/s for ``seconds`` (or ``requests``); request i carries sample i mod len(``x``). With ``spec``, each
    request enters at a node with arrivals, in proportion to their arrival rates (the offline evaluation's split:
    :func:`cis.runtime.loadgen.run_spec_load`, ``targets`` the nodes' ids); else round robin over ``addresses``
    (:func:`cis.runtime.loadgen.run_load`). Returns the :class:`cis.runtime.loadgen.LoadResult`."""
    from cis.runtime.loadgen import run_load, run_spec_load

    options.setdefault("input_name", "input")
    if spec is not None:
        return run_spec_load(spec, addresses, rate, duration=seconds, requests=requests, seed=seed, x=x,
                             timeout=timeout, **options)  # fmt: skip
    return run_load(list(addresses.values()), rate, duration=seconds, requests=requests, seed=seed, x=x,
                    names=list(addresses), timeout=timeout, **options)  # fmt: skip
