"""Step 7 of :func:`cis.exporter.bundle_writer.export_bundle`: write the bundle folder.

Graphs, profiles, TensorRT engines and ``manifest.json`` go to a temporary folder beside
``out_dir``, which replaces ``out_dir`` only once everything is written, so a failed export
never leaves half a bundle behind. See docs/bundle.md for the manifest's fields.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from cis.core.bundle import StageInfo, sha256_file, write_manifest, write_profiles
from cis.core.spec import CisSpec, spec_to_dict
from cis.core.stages.runner import ProviderError, StageRunner
from cis.core.version import __version__
from cis.exporter.profile import confidence_profile, latency_profile
from cis.exporter.tensorrt import build_engines
from cis.training.models.contract import EarlyExitNet
from cis.training.models.stage_plan import StagePlan

Progress = Callable[[str], None]


@dataclass
class ExportRun:
    """What the export reads: the trained model, its metadata, the spec and the validation split."""

    run_dir: Path
    model: EarlyExitNet
    meta: dict
    weights_path: Path
    spec: CisSpec
    val: Any  # cis.training.data.loading split: x (N, ...), y (N,)
    plan: StagePlan


def versions(trt: bool) -> dict[str, str]:
    import onnxruntime

    out = {
        "cis": __version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    if trt:
        import tensorrt

        out["tensorrt"] = tensorrt.__version__
    return out


def stage_entries(root: Path, infos: list[StageInfo], flops: list[int], params: list[int],
                   engines: dict[int, str]) -> list[dict[str, Any]]:
    """The manifest's ``stages`` table (the graphs are written under ``root`` already)."""
    out = []
    for info, f, p in zip(infos, flops, params):
        entry: dict[str, Any] = {
            "index": info.index,
            "exit": info.exit,
            "file": info.file,
            "sha256": sha256_file(root / info.file),
            "bytes": (root / info.file).stat().st_size,
            "inputs": [t.to_json() for t in info.inputs],
            "outputs": [t.to_json() for t in info.outputs],
            "carry_bytes_per_sample": info.carry_bytes_per_sample(),
            "flops": f,
            "params": p,
        }
        if info.index in engines:
            entry["engine"] = engines[info.index]
        out.append(entry)
    return out


