"""Starting, reaching, measuring and stopping the systems the peers benchmark compares, each as a user would.

- cis: ``cis serve BUNDLE --all`` (the tree) or ``cis serve BUNDLE --node cloud`` (one tier), with the Open
  Inference Protocol front door (``--http-port``) where this cis has one (:func:`cis_has_front_door`), started
  by the harness (:func:`bench.harness.serve_command`);
- Ray Serve: ``ray_serve_cis.py`` in a process of its own (Ray's dashboard off), reached by this process as a
  Ray driver through a DeploymentHandle, and over its HTTP ingress;
- KServe and MLServer: their servers in their own environments (``.venv-kserve``, ``.venv-mlserver``:
  ``scripts/peers_setup.sh``), each serving the cloud node's stages.

Memory is read from /proc for every process of a system (the process started and all its descendants):
RSS, and PSS, which splits pages shared between processes (Ray's workers share libraries and its object
store) among them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENVS = {"kserve": REPO / ".venv-kserve", "mlserver": REPO / ".venv-mlserver"}
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray on loopback only (ray_serve_cis.py)
os.environ.update(LOOPBACK_RAY)  # this process is a Ray driver too: set before anything imports ray

from bench.harness import Served, serve_command  # noqa: E402
from cis.runtime.ports import free_port  # noqa: E402  (ports below the ephemeral range: see its docstring)


def python_path() -> str:
    """PYTHONPATH for a server (``python -m bench.peers.NAME``): the checkout first, then what this process was
    given (a machine without an install of cis or ray, e.g. scripts/gpu_peers.sh's --target folder)."""
    return os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def missing_peers(http: bool = True) -> list[str]:
    """What this environment lacks to drive the peers: ray[serve] (and tritonclient[http] with ``http``).
    Read from the installed distributions, without importing ray (importing it before the loopback setting
    above would make this process look for Ray on the host's address)."""
    import importlib.metadata as md

    need = {"ray": "ray[serve]", "aiohttp-cors": "ray[serve]", "starlette": "ray[serve]"}
    if http:
        need |= {"tritonclient": "tritonclient[http]", "aiohttp": "tritonclient[http]"}
    out = []
    for dist, extra in need.items():
        try:
            md.version(dist)
        except md.PackageNotFoundError:
            if extra not in out:
                out.append(extra)
    return out


def cis_has_front_door() -> bool:
    """Whether this cis serves the Open Inference Protocol (``cis serve --http-port``, issue 33)."""
    out = subprocess.run([sys.executable, "-m", "cis.cli.main", "serve", "--help"], capture_output=True, text=True)
    return "--http-port" in out.stdout


# ---------------------------------------------------------------- memory


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if not Path(f"/proc/{p}").exists():
            continue
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def _kib(path: str, field: str) -> float | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_name(pid: int) -> str:
    """What the process is: a cis node's id, Ray's title (``ray::ServeReplica:cis:devices``, ``raylet``),
    else its program and first arguments."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in raw if w]
    if not words:
        return "?"
    if "cis.cli.main" in words and "serve" in words:
        if "--node" in words:
            return f"cis node {words[words.index('--node') + 1]}"
        return "cis serve --all (launcher)" if "--all" in words else "cis serve"
    if words[0].startswith("ray::") or "/" not in words[0] and not words[0].startswith("python"):
        return " ".join(words)[:60]
    keep = [Path(w).name if "/" in w else w for w in words[:4]]
    return " ".join(keep)[:60]


def memory(pids: list[int]) -> dict:
    """RSS and PSS (MB) per process and in total."""
    rows = []
    for pid in pids:
        rss = _kib(f"/proc/{pid}/status", "VmRSS:")
        if rss is None:
            continue
        pss = _kib(f"/proc/{pid}/smaps_rollup", "Pss:")
        rows.append({"pid": pid, "name": process_name(pid), "rss_mb": round(rss, 1),
                     "pss_mb": None if pss is None else round(pss, 1)})  # fmt: skip
    return {"processes": len(rows), "rss_mb": round(sum(r["rss_mb"] for r in rows), 1),
            "pss_mb": round(sum(r["pss_mb"] or 0 for r in rows), 1), "per_process": rows}  # fmt: skip


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used so far (/proc/PID/stat; a process gone counts 0)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / tick


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy so far (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def split_cpus() -> tuple[set[int], set[int]] | None:
    """The load generator's core and the servers' cores (the first of this process's cores; the rest), or None
    with fewer than two."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


def taskset(cpus: set[int] | None) -> list[str]:
    """A command's prefix that runs it on ``cpus`` (nothing when None)."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


class MemoryPeak:
    """Samples the RSS of a system's processes every ``every`` s in a thread; keeps the largest total."""

    def __init__(self, roots: list[int], every: float = 0.5):
        self.roots, self.every = roots, every
        self.peak: dict = {"rss_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pids(self) -> list[int]:
        return sorted({p for r in self.roots for p in descendants(r)})

    def _run(self) -> None:
        while not self._stop.is_set():
            m = memory(self.pids())
            if m["rss_mb"] > self.peak["rss_mb"]:
                self.peak = m
            self._stop.wait(self.every)

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- processes


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM, then SIGKILL to the process group after ``timeout`` s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_http(url: str, body: bytes | None, timeout: float, proc: subprocess.Popen | None = None,
              step: float = 0.05) -> float | None:  # fmt: skip
    """Seconds until ``url`` answered 200 (a POST of ``body``, else a GET), or None after ``timeout`` or once
    ``proc`` (the server) has exited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout and (proc is None or proc.poll() is None):
        try:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(step)
    return None


def oip_body(x, name: str = "input") -> bytes:
    """An Open Inference Protocol JSON infer request of array ``x``."""
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()  # fmt: skip


def cis_tree(bundle: Path, logs: Path, args: list[str], http: bool) -> Served:
    """``cis serve BUNDLE --all --free-ports --json`` (+ ``--http-port 0`` for the front door), as a user runs it
    (:func:`bench.harness.serve_command`)."""
    return serve_command(bundle, logs=logs, args=[*args, *(["--http-port", "0"] if http else [])])


def cis_node(bundle: Path, node: str, http: bool, cpus: set[int] | None = None, args: tuple = ()) -> Served:
    """One node alone: ``cis serve BUNDLE --node ID --bind ... --no-cap [--http-port 0]`` on ``cpus``."""
    return serve_command(bundle, node=node, prefix=taskset(cpus),
                         args=["--no-cap", *args, *(["--http-port", "0"] if http else [])])  # fmt: skip


class RayServer:
    """``ray_serve_cis.py`` in its own process (Ray's head, Serve, the app), reached as a Ray driver."""

    def __init__(self, bundle: Path, log: Path, args: list[str], options: dict | None = None):
        """``args``: the program's flags; ``options``: the same as :func:`ray_serve_cis.build_app`'s keywords
        (so that :meth:`redeploy` knows what runs)."""
        self.t0 = time.monotonic()
        self.port = free_port()
        self.deployed = (str(bundle), sorted((options or {}).items()))
        env = {**os.environ, **LOOPBACK_RAY, "PYTHONPATH": python_path()}
        cmd = [sys.executable, "-m", "bench.peers.ray_serve_cis", "--bundle", str(bundle),
               "--http-port", str(self.port), *args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=env,
                                     start_new_session=True)  # fmt: skip
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise SystemExit(f"peers: Ray Serve did not start; see {log}")
        self.ready_s = time.monotonic() - self.t0
        self.info = json.loads(line)
        self.url = self.info["http"]
        self._handle = None

    def connect(self) -> None:
        """This process connected to the cluster as a driver."""
        import ray
        from ray._private import ray_constants

        if ray_constants.ENABLE_RAY_CLUSTER:  # ray came in before this module: it would look elsewhere
            raise RuntimeError("ray was imported before bench/peers/systems.py set Ray to loopback")
        if not ray.is_initialized():
            ray.init(address=self.info["gcs_address"], configure_logging=False, log_to_driver=False)

    def handle(self):
        """The devices deployment's handle (the same one until a redeploy): ask for it on the event loop the loads
        run on (Ray's throughput-optimized mode binds a handle's router to the loop it is first used on)."""
        if self._handle is None:
            from ray import serve

            self.connect()
            self._handle = serve.get_app_handle("cis")
        return self._handle

    def redeploy(self, bundle: Path, **options) -> float:
        """Run the app again with other options (threshold, batching), from a driver process of its own (this
        one's handles stay bound to their event loop: Ray's throughput-optimized mode runs a handle's router on
        it): seconds until it is ready, 0.0 where exactly that runs already. The next load asks for a new handle."""
        options = {k: v for k, v in options.items() if v is not None}
        if (str(bundle), sorted(options.items())) == self.deployed:
            return 0.0
        self.connect()
        flags = []
        for key, value in options.items():
            flags += [f"--{key.replace('_', '-')}", str(value)]
        env = {**os.environ, **LOOPBACK_RAY, "PYTHONPATH": python_path()}
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "bench.peers.ray_serve_cis", "--bundle", str(bundle), *flags,
                        "--redeploy", self.info["gcs_address"]], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.deployed = (str(bundle), sorted(options.items()))
        self._handle = None
        return time.monotonic() - t

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._handle = None
        stop(self.proc, timeout=90)


class SingleServer:
    """KServe's or MLServer's server serving the cloud node's stages, in its own environment (on ``cpus``);
    ``null``: the null endpoint (null_oip.py, the load generator's floor), in this environment."""

    def __init__(self, kind: str, bundle: Path, work: Path, workers: int = 0, cpus: set[int] | None = None):
        python = VENVS[kind] / "bin" / "python" if kind in VENVS else Path(sys.executable)
        self.t0 = time.monotonic()
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": python_path()}
        self.log = work / f"{kind}-w{workers}.log"
        log = open(self.log, "w")
        if kind == "null":
            cmd, cwd = [str(python), "-m", "bench.peers.null_oip", "--port", str(self.port)], work
        elif kind == "kserve":
            cmd = [str(python), "-m", "bench.peers.kserve_cis", "--bundle", str(bundle), "--http_port", str(self.port)]
            cwd = work
        else:
            folder = mlserver_folder(work / f"mlserver-model-w{workers}", bundle, self.port, free_port(), workers)
            cmd = [str(VENVS[kind] / "bin" / "mlserver"), "start", str(folder)]
            cwd = folder
        self.proc = subprocess.Popen([*taskset(cpus), *cmd], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop(self.proc)


def mlserver_folder(folder: Path, bundle: Path, http_port: int, grpc_port: int, workers: int = 0) -> Path:
    """The folder ``mlserver start`` reads: server settings (loopback, its ports, no metrics server,
    ``workers`` parallel inference processes: 0 runs the model in the server's own process) and the model's."""
    folder.mkdir(parents=True, exist_ok=True)
    server = {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port, "metrics_endpoint": None,
              "parallel_workers": workers, "debug": False}  # fmt: skip
    (folder / "settings.json").write_text(json.dumps(server))
    model = {"name": "cis", "implementation": "bench.peers.mlserver_cis.CisStages",
             "parameters": {"extra": {"bundle": str(bundle), "node": "cloud"}}}  # fmt: skip
    (folder / "model-settings.json").write_text(json.dumps(model))
    return folder


def versions() -> dict:
    """Versions of every system compared and of the client, from the environments that run them."""
    out: dict = {"python": sys.version.split()[0]}
    import importlib.metadata as md

    from cis.core.version import __version__

    out["cis"] = __version__  # the distribution is cis-inference; the import root is cis
    for name in ("ray", "onnxruntime", "pyzmq", "tritonclient", "aiohttp", "fastapi", "uvicorn",
                 "starlette", "pydantic", "numpy"):  # fmt: skip
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    for kind, venv in VENVS.items():
        python = venv / "bin" / "python"
        if not python.exists():
            out[kind] = None
            continue
        code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
                f"['{kind}', 'fastapi', 'uvicorn', 'pydantic', 'onnxruntime']}}))")  # fmt: skip
        got = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        out[kind] = json.loads(got.stdout) if got.returncode == 0 else None
    return out
