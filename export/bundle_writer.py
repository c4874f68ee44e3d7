"""``export_bundle``: a trained run dir in, a verified bundle out.

Steps, in order (each failure is one CisError line):

1. load the checkpoint (refused when its tensors do not match its metadata's
   architecture) and the spec (``--spec`` or the one in the checkpoint meta);
2. rebuild the validation split the trainer used (dataset + seed from the meta);
3. cut the model by its own stage description (:mod:`training.stage_plan`) and
   export every stage to a static ONNX graph with a dynamic batch dimension;
4. verify with onnxruntime: stage vs torch and chain vs full model at batch 1,
   an odd batch and a validation batch (fp32 graphs, max abs diff <= 1e-4);
5. calibrate the int8 carry scales on validation data, build the fp16 and int8
   variants, and measure each variant's validation accuracy per exit and the
   bytes a node forwards per request;
6. calibrate per-node thresholds with the one policy (``cis.policy``) on the
   logits of the graphs the bundle ships, check the shares they reproduce
   (a FLAME model instead gets the patience policy, p_ev = 4 by default: no
   thresholds; the nodes table says ``"threshold": null, "patience": p`` and the
   calibration block the shares the rule gives on validation);
7. profile confidence and latency, build TensorRT engines (``trt=True``),
   and write stages, profiles and ``manifest.json`` (sha256 of every file).

The bundle is written to a temporary folder beside ``out_dir`` and moved into
place at the end, so a failed export never leaves half a bundle behind.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch
from torch.utils.flop_counter import FlopCounterMode

import cis
from cis.bundle import MANIFEST, StageInfo, TensorInfo, sha256_file, write_manifest, write_profiles
from cis.errors import CisError
from cis.metrics import json_float
from cis.policy import ExitPolicy, calibrate_thresholds, evaluate_cis, evaluate_patience, exit_confidences
from cis.rates import compute_rates
from cis.spec import CisSpec, load_spec, parse_spec, spec_to_dict
from cis.stages import INPUT, StageRunner, carry_of, run_chain
from export.onnx_export import export_stage, resolve_exporter, tensor_infos, thread_count
from export.profile import LATENCY_BATCHES, confidence_profile, latency_profile, random_feeds
from export.quantize import FEATURE_DTYPES, apply_feature_dtype, calibrate_int8, check_feature_dtype
from export.verify import DEFAULT_ATOL, verify_stages
from training.stage_plan import StagePlan, describe_stages, run_plan

ODD_BATCH = 17
VAL_BATCH = 64
Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def _resolve_spec(spec: str | Path | CisSpec | dict | None, meta: dict, meta_path: str) -> CisSpec:
    if isinstance(spec, CisSpec):
        return spec
    if isinstance(spec, dict):
        return parse_spec(spec, "<spec>")
    if spec is not None:
        return load_spec(spec)
    if not meta.get("spec"):
        raise CisError(f"{meta_path}: no 'spec' in the checkpoint metadata; pass --spec SPEC (a CIS spec TOML)")
    return parse_spec(meta["spec"], f"{meta_path}: spec")


def _stage_flops(module: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module(*example)
    return int(counter.get_total_flops())


def _versions(trt: bool) -> dict[str, str]:
    import onnxruntime

    out = {
        "cis": cis.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    if trt:
        import tensorrt  # type: ignore[import-not-found]

        out["tensorrt"] = tensorrt.__version__
    return out


def inference_patience(meta: dict, override: int | None = None) -> int | None:
    """The patience p_ev a bundle's policy uses: FLAME-trained runs get ``override``, else
    the run's option ``eval_patience``, else the paper's 4; other methods use thresholds (None)."""
    from cis.patience import check_patience

    method = str(meta.get("method", "cis"))
    if method != "flame":
        if override is not None:
            raise CisError(f"--patience: the run's method is {method!r}; a patience policy applies to FLAME-trained models (method 'flame')")
        return None
    from training.methods.registry import effective_options

    value = override if override is not None else effective_options(method, meta.get("options"))["eval_patience"]
    return check_patience(int(value))


def _stage_info(k: int, exit_: int, model: onnx.ModelProto, qparams: dict[str, tuple[float, int]], feature_dtype: str) -> StageInfo:
    def annotate(infos: tuple[TensorInfo, ...]) -> tuple[TensorInfo, ...]:
        if feature_dtype != "int8":
            return infos
        return tuple(TensorInfo(t.name, t.shape, t.dtype, *qparams[t.name]) if t.dtype == "int8" and t.name in qparams else t for t in infos)

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
    if out_dir.exists():
        if not out_dir.is_dir():
            raise CisError(f"{out_dir}: exists and is not a folder; expected a new or existing bundle folder for --out")
        if any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
            raise CisError(f"{out_dir}: folder is not empty and holds no bundle; expected a new folder (or an old bundle to replace)")


def export_bundle(
    run_dir: str | Path,
    out_dir: str | Path,
    spec: str | Path | CisSpec | dict | None = None,
    feature_dtype: str = "fp32",
    opset: int = 17,
    trt: bool = False,
    trt_fp16: bool = True,
    exporter: str = "auto",
    atol: float = DEFAULT_ATOL,
    latency_repeats: int = 20,
    latency_batches: tuple[int, ...] = LATENCY_BATCHES,
    progress: Progress | None = None,
    patience: int | None = None,
) -> dict[str, Any]:
    """Cut, export, verify, calibrate and profile the model in ``run_dir``; write the bundle to ``out_dir``.

    A FLAME-trained run (``method`` "flame" in its metadata) gets a patience
    policy instead of thresholds: p_ev = ``patience``, else the run's option
    ``eval_patience``, else 4 (the paper's). ``patience`` for another method is refused.

    Returns the report: the manifest's main fields plus verification figures,
    per-feature-dtype accuracy and bytes, and the calibrated shares.
    """
    say = progress or _noop
    check_feature_dtype(feature_dtype)
    exporter, opset = resolve_exporter(exporter, opset)
    out_dir = Path(out_dir)
    _prepare_out(out_dir)
    if trt:  # fail before the slow part
        from export.tensorrt import require_tensorrt

        require_tensorrt()

    from training.checkpoint import META, WEIGHTS, load_checkpoint
    from training.data import load_dataset

    run_dir = Path(run_dir)
    say(f"loading checkpoint {run_dir}")
    model, meta, _ = load_checkpoint(run_dir)
    meta_path = str(run_dir / META) if run_dir.is_dir() else str(run_dir.with_suffix(".json"))
    weights_path = run_dir / WEIGHTS if run_dir.is_dir() else run_dir
    spec_obj = _resolve_spec(spec, meta, meta_path)
    config = model.config()
    num_classes = int(config.get("num_classes", len(meta["classes"])))
    if spec_obj.num_exits != model.num_exits:
        raise CisError(f"spec {spec_obj.name!r}: [cis] exits is {spec_obj.num_exits}; the model in {run_dir} has {model.num_exits} exits")
    if spec_obj.num_classes != num_classes:
        raise CisError(f"spec {spec_obj.name!r}: [cis] classes is {spec_obj.num_classes}; the model in {run_dir} has {num_classes}")

    say(f"loading validation split of {meta['dataset']!r}")
    splits = load_dataset(str(meta["dataset"]), seed=int(meta.get("seed", 0)), val_size=meta.get("val_size"))
    val = splits.val
    if len(val) == 0:
        raise CisError(f"dataset {meta['dataset']!r}: empty validation split; expected validation data to calibrate thresholds")
    plan = describe_stages(model)
    if list(plan.inputs) != [INPUT] or tuple(val.x.shape[1:]) != tuple(plan.inputs[INPUT]):
        raise CisError(f"dataset {meta['dataset']!r}: samples of shape {tuple(val.x.shape[1:])}; the model expects {plan.inputs}")

    # ---------------------------------------------------------------- export
    threads = thread_count()
    gen = torch.Generator().manual_seed(0)
    example = plan.example_inputs(2, gen)
    torch_chain = run_plan(plan, example)
    fp32_models, flops, params = [], [], []
    carry = dict(example)
    for st, touts in zip(plan.stages, torch_chain):
        say(f"exporting stage {st.index}/{plan.num_exits} ({exporter}, opset {opset})")
        args = tuple(carry[n] for n in st.inputs)
        fp32_models.append(export_stage(st, args, opset, exporter))
        flops.append(_stage_flops(st.module, tuple(a[:1] for a in args)))
        params.append(sum(p.numel() for p in st.module.parameters()))
        carry = {n: touts[n] for n in st.carry}

    # ---------------------------------------------------------------- verify (fp32)
    say("verifying stages and chain against torch (onnxruntime, CPU)")
    _, fp32_infos = _variant(plan, fp32_models, "fp32", {})
    fp32_runners = _runners(fp32_models, fp32_infos, threads)
    val_batch = {INPUT: torch.from_numpy(val.x[:VAL_BATCH])}
    batches = {
        "batch1": plan.example_inputs(1, gen),
        f"batch{ODD_BATCH}": plan.example_inputs(ODD_BATCH, gen),
        "validation": val_batch,
    }
    verification = verify_stages(plan, fp32_runners, batches, atol)

    # ---------------------------------------------------------------- feature dtypes
    say("calibrating int8 carries and comparing feature dtypes on validation data")
    samples: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(val), 256):
        outs = run_plan(plan, {INPUT: torch.from_numpy(val.x[start : start + 256])})
        for st, o in zip(plan.stages, outs):
            for n in st.carry:
                samples.setdefault(n, []).append(o[n].numpy())
    qparams = calibrate_int8(samples)
    del samples
    dtype_report: dict[str, Any] = {}
    chosen: tuple[list[onnx.ModelProto], list[StageInfo], dict[int, np.ndarray]] | None = None
    base_acc: dict[int, float] | None = None
    fp32_logits: dict[int, np.ndarray] | None = None
    for name in ["fp32"] + [d for d in FEATURE_DTYPES if d != "fp32"]:
        models, infos = (fp32_models, fp32_infos) if name == "fp32" else _variant(plan, fp32_models, name, qparams)
        runners = fp32_runners if name == "fp32" else _runners(models, infos, threads)
        logits = run_chain(runners, val.x)
        acc = _accuracy(logits, val.y)
        if name == "fp32":
            base_acc, fp32_logits = acc, logits
        else:  # the variant must run at odd batch sizes too
            rng = np.random.default_rng(0)
            for b in (1, ODD_BATCH):
                run_chain(runners, random_feeds(infos[0].inputs, b, rng))
        assert base_acc is not None and fp32_logits is not None
        dtype_report[name] = {
            "val_accuracy": {str(e): a for e, a in acc.items()},
            "val_accuracy_change": {str(e): a - base_acc[e] for e, a in acc.items()},
            "max_abs_logit_diff_vs_fp32": {str(e): float(np.max(np.abs(logits[e] - fp32_logits[e]))) for e in logits},
            "bytes_per_forwarded_request": {str(i.exit): i.carry_bytes_per_sample() for i in infos if i.carry_outputs},
        }
        if name == feature_dtype:
            chosen = (models, infos, logits)
    assert chosen is not None
    models, infos, logits = chosen

    # ---------------------------------------------------------------- thresholds
    targets = compute_rates(spec_obj).exit_share
    patience = inference_patience(meta, patience)
    if patience is None:
        say("calibrating thresholds per node")
        measure = spec_obj.confidence
        conf = exit_confidences(logits, measure)
        policy = calibrate_thresholds(spec_obj, conf)
        evaluation = evaluate_cis(spec_obj, logits, val.y, policy=policy)
        nodes = {
            n.id: {"exit": n.exit, "stages": list(range(1, n.exit + 1)), "threshold": json_float(policy.thresholds[n.id])}
            for n in spec_obj.nodes
        }
    else:
        # FLAME: the patience rule decides; no threshold to calibrate. The nodes table
        # then has "threshold": null and "patience": p; the calibration block reports the
        # shares and accuracy the rule gives on validation (the spec's targets only for reference).
        say(f"patience policy (p = {patience}): no thresholds to calibrate")
        measure = spec_obj.confidence  # for the confidence profile (the simulator's service-time rows)
        policy = ExitPolicy("patience", {}, patience)
        evaluation = evaluate_patience(spec_obj, logits, val.y, patience)
        nodes = {
            n.id: {"exit": n.exit, "stages": list(range(1, n.exit + 1)), "threshold": None, "patience": patience}
            for n in spec_obj.nodes
        }
    calibration = {
        "target_share_per_exit": {str(e): s for e, s in targets.items()},
        "achieved_share_per_exit": {str(e): s for e, s in evaluation.exit_shares.items()},
        "max_share_error": max(abs(evaluation.exit_shares[e] - targets[e]) for e in targets),
        "cis_accuracy": evaluation.accuracy,
        "exit_accuracy": {str(e): a for e, a in evaluation.exit_accuracy.items()},
        "samples": int(len(val)),
    }
    if patience is not None:
        calibration.update(kind="patience", patience=patience)

    # ---------------------------------------------------------------- write
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a bundle is meant to be shared
        (tmp / "stages").mkdir()
        for m, info in zip(models, infos):
            onnx.save_model(m, str(tmp / info.file))
        say("profiling latency (onnxruntime)")
        runners = [StageRunner.from_model(tmp / info.file, info, threads=threads) for info in infos]
        latency = latency_profile(runners, latency_batches, latency_repeats)
        c_arr, ok_arr = confidence_profile(logits, val.y, measure)
        predicted = np.stack([logits[e].argmax(-1) for e in sorted(logits)], axis=1)
        write_profiles(tmp, c_arr, ok_arr, latency, predicted)

        engines: dict[int, str] = {}
        trt_report: dict[str, Any] | None = None
        if trt:
            trt_report = _build_engines(tmp, models, infos, runners, val.x, trt_fp16, say)
            engines = {int(k): v["engine"] for k, v in trt_report["stages"].items()}

        stages_json = []
        for info, f, p in zip(infos, flops, params):
            entry: dict[str, Any] = {
                "index": info.index,
                "exit": info.exit,
                "file": info.file,
                "sha256": sha256_file(tmp / info.file),
                "bytes": (tmp / info.file).stat().st_size,
                "inputs": [t.to_json() for t in info.inputs],
                "outputs": [t.to_json() for t in info.outputs],
                "carry_bytes_per_sample": info.carry_bytes_per_sample(),
                "flops": f,
                "params": p,
            }
            if info.index in engines:
                entry["engine"] = engines[info.index]
            stages_json.append(entry)
        manifest = {
            "method": str(meta.get("method", "cis")),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": config,
            "classes": list(meta["classes"]),
            "normalisation": meta["normalisation"],
            "dataset": meta["dataset"],
            "seed": int(meta.get("seed", 0)),
            "feature_dtype": feature_dtype,
            "opset": opset,
            "exporter": exporter,
            "stages": stages_json,
            "nodes": nodes,
            "policy": policy.to_json(),
            "spec": spec_to_dict(spec_obj),
            "calibration": calibration,
            "feature_dtypes": dtype_report,
            "verification": _json_keys(verification),
            "profiles": {
                "confidence": "profiles/confidence.npz",
                "latency": "profiles/latency.json",
                "measure": measure,
                "latency_batches": list(latency_batches),
                "latency_repeats": latency_repeats,
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                "threads": threads,
            },
            "source": {"run_dir": str(run_dir), "checkpoint_sha256": sha256_file(weights_path)},
            "versions": _versions(trt),
        }
        if trt_report is not None:
            manifest["tensorrt"] = trt_report
        write_manifest(tmp, manifest)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out_dir}")
    return {
        "bundle": str(out_dir),
        "stages": len(stages_json),
        "feature_dtype": feature_dtype,
        "opset": opset,
        "exporter": exporter,
        "verification": manifest["verification"],
        "feature_dtypes": dtype_report,
        "calibration": calibration,
        "nodes": nodes,
        "policy": manifest["policy"],
        "latency": {str(k): {str(b): s for b, s in v.items()} for k, v in latency.items()},
        "tensorrt": trt_report,
    }


def _json_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_keys(v) for k, v in obj.items()}
    return obj


def _build_engines(root: Path, models, infos, runners, x: np.ndarray, fp16: bool, say: Progress) -> dict[str, Any]:
    from export.tensorrt import PROFILE, EngineRunner, TensorRTError, build_engine, compare

    report: dict[str, Any] = {"precision": "fp16" if fp16 else "fp32", "profile": list(PROFILE), "stages": {}}
    rng = np.random.default_rng(0)
    carry: dict[str, dict[str, np.ndarray]] = {
        "batch1": random_feeds(infos[0].inputs, 1, rng),
        f"batch{ODD_BATCH}": random_feeds(infos[0].inputs, ODD_BATCH, rng),
        "validation": {infos[0].inputs[0].name: np.ascontiguousarray(x[: PROFILE[2]])},
    }
    for m, info, runner in zip(models, infos, runners):
        say(f"building TensorRT engine for stage {info.index}")
        engine = build_engine(m.SerializeToString(), fp16=fp16, where=f"stage {info.index}")
        rel = f"stages/stage{info.index}.plan"
        (root / rel).write_bytes(engine)
        trt_runner = EngineRunner(engine)
        checks = {}
        for label, feeds in carry.items():
            ref = runner.run(feeds)
            got = trt_runner.run(feeds)
            checks[label] = compare(ref, got, fp16)
            if not checks[label]["passed"]:
                raise TensorRTError(f"stage {info.index}: TensorRT engine differs from onnxruntime at {label}: {checks[label]}")
            carry[label] = carry_of(ref)
        report["stages"][str(info.index)] = {"engine": rel, "checks": checks, "sha256": hashlib.sha256(engine).hexdigest()}
    return report
