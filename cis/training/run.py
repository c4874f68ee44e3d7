"""One ``cis train`` run: build everything from a :class:`RunConfig`, train, write the run dir.

RUN_DIR holds
    config.json     the resolved config
    spec.toml       the CIS spec the run trains for
    weights.json    the aggregation weights (and sigma for balanced-adj)
    metrics.jsonl   one line per round: per-exit loss, validation accuracy per exit, CIS accuracy, seconds
    checkpoint.*    cis/training/checkpoint.py (meta: model, classes, normalisation, dataset and its data_sha256, seed,
                    spec, weights, round, centralised);
                    extra state: per-node momentum buffers and the round number
    summary.json    final per-exit and CIS test accuracy, served shares, calibrated thresholds, weights
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from cis.core.errors import CisError
from cis.core.policy.exit_policy import evaluate_cis
from cis.core.spec import CisSpec, load_spec, spec_to_dict, states_classes, write_spec
from cis.core.topologies import make_spec
from cis.training.aggregation.weights import Weights
from cis.training.builders import build_method_setup, check_ids, method_model
from cis.training.centralised import centralised_setup
from cis.training.checkpoint import (
    check_spec_fits,
    checkpoint_files,
    load_checkpoint,
    read_json,
    run_spec,
    save_checkpoint,
)
from cis.training.clients import check_node_column, federated_steps, make_clients, run_splits, weight_sizes
from cis.training.config import RunConfig
from cis.training.data.data_ref import check_digest
from cis.training.data.dataset import listed
from cis.training.data.loading import Dataset, DataSplits, augment_options, load_run_data
from cis.training.device import apply_compute_options, describe, run_device, with_amp
from cis.training.evaluate import cis_report, predict_exits
from cis.training.federated import FederatedEngine, StepFailed
from cis.training.grad_variance import gradient_variance
from cis.training.local import Client, local_steps
from cis.training.methods.static_bn import refresh_statistics
from cis.training.models.contract import EarlyExitNet
from cis.training.run_dir import check_out_folder, discard_unstarted, failed_run, files_before, open_run_dir
from cis.training.run_weights import appendix_c_sigma, model_has_exit_gradients, run_weights
from cis.training.warm_start import warm_start

__all__ = ["Setup", "appendix_c_sigma", "build_setup", "run_weights", "train_run"]  # run_weights.py's, re-exported

logger = logging.getLogger(__name__)


@dataclass
class Setup:
    config: RunConfig
    spec: CisSpec
    splits: DataSplits
    model: EarlyExitNet
    clients: list[Client]
    matrix: np.ndarray
    weights: Weights
    engine: FederatedEngine
    steps: int
    device: torch.device = torch.device("cpu")


def stated_classes(config: RunConfig) -> int | None:
    """The class count ``config.spec`` states (None: no spec, or one without ``classes``: the data says)."""
    return load_spec(config.spec).num_classes if config.spec and states_classes(config.spec) else None


def resolve_spec(config: RunConfig, train: Dataset) -> CisSpec:
    """The spec a new run trains for: ``config.spec`` (its class count, where it states none, the data's), else
    the built-in topology under ``config.serving`` with the data's classes."""
    if not config.spec:
        return make_spec(config.topology, config.serving, num_classes=train.num_classes)
    spec = load_spec(config.spec)
    if not states_classes(config.spec):
        return dataclasses.replace(spec, num_classes=train.num_classes)
    if spec.num_classes != train.num_classes:
        raise CisError(
            f"{config.spec}: [cis] classes is {spec.num_classes}; the data {config.dataset} names "
            f"{train.num_classes} classes ({listed(train.classes, 4)}); expected the same count (or no classes in "
            "the spec: cis train takes it from the data)"
        )
    return spec


def build_setup(
    config: RunConfig,
    spec: CisSpec | None = None,
    splits: DataSplits | None = None,
    log: Callable[[str], None] = lambda s: None,
    resume: bool = False,
) -> Setup:
    """Everything a run needs, deterministic in ``config.seed`` (``resume``: no ``--weights``, the checkpoint's).

    The model is built and its aggregation weights measured on the CPU, then the model and
    the nodes' data move to the run's device (cis/training/device.py); the engine's state follows.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    device = run_device(config, log)
    splits = run_splits(config, splits, spec.num_classes if spec else stated_classes(config))
    train = splits.train
    spec = spec or resolve_spec(config, train)
    check_node_column(config, spec, splits)
    clients = make_clients(config, spec, train, device)
    batch = cast(int, config.batch_size)  # resolved() set it
    steps = local_steps([c.size for c in clients], batch, config.local_epochs, config.local_steps)
    sizes = weight_sizes(config, spec, clients, len(train))
    sgd = {  # the local trainers' SGD settings
        "lr": config.lr,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "batch_size": config.batch_size,
        "steps": steps,
        "total_rounds": config.rounds,
        "schedule": config.schedule,
        "augment": augment_options(train.name) if config.augment else None,
        "optimizer": config.optimizer,
        "clip_grad_norm": config.clip_grad_norm,
    }
    weights_for = lambda model, matrix: run_weights(config, spec, model, matrix, sizes, train, log)  # noqa: E731
    if config.centralised:  # one model on the pooled data (cis/training/centralised.py)
        m = centralised_setup(config, spec, train, sgd, weights_for, log, not resume)
    else:
        m = build_method_setup(config, spec, train, clients, sgd, weights_for, log, not resume)  # builders.py
    for held_out in (splits.val, splits.test):  # the training split was checked before the model's check batch
        check_ids(m.model, held_out, config.dataset)
    if config.model and config.model_sha256 is None:  # what config.json records: the file this run starts from
        record = m.model.config()
        config = dataclasses.replace(config, model_sha256=record.get("sha256"), model_root=record.get("root"))
    if m.model.num_exits != spec.num_exits:
        raise CisError(
            f"spec {spec.name!r}: has {spec.num_exits} exits; the {config.method} model has {m.model.num_exits}"
        )
    m.model.to(device)
    apply_compute_options(m.model, m.trainer, config)
    trainer = with_amp(m.trainer, config.amp, device)
    engine = FederatedEngine(m.model, clients, m.chooser, trainer, m.aggregator, seed=config.seed)
    return Setup(config, spec, splits, m.model, clients, m.matrix, m.weights, engine, steps, device)


def checkpoint_meta(s: Setup) -> dict[str, Any]:
    train = s.splits.train
    return {
        "classes": train.classes,
        "normalisation": {"mean": train.mean, "std": train.std},
        "dataset": s.config.dataset,
        "data_sha256": s.splits.sha256,
        "centralised": s.config.centralised,
        "method": s.config.method,
        "options": s.config.options,
        "seed": s.config.seed,
        "val_size": s.config.val_size,
        "spec": spec_to_dict(s.spec),
        "strategy": s.config.strategy,
        "weights": s.weights.describe(),
        "round": s.engine.round,
        "rounds": s.config.rounds,
    }


def served_model(s: Setup) -> EarlyExitNet:
    """The global model as it is evaluated, checkpointed and exported: the engine's weights, and for
    HeteroFL's static BatchNorm its per-sub-model statistics recomputed over the nodes' training data
    when the weights changed since (cis/training/methods/static_bn.py)."""
    return refresh_statistics(s.engine, [c.x for c in s.clients], cast(int, s.config.batch_size))  # resolved() set it


def evaluate_round(s: Setup) -> dict:
    model = served_model(s)
    logits = predict_exits(model, s.splits.val.x)
    ev = evaluate_cis(
        s.spec, logits, s.splits.val.y, measure=s.config.confidence or s.spec.confidence, seed=s.config.seed
    )
    return {"val_exit_accuracy": {str(e): v for e, v in ev.exit_accuracy.items()}, "val_cis_accuracy": ev.accuracy}


def final_report(s: Setup) -> dict:
    model = served_model(s)
    val = predict_exits(model, s.splits.val.x)
    test = predict_exits(model, s.splits.test.x)
    return cis_report(s.spec, val, s.splits.val.y, test, s.splits.test.y, s.config.confidence, s.config.seed)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    tmp.replace(path)


_PAIR_KEYS = ("node", "exit", "loss", "steps", "samples", "lr", "exit_loss")


def round_line(s: Setup, r: dict) -> dict[str, Any]:
    """The metrics.jsonl line of a round before evaluation: losses per exit, lr, weights, a method's own statistics."""
    line: dict[str, Any] = {"round": r["round"], "train_seconds": r["train_seconds"]}
    losses: dict[str, list[float]] = {}
    for rec in r["pairs"]:  # a centralised round's one pair trains every exit: its exit_loss has each one's
        per_exit = rec.get("exit_loss") or {rec["exit"]: rec["loss"]}
        for e, value in (enumerate(per_exit, 1) if isinstance(per_exit, list) else per_exit.items()):
            losses.setdefault(str(e), []).append(value)
    line["loss"] = {e: float(np.mean(v)) for e, v in sorted(losses.items())}
    line["lr"] = r["pairs"][0]["lr"] if r["pairs"] else None
    extras = {rec["node"]: {k: v for k, v in rec.items() if k not in _PAIR_KEYS} for rec in r["pairs"]}
    if any(extras.values()):  # a method's own statistics (FLAME: avg_exit, train_flops; ReeFL: teacher)
        line["nodes"] = extras
    if s.config.method == "flame":  # round totals: average training exit and training FLOPs
        from cis.training.methods.flame import round_summary

        line.update(round_summary(r["pairs"]))
    line["weights"] = s.weights.at(r["round"]).tolist()
    stats = getattr(s.engine.aggregator, "last_stats", None)
    if stats:  # Algorithm 1: total coefficient per stage body and exit head, BN variances clamped at 0
        line["aggregation"] = stats
    return line


def train_run(
    config: RunConfig,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict:
    """Train (or resume) a run into ``out``; returns the summary (or a partial result when stopped). A new run
    that fails before its first checkpoint removes the files it wrote (only those: run_dir.py)."""
    out = Path(out)
    before = files_before(out)  # what a failed new run leaves as it was
    s = build_setup(config, spec=open_run_dir(out, resume), log=log, resume=resume)
    for earlier in ([out] if resume else []) + ([Path(config.init)] if config.init and not resume else []):
        same_data(s, earlier)
    if not resume:
        if config.init:
            warm_start(s.engine, config, log)
        write_run_start(s, out)
    try:
        write_json(out / "weights.json", s.weights.describe())
        _log_setup(s, log)
        if resume:
            _restore(s, out, log)
        stopped = _train_rounds(s, out, progress, stop_after)
        if stopped is not None:
            return {"stopped_after_round": stopped}
        with stage(f"round {s.engine.round}, testing the final model"):
            summary = run_summary(s)
    except CisError:
        if not resume:  # a new run's files, unless it saved a checkpoint: nothing --resume would take for a run
            discard_unstarted(out, before)
        raise
    except Exception as exc:  # the model or the data failed mid-run: one line, and no run dir --resume would trust
        raise failed_run(out, s.engine.round + 1, exc, None if resume else before) from None
    write_json(out / "summary.json", summary)
    return summary


def same_data(s: Setup, run_dir: Path) -> None:
    """One line when the data a run (resumed, or the --init run) recorded is not the data just loaded."""
    meta_file = run_dir / "checkpoint.json"
    recorded = read_json(meta_file).get("data_sha256") if meta_file.is_file() else None
    check_digest(s.config.dataset, s.splits.sha256, recorded, str(run_dir))


def write_run_start(s: Setup, out: Path) -> None:
    """A new run dir (made here) with its config.json, spec.toml and empty metrics.jsonl (both engines)."""
    check_out_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", s.config.to_json())
    write_spec(s.spec, out / "spec.toml")
    (out / "metrics.jsonl").write_text("")


def _log_setup(s: Setup, log: Callable[[str], None]) -> None:
    """The weights (and where a ramp goes), the nodes and J, the device."""
    config, w0 = s.config, s.weights.at(1)
    rounds = cast(int, config.rounds)  # resolved() set it
    ramps = config.strategy in ("flops", "serving-ramp", "balanced-ramp", "auto")
    log(
        f"aggregation weights ({config.strategy}): "
        + ", ".join(f"exit {e + 1} {w:.4f}" for e, w in enumerate(w0))
        + (" (round 1; ramps to " + ", ".join(f"{w:.4f}" for w in s.weights.at(rounds)) + ")" if ramps else "")
    )
    log(
        f"{len(s.clients)} nodes, sizes "
        + ", ".join(f"{c.id}:{c.size}" for c in s.clients)
        + f"; J = {s.steps} local steps per round"
    )
    log(
        f"device: {describe(s.device)}"
        + (", bf16 autocast" if config.amp == "bf16" else "")
        + (", channels_last" if config.memory_format == "channels_last" else "")
        + (", CUDA graphs" if config.cuda_graphs == "on" else "")
    )


def _restore(s: Setup, out: Path, log: Callable[[str], None]) -> None:
    """--resume: the engine from the last checkpoint, metrics.jsonl cut back to its round."""
    if not callable(getattr(s.engine.trainer, "load_state_dict", None)):
        raise CisError(
            f"--resume: method {s.config.method!r} keeps trainer state it cannot save; start the run again with "
            "another --out"
        )
    if not (out / "checkpoint.pt").is_file():
        return
    model, meta, extra = load_checkpoint(out, s.config.allow_model_change)
    s.engine.load_state_dict(extra["engine"], model.state_dict())
    lines = [ln for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln)["round"] <= s.engine.round]
    (out / "metrics.jsonl").write_text("".join(ln + "\n" for ln in kept))
    log(f"resuming after round {s.engine.round} of {s.config.rounds}")


@contextmanager
def stage(where: str) -> Iterator[None]:
    """A step after a round's training (its validation, its checkpoint, the final test): an error other than a
    CisError is a StepFailed that names it (``round 3, validating``), not the round that has not begun."""
    try:
        yield
    except CisError:
        raise
    except Exception as exc:
        raise StepFailed(where) from exc


def is_due(t: int, every: int, rounds: int) -> bool:
    """Whether round ``t`` validates (or checkpoints) at every ``every`` rounds: always at the last."""
    return t % every == 0 or t == rounds


def metrics_line(s: Setup, r: dict) -> dict[str, Any]:
    """Round ``r``'s metrics.jsonl line: :func:`round_line`, the validation when due, the seconds."""
    line = round_line(s, r)
    if is_due(r["round"], s.config.eval_every, cast(int, s.config.rounds)):  # resolved() set it
        t0 = time.perf_counter()
        line.update(evaluate_round(s))
        line["eval_seconds"] = time.perf_counter() - t0
    line["seconds"] = line["train_seconds"] + line.get("eval_seconds", 0.0)
    return line


def _train_rounds(s: Setup, out: Path, progress: bool, stop_after: int | None) -> int | None:
    """The rounds left, a metrics line and the due checkpoints each; the round it stopped after, if before the last."""
    from tqdm import tqdm

    config = s.config
    rounds = cast(int, config.rounds)  # resolved() set it
    bar = tqdm(
        total=rounds, initial=s.engine.round, desc="rounds", unit="round", file=sys.stderr, disable=not progress
    )
    with bar, open(out / "metrics.jsonl", "a") as metrics:
        while s.engine.round < rounds:
            r = s.engine.run_round()
            t = r["round"]
            with stage(f"round {t}, validating"):
                line = metrics_line(s, r)
            if "eval_seconds" in line:
                bar.set_postfix(
                    val=" ".join(f"{100 * v:.0f}" for v in line["val_exit_accuracy"].values()),
                    cis=f"{100 * line['val_cis_accuracy']:.1f}",
                )
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()
            if is_due(t, config.checkpoint_every, rounds):
                with stage(f"round {t}, saving its checkpoint"):
                    save_checkpoint(out, served_model(s), checkpoint_meta(s), {"engine": s.engine.state_dict()})
            bar.update(1)
            if stop_after is not None and t >= stop_after and t < rounds:
                return t
    return None


def run_summary(s: Setup) -> dict[str, Any]:
    """summary.json of a finished run: the final test report, the weights and the config that made it."""
    config, report = s.config, final_report(s)
    return {
        "dataset": config.dataset,
        "method": config.method,
        "options": config.options,
        "spec": s.spec.name,
        "strategy": config.strategy,
        "rounds": config.rounds,
        "seed": config.seed,
        "device": describe(s.device),
        "weights": s.weights.describe(),
        "test": report,
        "final_exit_accuracy": report["exit_accuracy"][str(s.spec.num_exits)],
        "cis_accuracy": report["cis_accuracy"],
        "sgd_steps": sgd_steps(s),
        "centralised": config.centralised,
        "data_sha256": s.splits.sha256,
    }


def sgd_steps(s: Setup) -> dict[str, Any]:
    """The run's compute in local SGD steps: per node, the root's and the total."""
    per_node = {c.id: int(n) for c, n in zip(s.clients, s.engine.sgd_steps)}
    roots = [n.id for n in s.spec.nodes if n.parent is None]
    root = per_node.get(roots[0]) if len(roots) == 1 else None  # None: several roots, or centralised (no nodes)
    out: dict[str, Any] = {"total": sum(per_node.values()), "root": root, "per_node": per_node}
    if s.config.centralised:  # what the federated run at the same flags would take, for a fair comparison
        out["per_round"] = s.steps
        out["federated"] = federated_steps(s.config, s.spec, len(s.splits.train))
    return out


def evaluate_run(run_dir: str | Path, spec: CisSpec | None = None, measure: str | None = None,
                 allow_model_change: bool = False, spec_file: str | Path | None = None) -> dict:
    """Evaluate a finished (or checkpointed) run under any spec (read from ``spec_file``) without retraining."""
    model, meta, _ = load_checkpoint(run_dir, allow_model_change)
    spec = check_spec_fits(spec or run_spec(meta, checkpoint_files(run_dir)[1]), model, meta, run_dir, spec_file)
    splits = load_run_data(meta, str(run_dir))
    val = predict_exits(model, splits.val.x)
    test = predict_exits(model, splits.test.x)
    report = cis_report(spec, val, splits.val.y, test, splits.test.y, measure, int(meta.get("seed", 0)))
    return {"run": str(run_dir), "spec": spec.name, "round": meta.get("round"), **report}


def measure_grad_variance(config: RunConfig) -> list[float]:
    """sigma_e^2 of the initial model (as balanced-adj would measure it)."""
    splits = run_splits(config, None, stated_classes(config))
    spec = resolve_spec(config, splits.train)
    model = method_model(config, spec.num_exits, splits.train, logger.info)
    if not model_has_exit_gradients(model):
        raise CisError(
            f"--measure-grad-variance: method {config.method!r} trains nested sub-models; "
            "their per-exit gradient variance is not defined on one graph"
        )
    return gradient_variance(  # resolved() filled batch_size (the dataset's default)
        model, splits.train.x, splits.train.y, cast(int, config.batch_size), config.sigma_batches, config.seed
    )
