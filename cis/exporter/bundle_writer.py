"""``export_bundle``: a trained run dir in, a verified bundle out.

Steps, in order (each failure is one CisError line):

1. load the checkpoint (refused when its tensors do not match its metadata's
   architecture) and the spec (``--spec`` or the one in the checkpoint meta);
2. rebuild the validation split the trainer used (dataset + seed from the meta);
3. cut the model by its own stage description (:mod:`cis.training.models.stage_plan`) and
   export every stage to a static ONNX graph with a dynamic batch dimension;
4. verify with onnxruntime: stage vs torch and chain vs full model at batch 1,
   an odd batch and a validation batch (fp32 graphs, max abs diff <= 1e-4);
5. calibrate the int8 carry scales on validation data, build the fp16 and int8
   variants, and measure each variant's validation accuracy per exit and the
   bytes a node forwards per request;
6. calibrate per-node thresholds with the one policy (``cis.core.policy.exit_policy``) on the
   logits of the graphs the bundle ships (to the spec's calculus, or with
   ``recalibration`` to measured rates: cis/exporter/recalibration.py), check the shares they reproduce
   (a FLAME model instead gets the patience policy, p_ev = 4 by default: no
   thresholds; the nodes table says ``"threshold": null, "patience": p`` and the
   calibration block the shares the rule gives on validation);
7. profile confidence and latency, build TensorRT engines (``trt=True``),
   and write stages, profiles and ``manifest.json`` (sha256 of every file).

The bundle is written to a temporary folder beside ``out_dir`` and moved into
place at the end, so a failed export never leaves half a bundle behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from cis.core.bundle import MANIFEST, StageInfo, TensorInfo
from cis.core.errors import CisError
from cis.core.paths import check_folder
from cis.core.policy.exit_policy import (
    ExitPolicy,
    calibrate_thresholds,
    evaluate_cis,
    evaluate_patience,
    exit_confidences,
)
from cis.core.rates import compute_rates
from cis.core.records import json_float
from cis.core.spec import CisSpec, load_spec, parse_spec
from cis.core.stages.contract import INPUT
from cis.core.stages.runner import StageRunner, run_chain
from cis.exporter.bundle_files import ExportRun, write_bundle
from cis.exporter.onnx_export import export_stage, resolve_exporter, tensor_infos, thread_count
from cis.exporter.profile import LATENCY_BATCHES, random_feeds
from cis.exporter.quantize import FEATURE_DTYPES, apply_feature_dtype, calibrate_int8, check_feature_dtype
from cis.exporter.recalibration import Recalibration, keep_unmeasured, previous_thresholds
from cis.exporter.verify import DEFAULT_ATOL, ODD_BATCH, torch_stages, verify_stages
from cis.training.models.contract import is_int
from cis.training.models.flops import count_flops
from cis.training.models.stage_plan import StagePlan, describe_stages

VAL_BATCH = 64
Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def _resolve_spec(spec: str | Path | CisSpec | dict | None, meta: dict, meta_path: Path) -> tuple[CisSpec, str]:
    """The spec to calibrate for (``spec``, else the run's) and where it came from."""
    from cis.training.checkpoint import run_spec

    if isinstance(spec, CisSpec):
        resolved, where = spec, f"spec {spec.name!r}"
    elif isinstance(spec, dict):
        resolved, where = parse_spec(spec, "<spec>"), "<spec>"
    elif spec is not None:
        resolved, where = load_spec(spec), str(spec)
    else:
        resolved, where = run_spec(meta, meta_path), f"{meta_path}: spec"
    return resolved, where


def _stage_flops(module: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> int:
    return count_flops(lambda: module(*example))  # attention's real work included (cis/training/models/flops.py)


def inference_patience(meta: dict, override: int | None = None) -> int | None:
    """The patience p_ev a bundle's policy uses: FLAME-trained runs get ``override``, else
    the run's option ``eval_patience``, else the paper's 4; other methods use thresholds (None)."""
    from cis.core.policy.patience import check_patience

    method = str(meta.get("method", "cis"))
    if method != "flame":
        if override is not None:
            raise CisError(
                f"--patience: the run's method is {method!r}; a patience policy applies to FLAME-trained models "
                "(method 'flame')"
            )
        return None
    from cis.training.methods.registry import effective_options

    value = override if override is not None else effective_options(method, meta.get("options"))["eval_patience"]
    return check_patience(int(value))


def _stage_info(
    k: int, exit_: int, model: onnx.ModelProto, qparams: dict[str, tuple[float, int]], feature_dtype: str
) -> StageInfo:
    def annotate(infos: tuple[TensorInfo, ...]) -> tuple[TensorInfo, ...]:
        if feature_dtype != "int8":
            return infos
        return tuple(
            TensorInfo(t.name, t.shape, t.dtype, *qparams[t.name]) if t.dtype == "int8" and t.name in qparams else t
            for t in infos
        )

    return StageInfo(
        index=k,
        exit=exit_,
        file=f"stages/stage{k}.onnx",
        inputs=annotate(tensor_infos(model.graph.input)),
        outputs=annotate(tensor_infos(model.graph.output)),
        flops=0,
        params=0,
    )


def _variant(
    plan: StagePlan, fp32: list[onnx.ModelProto], feature_dtype: str, qparams: dict[str, tuple[float, int]]
) -> tuple[list[onnx.ModelProto], list[StageInfo]]:
    """The stage graphs (and their manifest entries) with carries in ``feature_dtype``."""
    models, infos = [], []
    for st, m in zip(plan.stages, fp32):
        carry_in = () if st.index == 1 else st.inputs
        vm = apply_feature_dtype(m, carry_in, st.carry, feature_dtype, qparams)
        models.append(vm)
        infos.append(_stage_info(st.index, st.exit, vm, qparams, feature_dtype))
    return models, infos


def _runners(models: list[onnx.ModelProto], infos: list[StageInfo], threads: int) -> list[StageRunner]:
    return [StageRunner.from_model(m.SerializeToString(), info, threads=threads) for m, info in zip(models, infos)]


def _accuracy(logits: dict[int, np.ndarray], labels: np.ndarray) -> dict[int, float]:
    return {e: float(np.mean(v.argmax(-1) == labels)) for e, v in logits.items()}


def _prepare_out(out_dir: Path) -> None:
    check_folder(out_dir, "--out")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise CisError(f"{out_dir}: exists and is not a folder; expected a new or existing bundle folder for --out")
        if any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
            raise CisError(
                f"{out_dir}: folder is not empty and holds no bundle; expected a new folder (or an old bundle to "
                "replace)"
            )


def _load_run(run_dir: Path, spec: str | Path | CisSpec | dict | None, say: Progress,
              allow_model_change: bool = False, val: Any = None) -> ExportRun:
    """Step 1-2: the checkpoint, the spec, the trainer's validation split and the model's stage plan."""
    from cis.training.checkpoint import check_spec_fits, checkpoint_files, load_checkpoint
    from cis.training.data.loading import load_run_data

    _check_model_file(run_dir)
    model, meta, _ = load_checkpoint(run_dir, allow_model_change)  # said once read: a mistake is the only line
    say(f"loaded checkpoint {run_dir}")
    weights_path, meta_path = checkpoint_files(run_dir)
    spec_obj, where = _resolve_spec(spec, meta, meta_path)
    spec_obj = check_spec_fits(spec_obj, model, meta, run_dir, spec if isinstance(spec, (str, Path)) else None)
    if not any(n.arrival_rate > 0 for n in spec_obj.nodes):
        raise CisError(f"{where}: no node has an arrival_rate > 0; expected requests to arrive somewhere (the "
                       "thresholds are calibrated to the shares they serve)")
    if val is None:
        val = load_run_data(meta, str(run_dir)).val  # one line when the run's data file changed since
        say(f"loaded the validation split of {meta['dataset']!r} ({len(val)} samples)")
    if len(val) == 0:
        raise CisError(
            f"dataset {meta['dataset']!r}: empty validation split; expected validation data to calibrate thresholds"
        )
    plan = describe_stages(model)
    if list(plan.inputs) != [INPUT] or tuple(val.x.shape[1:]) != tuple(plan.inputs[INPUT]):
        raise CisError(
            f"dataset {meta['dataset']!r}: samples of shape {tuple(val.x.shape[1:])}; the model expects {plan.inputs}"
        )
    want = plan.input_dtypes.get(INPUT, torch.float32)
    x = torch.from_numpy(np.ascontiguousarray(val.x[:256]))
    if x.dtype.is_floating_point != want.is_floating_point:
        raise CisError(f"dataset {meta['dataset']!r}: samples of dtype {x.dtype}; the model takes {want}")
    plan.samples = {INPUT: x.to(want)}  # integer examples (token ids) are drawn from real samples
    return ExportRun(weights_path.parent, model, meta, weights_path, spec_obj, val, plan)  # the run folder


def _check_model_file(run_dir: Path) -> None:
    """A user model whose file is gone since the run: one line naming the path the run recorded and what to do
    (the rebuild's own line names a --model flag that cis export does not have)."""
    from cis.training.checkpoint import read_meta

    meta, meta_path = read_meta(run_dir)
    record = meta.get("model")
    ref = record.get("reference") if isinstance(record, dict) else None
    head, sep, _ = str(ref).rpartition(":")
    if not isinstance(ref, str) or not sep or not head.endswith(".py") or Path(head).expanduser().is_file():
        return
    fix = "restore it there, or train again with --model pointing where it is now"
    if not Path(head).expanduser().is_absolute():
        fix = f"run cis export from the folder the run was trained in (the path is relative to it), {fix}"
    raise CisError(f"{meta_path}: the run's model file {head} (model {ref}) is not there; expected the file the "
                   f"run was trained with, which the export rebuilds the model from: {fix}")


def _export_stages(
    plan: StagePlan, gen: torch.Generator, opset: int, exporter: str, say: Progress
) -> tuple[list[onnx.ModelProto], list[int], list[int]]:
    """Step 3: every stage to a static fp32 ONNX graph; with its FLOPs and parameter count."""
    example = plan.example_inputs(2, gen)
    torch_chain = torch_stages(plan, example)
    models, flops, params = [], [], []
    carry = dict(example)
    for st, touts in zip(plan.stages, torch_chain):
        say(f"exporting stage {st.index}/{plan.num_exits} ({exporter}, opset {opset})")
        args = tuple(carry[n] for n in st.inputs)
        models.append(export_stage(st, args, opset, exporter))
        flops.append(_stage_flops(st.module, tuple(a[:1] for a in args)))
        params.append(sum(p.numel() for p in st.module.parameters()))
        carry = {n: touts[n] for n in st.carry}
    return models, flops, params


def _verify(
    plan: StagePlan, models: list[onnx.ModelProto], val_x: np.ndarray, gen: torch.Generator, atol: float, threads: int,
    say: Progress,
) -> tuple[dict, list[StageInfo], list[StageRunner]]:
    """Step 4: the fp32 graphs against torch, stage by stage and chained; (figures, infos, runners)."""
    say("verifying stages and chain against torch (onnxruntime, CPU)")
    _, infos = _variant(plan, models, "fp32", {})
    runners = _runners(models, infos, threads)
    batches = {
        "batch1": plan.example_inputs(1, gen),
        f"batch{ODD_BATCH}": plan.example_inputs(ODD_BATCH, gen),
        "validation": {INPUT: torch.from_numpy(val_x[:VAL_BATCH])},
    }
    return verify_stages(plan, runners, batches, atol), infos, runners


def _feature_dtypes(
    plan: StagePlan, fp32: tuple[list[onnx.ModelProto], list[StageInfo], list[StageRunner]], val: Any,
    feature_dtype: str, threads: int, say: Progress,
) -> tuple[dict[str, Any], list[onnx.ModelProto], list[StageInfo], dict[int, np.ndarray]]:
    """Step 5: int8 scales from validation carries; every carry dtype's accuracy and bytes; the chosen
    variant's (report, graphs, infos, validation logits)."""
    say("calibrating int8 carries and comparing feature dtypes on validation data")
    samples: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(val), 256):
        outs = torch_stages(plan, {INPUT: torch.from_numpy(val.x[start : start + 256])})
        for st, o in zip(plan.stages, outs):
            for n in st.carry:
                if o[n].dtype == torch.float32:  # the variants convert only float32 carries
                    samples.setdefault(n, []).append(o[n].numpy())
    qparams = calibrate_int8(samples)
    del samples
    report: dict[str, Any] = {}
    chosen = None
    base_acc: dict[int, float] = {}
    fp32_logits: dict[int, np.ndarray] = {}
    for name in ["fp32"] + [d for d in FEATURE_DTYPES if d != "fp32"]:
        if name == "fp32":
            models, infos, runners = fp32
        else:
            models, infos = _variant(plan, fp32[0], name, qparams)
            runners = _runners(models, infos, threads)
        logits = run_chain(runners, val.x)
        acc = _accuracy(logits, val.y)
        if name == "fp32":
            base_acc, fp32_logits = acc, logits
        else:  # the variant must run at odd batch sizes too
            rng = np.random.default_rng(0)
            for b in (1, ODD_BATCH):
                run_chain(runners, random_feeds(infos[0].inputs, b, rng))
        report[name] = {
            "val_accuracy": {str(e): a for e, a in acc.items()},
            "val_accuracy_change": {str(e): a - base_acc[e] for e, a in acc.items()},
            "max_abs_logit_diff_vs_fp32": {str(e): float(np.max(np.abs(logits[e] - fp32_logits[e]))) for e in logits},
            "bytes_per_forwarded_request": {str(i.exit): i.carry_bytes_per_sample() for i in infos if i.carry_outputs},
        }
        as_is = {t.name: t.dtype for i in infos for t in i.carry_outputs if t.dtype != FEATURE_DTYPES[name]}
        if as_is and name != "fp32":  # not float32: every variant forwards them as they are (cis/exporter/quantize.py)
            report[name]["carries_as_is"] = as_is
        if name == feature_dtype:
            chosen = (models, infos, logits)
    assert chosen is not None
    return (report, *chosen)


def _decide(
    spec: CisSpec, meta: dict, patience: int | None, logits: dict[int, np.ndarray], labels: np.ndarray, say: Progress,
    recalibration: Recalibration | None = None,
) -> tuple[ExitPolicy, str, dict, dict]:
    """Step 6: the exit policy on the shipped graphs' validation logits; (policy, confidence measure of the
    profile, the manifest's nodes table, the calibration block)."""
    rates = recalibration.rates if recalibration else None
    targets = (rates or compute_rates(spec)).exit_share
    patience = inference_patience(meta, patience)
    measure = spec.confidence  # with patience too: the confidence profile (the simulator's service-time rows)
    nodes = {n.id: {"exit": n.exit, "stages": list(range(1, n.exit + 1))} for n in spec.nodes}
    if patience is None:
        say("calibrating thresholds per node" + (" to the measured rates" if rates else ""))
        conf = exit_confidences(logits, measure)
        policy = calibrate_thresholds(spec, conf, rates=rates)
        if recalibration is not None:
            policy = keep_unmeasured(policy, recalibration, conf)
        evaluation = evaluate_cis(spec, logits, labels, policy=policy)
        for n in spec.nodes:
            nodes[n.id]["threshold"] = json_float(policy.thresholds[n.id])
    else:
        # FLAME: the patience rule decides; no threshold to calibrate. The nodes table
        # then has "threshold": null and "patience": p; the calibration block reports the
        # shares and accuracy the rule gives on validation (the spec's targets only for reference).
        say(f"patience policy (p = {patience}): no thresholds to calibrate")
        policy = ExitPolicy("patience", {}, patience)
        evaluation = evaluate_patience(spec, logits, labels, patience)
        for n in spec.nodes:
            nodes[n.id].update(threshold=None, patience=patience)
    calibration = {
        "target_share_per_exit": {str(e): s for e, s in targets.items()},
        "achieved_share_per_exit": {str(e): s for e, s in evaluation.exit_shares.items()},
        "max_share_error": max(abs(evaluation.exit_shares[e] - targets[e]) for e in targets),
        "cis_accuracy": evaluation.accuracy,
        "exit_accuracy": {str(e): a for e, a in evaluation.exit_accuracy.items()},
        "samples": int(len(labels)),
    }
    if patience is not None:
        calibration.update(kind="patience", patience=patience)
    if recalibration is not None:
        calibration["rates_from"] = recalibration.measurement
        calibration["previous"] = previous_thresholds(recalibration, spec, logits, labels, policy, measure)
    return policy, measure, nodes, calibration


def export_bundle(
    run_dir: str | Path,
    out_dir: str | Path,
    spec: str | Path | CisSpec | dict | None = None,
    feature_dtype: str = "fp32",
    opset: int | None = None,
    trt: bool = False,
    trt_fp16: bool = True,
    exporter: str = "auto",
    atol: float = DEFAULT_ATOL,
    latency_repeats: int = 20,
    latency_batches: tuple[int, ...] = LATENCY_BATCHES,
    progress: Progress | None = None,
    patience: int | None = None,
    recalibration: Recalibration | None = None,
    allow_model_change: bool = False,
    val: Any = None,
) -> dict[str, Any]:
    """Cut, export, verify, calibrate and profile the model in ``run_dir``; write the bundle to ``out_dir``.

    A FLAME-trained run (``method`` "flame" in its metadata) gets a patience
    policy instead of thresholds: p_ev = ``patience``, else the run's option
    ``eval_patience``, else 4 (the paper's). ``patience`` for another method is refused.
    ``recalibration`` (``--rates-from``): thresholds for measured rates; ``spec`` is then the design
    updated with the measured arrival rates (:func:`cis.runtime.measure.update_spec`). ``val``: the validation samples
    to verify, calibrate and profile on, a :class:`cis.training.data.dataset.Dataset` (``load_dataset(REF).val``;
    default: the run's dataset's validation split, rebuilt from its seed). ``allow_model_change``: rebuild a user
    model whose file changed since the run. ``opset``: None gives 17 (18 with the dynamo exporter, which refuses
    a lower one). Returns the report: the manifest's main fields plus verification figures, per-feature-dtype
    accuracy and bytes, and the calibrated shares.
    """
    say = progress or _noop
    out_dir = Path(out_dir)
    exporter, opset = _check_before_export(out_dir, feature_dtype, exporter, opset, trt, latency_repeats)
    run = _load_run(Path(run_dir), spec, say, allow_model_change, val)
    if inference_patience(run.meta, patience) is not None and recalibration is not None:  # --patience checked now
        raise CisError(f"--rates-from: {run_dir} is a FLAME run served by its patience rule; it has no thresholds "
                       "to calibrate")
    threads = thread_count()
    models, infos, logits, verification, dtype_report, (flops, params) = _stages(
        run, (opset, exporter), atol, feature_dtype, threads, say
    )
    policy, measure, nodes, calibration = _decide(run.spec, run.meta, patience, logits, run.val.y, say, recalibration)
    report = {
        "feature_dtype": feature_dtype, "opset": opset, "exporter": exporter, "verification": _json_keys(verification),
        "feature_dtypes": dtype_report, "calibration": calibration, "nodes": nodes, "policy": policy.to_json(),
    }
    manifest_fields = {"measure": measure, "flops": flops, "params": params, "threads": threads,
                       "latency_batches": latency_batches, "latency_repeats": latency_repeats}
    latency, stages, trt_report = write_bundle(out_dir, run, models, infos, logits, report, manifest_fields,
                                                trt, trt_fp16, say)
    say(f"wrote {out_dir}")
    return {
        "bundle": str(out_dir),
        "stages": len(stages),
        **report,
        "latency": {str(k): {str(b): s for b, s in v.items()} for k, v in latency.items()},
        "tensorrt": trt_report,
    }


def _stages(run, how: tuple[int, str], atol: float, feature_dtype: str, threads: int, say: Progress):
    """Export every stage (``how``: opset and exporter), verify the fp32 graphs against torch, then build the
    stages in the feature dtype: (models, infos, validation logits, verification, dtype report, (flops, params))."""
    gen = torch.Generator().manual_seed(0)  # the example inputs of the export, then of the verification
    fp32_models, flops, params = _export_stages(run.plan, gen, how[0], how[1], say)
    verification, fp32_infos, fp32_runners = _verify(run.plan, fp32_models, run.val.x, gen, atol, threads, say)
    dtype_report, models, infos, logits = _feature_dtypes(
        run.plan, (fp32_models, fp32_infos, fp32_runners), run.val, feature_dtype, threads, say
    )
    return models, infos, logits, verification, dtype_report, (flops, params)


def _check_before_export(out_dir: Path, feature_dtype: str, exporter: str, opset: int | None, trt: bool,
                         latency_repeats: int) -> tuple[str, int]:
    """What can be refused before the slow part (the feature dtype, exporter, --out, TensorRT, the latency
    repeats); the exporter and opset resolved."""
    if not (is_int(latency_repeats) and latency_repeats >= 1):
        raise CisError(f"--latency-repeats is {latency_repeats!r}; expected an integer >= 1 (timed runs per stage "
                       "and batch size)")
    check_feature_dtype(feature_dtype)
    exporter, opset = resolve_exporter(exporter, opset, strict=True)  # dynamo with opset < 18: refused
    _prepare_out(out_dir)
    if trt:
        from cis.exporter.tensorrt import require_tensorrt

        require_tensorrt()
    return exporter, opset


def _json_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_keys(v) for k, v in obj.items()}
    return obj
