"""``run_flower``: a ``cis train`` run on Flower's simulation engine or deployment engine.

    run_flower(config, out, mode="simulation")   one process: Flower's Simulation Runtime
                                                  (ray backend), one virtual SuperNode per CIS node
    run_flower(config, out, mode="deployment")   SuperLink + one SuperNode per node on 127.0.0.1
                                                  (subprocesses, --insecure), the run submitted
                                                  with ``flwr run``; or, with ``superlink=ADDRESS``,
                                                  submitted to a running federation (docs/flower.md)

Both write the run dir of the built-in engine (cis/training/run.py) and return its summary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cis.core.errors import CisError
from cis.core.extras import require
from cis.training.config import RunConfig

logger = logging.getLogger(__name__)

MODES = ("simulation", "deployment")


def run_flower(
    config: RunConfig,
    out: str | Path,
    mode: str = "simulation",
    *,
    superlink: str | None = None,
    root_certificates: str | Path | None = None,
    round_timeout: float = 600.0,
    connect_timeout: float = 120.0,
    num_cpus: int | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict:
    """Train ``config`` on Flower into run dir ``out``; returns summary.json's content.

    mode "simulation": ``num_cpus`` caps the CPUs ray may use (default: all), one per ClientApp.
    mode "deployment": without ``superlink`` a loopback federation (one SuperNode per node) is
    started and stopped; with ``superlink="HOST:PORT"`` the run goes to that SuperLink
    (TLS unless ``root_certificates`` is None and the address is loopback), whose ServerApp
    writes ``out`` on its own host.
    """
    if mode not in MODES:
        raise CisError(f"--engine flower: mode {mode!r}; expected one of {', '.join(MODES)}")
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
    _deploy(config, out, superlink, root_certificates, round_timeout, connect_timeout, log)
    if not (out / "summary.json").is_file():
        raise CisError(f"flower: the run ended without writing {out / 'summary.json'} (see the ServerApp log above)")
    return json.loads((out / "summary.json").read_text())


def _deploy(
    config: RunConfig,
    out: Path,
    superlink: str | None,
    root_certificates: str | Path | None,
    round_timeout: float,
    connect_timeout: float,
    log: Callable[[str], None],
) -> None:
    """The deployment engine: submit to ``superlink``, or to a loopback federation started for the run."""
    from cis.training.flower.deploy import LoopbackFederation, submit_run

    if superlink is not None:
        submit_run(
            config,
            out,
            superlink,
            root_certificates=root_certificates,
            round_timeout=round_timeout,
            connect_timeout=connect_timeout,
            log=log,
        )
    else:
        from cis.training.clients import run_splits
        from cis.training.run import resolve_spec, stated_classes

        n = len(resolve_spec(config, run_splits(config, None, stated_classes(config)).train).nodes)
        with LoopbackFederation(n, log=log) as fed:
            fed.run(config, out, round_timeout=round_timeout, connect_timeout=connect_timeout)


def _simulate(
    config: RunConfig, out: Path, round_timeout: float, connect_timeout: float, num_cpus: int | None, log
) -> dict:
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from cis.training.device import run_device
    from cis.training.flower.client_app import app as client_app
    from cis.training.flower.server_app import serve
    from cis.training.run import build_setup

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
