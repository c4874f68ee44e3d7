"""``run_flower``: a ``cis train`` run on Flower's simulation engine or deployment engine.

    run_flower(config, out, mode="simulation")   one process: Flower's Simulation Runtime
                                                  (ray backend), one virtual SuperNode per CIS node
    run_flower(config, out, mode="deployment")   SuperLink + one SuperNode per node on 127.0.0.1
                                                  (subprocesses, --insecure), the run submitted
                                                  with ``flwr run``; or, with ``superlink=ADDRESS``,
                                                  submitted to a running federation (docs/flower.md)

``mode=None`` (the default): deployment when ``superlink`` or ``root_certificates`` is given, else simulation.
Both engines write the run dir of the built-in engine (cis/training/run.py) and return its summary; a run
submitted to a SuperLink on another host writes it there and returns :func:`submitted_result`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cis.core.errors import CisError
from cis.core.extras import require
from cis.training.config import RunConfig

if TYPE_CHECKING:
    from cis.training.flower.deploy import Submission

logger = logging.getLogger(__name__)

MODES = ("simulation", "deployment")
COMPLETED = "finished:completed"  # the SuperLink's status of a run whose ServerApp returned


def flower_mode(mode: str | None, superlink: str | None, root_certificates: str | Path | None) -> str:
    """The engine a run goes to: ``mode`` as given, else deployment when a SuperLink (or its CA certificate) is
    named, else simulation. One line for a mode that would ignore them; and a superlink must be TLS or
    loopback (:func:`cis.training.flower.deploy.check_transport`)."""
    named = superlink is not None or root_certificates is not None
    if mode is None:
        mode = "deployment" if named else "simulation"
    if mode not in MODES:
        raise CisError(f"--engine flower: mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "simulation" and named:
        raise CisError(
            "--flower-mode simulation trains on this machine and takes no --flower-superlink or "
            "--flower-root-certificates; drop them, or use --flower-mode deployment to submit to a SuperLink"
        )
    if root_certificates is not None and superlink is None:
        raise CisError(
            "--flower-root-certificates goes with --flower-superlink HOST:PORT (the loopback federation "
            "started without one is insecure, on 127.0.0.1)"
        )
    if superlink is not None:
        from cis.training.flower.deploy import check_transport

        check_transport(superlink, root_certificates)
    return mode


def run_flower(
    config: RunConfig,
    out: str | Path,
    mode: str | None = None,
    *,
    superlink: str | None = None,
    root_certificates: str | Path | None = None,
    round_timeout: float = 600.0,
    connect_timeout: float = 120.0,
    num_cpus: int | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict:
    """Train ``config`` on Flower into run dir ``out``; returns summary.json's content (or, for a run on a
    SuperLink on another host, :func:`submitted_result`).

    ``mode`` (:func:`flower_mode`): None picks deployment when ``superlink`` or ``root_certificates`` is given,
    else simulation. ``config`` may be unresolved (``RunConfig(...)``): it is resolved here.
    mode "simulation": ``num_cpus`` caps the CPUs ray may use (default: all), one per ClientApp.
    mode "deployment": without ``superlink`` a loopback federation (one SuperNode per node) is
    started and stopped; with ``superlink="HOST:PORT"`` the run goes to that SuperLink, over TLS with
    ``root_certificates`` (a CA certificate), insecure only when the address is loopback (a non-loopback
    address without ``root_certificates`` is refused); its ServerApp writes ``out`` on the SuperLink's host.
    """
    mode = flower_mode(mode, superlink, root_certificates)
    config = config.resolved()
    if config.method != "cis":
        raise CisError(
            f"--engine flower: runs Algorithm 1 (method 'cis'); "
            f"method {config.method!r} runs on the built-in engine only"
        )
    require("flower", "--engine flower")
    out = Path(out)
    if (out / "checkpoint.pt").exists():
        raise CisError(
            f"{out}: already holds a run; choose another --out (--resume is not supported with --engine flower)"
        )
    if mode == "simulation":
        return _simulate(config, out, round_timeout, connect_timeout, num_cpus, log)
    return run_end(out, _deploy(config, out, superlink, root_certificates, round_timeout, connect_timeout, log))


def run_end(out: Path, sub: Submission) -> dict:
    """What a deployment run returns once `flwr run` ended. Where the ServerApp ran on this machine (a loopback
    SuperLink), summary.json must exist, else one line with the ServerApp's error from OUT/flower.log. On a
    SuperLink on another host: summary.json where OUT is here too (a shared disk), else
    :func:`submitted_result`, or one line when the run failed (its status, its streamed log)."""
    from cis.training.flower.deploy import is_loopback, server_error

    summary = out / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text())
    if is_loopback(sub.superlink):
        log_file = out / "flower.log"
        said = server_error(log_file.read_text(errors="replace")) if log_file.is_file() else None
        where = f"the run ended without writing {summary}; the ServerApp's log: {log_file}"
        raise CisError(f"{said} ({where})" if said else f"flower: {where}")
    said = server_error(sub.output)
    if (sub.status is not None and sub.status != COMPLETED) or (sub.status is None and said):
        raise CisError(
            f"{said or sub.details or 'flower: no error in the ServerApp log'} (run {sub.run_id} on "
            f"{sub.superlink} ended {sub.status or 'with an error'}; `flwr log {sub.run_id} CONNECTION` shows its log)"
        )
    return submitted_result(out, sub)


def submitted_result(out: Path, sub: Submission) -> dict:
    """A run the ServerApp of a SuperLink on another host trained: where its run dir is (``out`` as the run
    config's out-dir gave it, made absolute here) and how it ended."""
    return {"engine": "flower", "mode": "deployment", "superlink": sub.superlink, "run_id": sub.run_id,
            "status": sub.status or "unknown", "out": str(Path(out).resolve()),
            "run_dir_host": "the SuperLink's host"}  # fmt: skip


def submitted_text(result: dict) -> str:
    """``cis train``'s lines for :func:`submitted_result`."""
    ended = "finished" if result["status"] == COMPLETED else f"ended ({result['status']})"
    return (
        f"flower: run {result['run_id']} {ended} on SuperLink {result['superlink']}\n"
        f"its run dir is {result['out']} on the SuperLink's host (the ServerApp wrote it there; "
        f"`flwr log {result['run_id']} CONNECTION` shows its log; docs/flower.md)"
    )


def _deploy(
    config: RunConfig,
    out: Path,
    superlink: str | None,
    root_certificates: str | Path | None,
    round_timeout: float,
    connect_timeout: float,
    log: Callable[[str], None],
) -> Submission:
    """The deployment engine: submit to ``superlink``, or to a loopback federation started for the run. Nothing
    is written into ``out`` here when the SuperLink is on another host (OUT is a path there)."""
    from cis.training.flower.deploy import LoopbackFederation, is_loopback, submit_run

    if superlink is not None:
        remote = not is_loopback(superlink)
        return submit_run(
            config,
            out,
            superlink,
            root_certificates=root_certificates,
            round_timeout=round_timeout,
            connect_timeout=connect_timeout,
            write_log=not remote,
            status=remote,
            log=log,
        )
    from cis.training.clients import run_splits
    from cis.training.run import resolve_spec, stated_classes

    n = len(resolve_spec(config, run_splits(config, None, stated_classes(config)).train).nodes)
    with LoopbackFederation(n, log=log) as fed:
        return fed.run(config, out, round_timeout=round_timeout, connect_timeout=connect_timeout)


def _simulate(
    config: RunConfig, out: Path, round_timeout: float, connect_timeout: float, num_cpus: int | None, log
) -> dict:
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from cis.core.logs import adopt
    from cis.training.device import run_device
    from cis.training.flower.client_app import app as client_app
    from cis.training.flower.server_app import serve
    from cis.training.run import build_setup

    adopt("flwr")  # flwr's records (its own handler prints DEBUG) through ours: --log-level/--log-format hold
    n = len(
        build_setup(dataclasses.replace(config, device="cpu")).clients
    )  # cheap for the built-in datasets; the ServerApp builds its own
    # ray hides the GPUs from actors that ask for none: on a GPU, each ClientApp asks for a share of one
    gpus = 1.0 / n if run_device(config).type == "cuda" else 0.0
    result: dict = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context) -> None:
        try:
            result["summary"] = serve(
                grid, config, out, round_timeout=round_timeout, connect_timeout=connect_timeout, log=log
            )
        except BaseException as exc:  # run_simulation only logs a failing ServerApp; re-raised below
            result["error"] = exc
            raise

    # Ray starts its workers at niceness 15: on a busy machine the ClientApp actors then starve behind any other work
    # (a test run on 2 cores left them silent past the 120 s connect timeout); at 0 they inherit this process's
    init_args = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
                 "_system_config": {"worker_niceness": 0}}  # fmt: skip
    if num_cpus:
        init_args["num_cpus"] = int(num_cpus)
    # Any: flwr's annotation leaves out the nested dicts Ray's init_args take (_system_config)
    backend_config: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": gpus}, "init_args": init_args}
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n, backend_config=backend_config)
    finally:
        _stop_ray()
    if "error" in result:
        err = result["error"]
        raise (
            err
            if isinstance(err, CisError)
            else CisError(f"flower simulation: the ServerApp failed ({type(err).__name__}: {err})")
        )
    if "summary" not in result:
        raise CisError("flower simulation: the ServerApp did not finish (see Flower's log above)")
    return result["summary"]


def _stop_ray() -> None:
    """Shut ray down so no ClientApp actor outlives the run (they otherwise linger as orphans)."""
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