def write_bundle(
    out_dir: Path, run: ExportRun, models: list[onnx.ModelProto], infos: list[StageInfo], logits: dict[int, np.ndarray],
    report: dict[str, Any], fields: dict[str, Any], trt: bool, trt_fp16: bool, say: Progress,
) -> tuple[dict, list[dict], dict | None]:
    """Step 7: graphs, profiles, engines and manifest into a temporary folder, moved into place at the end."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a bundle is meant to be shared
        (tmp / "stages").mkdir()
        for m, info in zip(models, infos):
            onnx.save_model(m, str(tmp / info.file))
        say("profiling latency (onnxruntime)")
        runners = [StageRunner.from_model(tmp / info.file, info, threads=fields["threads"]) for info in infos]
        latency = latency_profile(runners, fields["latency_batches"], fields["latency_repeats"], x=run.val.x)
        trt_report, trt_runners = None, list[StageRunner]()
        if trt:
            trt_report, trt_runners = build_engines(tmp, models, infos, runners, run.val.x, trt_fp16, say)
        gpu = gpu_profiles(tmp, infos, trt_runners, fields, say, run.val.x)
        c_arr, ok_arr = confidence_profile(logits, run.val.y, fields["measure"])
        predicted = np.stack([logits[e].argmax(-1) for e in sorted(logits)], axis=1)
        write_profiles(tmp, c_arr, ok_arr, latency, predicted, gpu)
        engines = {int(k): v["engine"] for k, v in trt_report["stages"].items()} if trt_report else {}
        stages = stage_entries(tmp, infos, fields["flops"], fields["params"], engines)
        write_manifest(tmp, manifest(run, report, fields, stages, trt_report))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return latency, stages, trt_report


def request_inputs(
    stage1_inputs: list[dict[str, Any]], normalisation: dict | None, ids: tuple[str, int] | None = None
) -> list[dict[str, Any]]:
    """The manifest's ``inputs``: what a request carries (stage 1's inputs: name, dtype, shape with null for the
    batch) and the preprocessing that turns raw data into it: ``normalise`` (x / 255 - mean) / std per channel
    for images, ``none`` for anything else (token ids, sequences, already normalised arrays). An integer input
    gets ``index_range``: [0, num_embeddings] where an embedding reads it (``ids``: the model's
    :func:`cis.training.models.contract.input_index_range`), else null (any value; docs/bundle.md)."""
    norm = normalisation or {}
    mean, std = norm.get("mean"), norm.get("std")
    out = []
    for t in stage1_inputs:
        floats = str(t["dtype"]).startswith("float")
        if floats and mean and std and len(t["shape"]) == 4:
            pre: dict[str, Any] = {"kind": "normalise", "scale": 1 / 255, "mean": list(mean), "std": list(std)}
        else:
            pre = {"kind": "none"}
        entry = {"name": t["name"], "dtype": t["dtype"], "shape": list(t["shape"]), "preprocessing": pre}
        if str(t["dtype"]).startswith(("int", "uint")):
            entry["index_range"] = [0, ids[1]] if ids is not None and len(stage1_inputs) == 1 else None
        out.append(entry)
    return out


def gpu_profiles(
    root: Path, infos: list[StageInfo], trt_runners: list[StageRunner], fields: dict[str, Any], say: Progress,
    x: np.ndarray | None = None,
) -> dict[str, dict[int, dict[int, float]]]:
    """Latency profiles of the GPU backends this machine has, by backend (cis serve --provider, the simulator):
    ``cuda`` when onnxruntime's CUDA provider runs here, ``tensorrt`` for the engines just built."""
    out = {}
    try:
        cuda = [StageRunner.from_model(root / info.file, info, "cuda") for info in infos]
    except ProviderError:
        cuda = []
    for name, runners in (("cuda", cuda), ("tensorrt", trt_runners)):
        if runners:
            say(f"profiling latency ({name})")
            out[name] = latency_profile(runners, fields["latency_batches"], fields["latency_repeats"], x=x)
    return out


def _index_range(run: ExportRun) -> tuple[str, int] | None:
    """The input embedding's rows, for a model of integer inputs (token ids)."""
    from cis.training.models.contract import input_index_range

    x = np.ascontiguousarray(run.val.x[:1])
    return input_index_range(run.model, torch.from_numpy(x)) if x.dtype.kind in "iu" else None


def manifest(run: ExportRun, report: dict[str, Any], fields: dict[str, Any], stages: list[dict],
              trt_report: dict | None) -> dict[str, Any]:
    meta = run.meta
    manifest = {
        "method": str(meta.get("method", "cis")),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": run.model.config(),
        "classes": list(meta["classes"]),
        "normalisation": meta["normalisation"],
        "inputs": request_inputs(stages[0]["inputs"], meta.get("normalisation"), _index_range(run)),
        "dataset": meta["dataset"],
        "seed": int(meta.get("seed", 0)),
        **{k: report[k] for k in ("feature_dtype", "opset", "exporter")},
        "stages": stages,
        **{k: report[k] for k in ("nodes", "policy")},
        "spec": spec_to_dict(run.spec),
        **{k: report[k] for k in ("calibration", "feature_dtypes", "verification")},
        "profiles": {
            "confidence": "profiles/confidence.npz",
            "latency": "profiles/latency.json",
            "measure": fields["measure"],
            "latency_batches": list(fields["latency_batches"]),
            "latency_repeats": fields["latency_repeats"],
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "threads": fields["threads"],
        },
        "source": {"run_dir": str(run.run_dir), "checkpoint_sha256": sha256_file(run.weights_path)},
        "versions": versions(trt_report is not None),
    }
    if trt_report is not None:
        manifest["tensorrt"] = trt_report
    return manifest
