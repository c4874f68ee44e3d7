"""The ServerApp: the server side of a CIS run on Flower, writing the same run dir as ``cis train``.

``serve(grid, config, out)`` builds the server-side Setup with
``cis.training.run.build_setup`` (model init, spec, sampling matrix, weights, the
engine's chooser and aggregator), runs :class:`CisStrategy` through Flower's
``Strategy.start`` and, after every round (its ``evaluate_fn`` hook), writes the
metrics line, evaluates on the validation split and saves the checkpoint with
``cis.training.run``'s own functions. The run dir gets config.json, spec.toml,
weights.json, metrics.jsonl, checkpoint.{pt,json} and summary.json, as the
built-in engine writes them, plus ``"engine": "flower"`` in summary.json.

Under ``flwr run`` the app reads its run config: ``cis-config`` (the resolved
RunConfig as JSON), ``out-dir`` (where the ServerApp's host writes the run dir)
and ``round-timeout`` (seconds to wait for a round's replies).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from cis.core import logs
from cis.training.checkpoint import save_checkpoint
from cis.training.config import RunConfig
from cis.training.flower.records import config_from_text, config_to_text, state_to_record
from cis.training.flower.strategy import CisStrategy
from cis.training.run import (
    build_setup,
    checkpoint_meta,
    is_due,
    metrics_line,
    run_summary,
    served_model,
    write_json,
    write_run_start,
)


def serve(
    grid: Grid,
    config: RunConfig,
    out: str | Path,
    round_timeout: float = 3600.0,
    connect_timeout: float = 120.0,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Train ``config`` over the nodes behind ``grid`` into run dir ``out``; returns the summary."""
    t_start = time.perf_counter()
    out = Path(out)
    s = build_setup(config, log=log)  # a bad model or data stops here, before the run dir is made
    write_run_start(s, out)
    write_json(out / "weights.json", s.weights.describe())
    strategy = CisStrategy(s.engine, config_to_text(config), connect_timeout=connect_timeout)
    timing = {"eval": 0.0, "checkpoint": 0.0}
    rounds = cast(int, config.rounds)  # resolved() set it

    def after_round(t: int, arrays: ArrayRecord) -> MetricRecord | None:
        if t == 0:
            return None
        line = metrics_line(s, cast(dict, strategy.last_round))  # round t's, set by aggregate_train
        timing["eval"] += line.get("eval_seconds", 0.0)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        if is_due(t, config.checkpoint_every, rounds):
            t0 = time.perf_counter()
            # the momentum buffers stay on the nodes (context.state): the checkpoint holds the round only
            save_checkpoint(
                out,
                served_model(s),
                {**checkpoint_meta(s), "engine": "flower"},
                {"engine": {"round": s.engine.round}},
            )
            timing["checkpoint"] += time.perf_counter() - t0
        log(
            f"round {t}/{config.rounds}"
            + (f": val CIS accuracy {100 * line['val_cis_accuracy']:.1f} %" if "val_cis_accuracy" in line else "")
        )
        return (
            MetricRecord({"val_cis_accuracy": float(line["val_cis_accuracy"])}) if "val_cis_accuracy" in line else None
        )

    t_loop = time.perf_counter()
    strategy.start(
        grid,
        state_to_record(s.engine.global_state),
        num_rounds=rounds,
        timeout=round_timeout,
        evaluate_fn=after_round,
    )
    loop_seconds = time.perf_counter() - t_loop
    seconds = {"server": time.perf_counter() - t_start, "rounds": loop_seconds, **strategy.timings, **timing}
    summary = {**run_summary(s), "engine": "flower", "flower_timing": {f"{k}_seconds": v for k, v in seconds.items()}}
    write_json(out / "summary.json", summary)
    return summary


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    config = config_from_text(str(rc["cis-config"]))
    logs.configure(logs.resolve())  # Flower runs this in its own process: log as a cis command does
    serve(grid, config, str(rc["out-dir"]), round_timeout=float(rc.get("round-timeout", 3600.0)),
          connect_timeout=float(rc.get("connect-timeout", 120.0)), log=logging.getLogger(__name__).info)
