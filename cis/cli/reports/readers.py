"""Read what a folder holds into a report section: one function per folder kind.

A folder's kind is what it holds (:func:`detect_kind`): ``manifest.json`` (bundle),
``metrics.jsonl`` or ``checkpoint.json`` (training run), ``result.json`` (``cis simulate --out``),
``summary.json`` + ``requests.csv`` (a demo's runtime replay), ``comparison.json`` (``cis demo``).
Latencies follow :mod:`cis.core.records` (seconds, one summary format). numpy only, no torch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import CisError
from cis.core.records import latency_summary, read_requests, served_latencies

log = logging.getLogger(__name__)
INPUTS = {
    "run": ("config.json", "summary.json", "metrics.jsonl", "checkpoint.json"),
    "sim": ("result.json", "requests.csv"),
    "runtime": ("summary.json", "requests.csv"),
    "demo": ("comparison.json",),
}
"""The files a report of a folder of each kind reads (a bundle: every file in it, the manifest and what it lists;
a demo folder: also its subfolders', each of its own kind)."""
DEMO_PARTS = {"run": "run", "bundle": "bundle", "runtime": "runtime", "sim": "sim", "sim-bundle": "sim"}


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CisError(f"{path}: cannot read ({exc.__class__.__name__}: {exc}); expected a JSON file") from None


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSON-lines file, one per non-empty line. A last line cut short (a run killed mid-write)
    is skipped with a warning; a bad line before it is one line naming the file and the line."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CisError(f"{path}: cannot read ({exc.__class__.__name__}: {exc}); expected a JSON-lines file") from None
    numbered = [(k + 1, ln) for k, ln in enumerate(lines) if ln.strip()]
    rows = []
    for k, (line, text) in enumerate(numbered):
        try:
            row = json.loads(text)
        except ValueError as exc:
            if k == len(numbered) - 1:
                log.warning("%s:%d: skipped the last line, cut short (%s); a run stopped while writing it", path,
                            line, exc)
                break
            raise CisError(f"{path}:{line}: not JSON ({exc}); expected one JSON object per line") from None
        if not isinstance(row, dict):
            raise CisError(f"{path}:{line}: a JSON {type(row).__name__}; expected one JSON object per line")
        rows.append(row)
    return rows


def reads(folder: Path, kind: str, target: Path) -> bool:
    """Whether the report of ``folder`` (a folder of ``kind``) reads the file ``target``."""
    try:
        rel = target.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    if not rel.parts:
        return False
    if kind == "bundle":
        return target.is_file() or rel.parts == ("manifest.json",)
    if kind == "demo" and len(rel.parts) > 1 and rel.parts[0] in DEMO_PARTS:
        return reads(folder / rel.parts[0], DEMO_PARTS[rel.parts[0]], target)
    return rel.as_posix() in INPUTS.get(kind, ())


def detect_kind(path: Path) -> str:
    if (path / "comparison.json").is_file():
        return "demo"
    if (path / "manifest.json").is_file():
        return "bundle"
    if (path / "metrics.jsonl").is_file() or (path / "checkpoint.json").is_file():
        return "run"
    if (path / "result.json").is_file():
        return "sim"
    if (path / "summary.json").is_file() and (path / "requests.csv").is_file():
        return "runtime"
    raise CisError(
        f"{path}: not a folder cis report knows; expected a run dir (metrics.jsonl), a bundle (manifest.json), "
        "a simulation (result.json) or a demo folder (comparison.json)"
    )


def _expect(path: Path, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is a ``kind`` (None: absent, as it is); else one line naming the file."""
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise CisError(f"{path}: {what} is {json.dumps(value, default=str)[:60]}; expected {_KINDS[kind]}")
    return value


_KINDS = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer", float: "a number",
          (int, float): "a number"}


def _metrics_row(path: Path, k: int, r: dict) -> None:
    where = f"line {k + 1}"
    _expect(path, r.get("round"), int, f"{where}: round")
    for key in ("loss", "val_exit_accuracy"):
        for e, v in (_expect(path, r.get(key), dict, f"{where}: {key}") or {}).items():
            _expect(path, v, (int, float), f"{where}: {key}.{e}")
            if not str(e).lstrip("-").isdigit():
                raise CisError(f"{path}: {where}: {key} has exit {e!r}; expected exit numbers 1..E as keys")
    for key in ("val_cis_accuracy", "seconds"):
        _expect(path, r.get(key), (int, float), f"{where}: {key}")


def _run_settings(path: Path) -> dict:
    """config.json (or, without it, checkpoint.json's dataset and method): a JSON object."""
    for name in ("config.json", "checkpoint.json"):
        if (path / name).is_file():
            return {**_expect(path / name, read_json(path / name), dict, "the file"), "from": name}
    return {}


def run_section(path: Path) -> dict:
    """A training run: settings, final accuracies and the per-round curves."""
    config = _run_settings(path)
    if config.get("from") != "config.json":
        config = {k: config.get(k) for k in ("dataset", "method") if config.get(k) is not None}
    summary = read_json(path / "summary.json") if (path / "summary.json").is_file() else None
    _expect(path / "summary.json", summary, dict, "the file")
    rows = read_jsonl(path / "metrics.jsonl") if (path / "metrics.jsonl").is_file() else []
    for k, r in enumerate(rows):
        _metrics_row(path / "metrics.jsonl", k, r)
    exits = sorted({e for r in rows for e in list(r.get("loss") or {}) + list(r.get("val_exit_accuracy") or {})},
                   key=int)
    curves = {
        "round": [r.get("round") for r in rows],
        "loss": {e: [(r.get("loss") or {}).get(e) for r in rows] for e in exits},
        "val_exit_accuracy": {e: [(r.get("val_exit_accuracy") or {}).get(e) for r in rows] for e in exits},
        "val_cis_accuracy": [r.get("val_cis_accuracy") for r in rows],
        "seconds": [r.get("seconds") for r in rows],
    }
    out: dict[str, Any] = {
        "path": str(path),
        "dataset": config.get("dataset"),
        "method": config.get("method", "cis"),
        "strategy": config.get("strategy"),
        "rounds": config.get("rounds"),
        "rounds_done": len(rows),
        "train_seconds": float(sum(s or 0.0 for s in curves["seconds"])),
        "curves": curves,
        "missing": [n for n in ("config.json", "metrics.jsonl") if not (path / n).is_file()],
    }
    if summary is not None:
        out["final"] = _final(path / "summary.json", summary)
    return out


def _final(path: Path, summary: dict) -> dict:
    test = _expect(path, summary.get("test"), dict, "test") or {}
    for key in ("exit_accuracy", "served_shares", "exit_shares"):
        _expect(path, test.get(key), dict, f"test.{key}")
    _expect(path, test.get("cis_accuracy"), (int, float), "test.cis_accuracy")
    return {
        "exit_accuracy": test.get("exit_accuracy"),
        "cis_accuracy_quota": test.get("cis_accuracy"),
        "served_share_quota": test.get("served_shares") or test.get("exit_shares"),
        "calibrated": test.get("calibrated"),
        "weights": summary.get("weights"),
    }


def bundle_section(path: Path) -> dict:
    """A bundle: manifest summary, calibration, verification, profiles (files checked by load_bundle)."""
    from cis.core.bundle import load_bundle

    m = load_bundle(path, verify=False).manifest  # a malformed manifest: one line (cis.core.manifest_checks)
    try:
        load_bundle(path)
        verified = "all files match their sha256"
    except CisError as exc:
        verified = f"NOT verified: {exc}"
    latency = {}
    if (path / "profiles" / "latency.json").is_file():
        latency = read_json(path / "profiles" / "latency.json").get("stages", {})
    confidence = None
    npz = path / "profiles" / "confidence.npz"
    if npz.is_file():
        with np.load(npz) as z:
            conf, correct = z["confidence"], z["correct"]
        confidence = {
            "samples": int(conf.shape[0]),
            "mean_confidence": {str(e + 1): float(conf[:, e].mean()) for e in range(conf.shape[1])},
            "accuracy": {str(e + 1): float(correct[:, e].mean()) for e in range(conf.shape[1])},
        }
    stage_keys = ("index", "exit", "flops", "params", "bytes", "carry_bytes_per_sample")
    return {
        "path": str(path),
        "files": verified,
        "method": m.get("method"),
        "created": m.get("created"),
        "dataset": m.get("dataset"),
        "feature_dtype": m.get("feature_dtype"),
        "opset": m.get("opset"),
        "spec": (m.get("spec") or {}).get("cis", {}).get("name") if isinstance(m.get("spec"), dict) else None,
        "stages": [{k: s.get(k) for k in stage_keys} for s in m.get("stages", [])],
        "nodes": m.get("nodes", {}),
        "policy": m.get("policy"),
        "calibration": m.get("calibration"),
        "verification": {k: (m.get("verification") or {}).get(k) for k in ("max_abs_diff", "passed", "atol")},
        "latency_profile_s": {k: {b: float(t) for b, t in v.items()} for k, v in latency.items()},
        "confidence_profile": confidence,
    }


def sim_section(path: Path) -> dict:
    r = _sim_result(path / "result.json")
    exit_keys = ("share", "calculus_share", "rate", "calculus_rate", "accuracy")
    node_keys = ("incoming_rate", "served_rate", "forwarded_rate", "capped_rate", "utilisation", "dropped")
    return {
        "path": str(path),
        "spec": r.get("spec"),
        "requests": r.get("requests"),
        "accuracy": r.get("accuracy"),
        "drop_share": r.get("drop_share"),
        "latency": r.get("latency") or latency_summary([]),
        "exits": {e: {k: x.get(k) for k in exit_keys} for e, x in r.get("exits", {}).items()},
        "nodes": {n: {k: x.get(k) for k in node_keys} for n, x in r.get("nodes", {}).items()},
        "config": _sim_config(r.get("config") or {}),
    }


def _sim_result(path: Path) -> dict:
    """result.json of ``cis simulate --out``: a JSON object with its requests, exits and nodes."""
    r = _expect(path, read_json(path), dict, "the file")
    missing = [k for k in ("requests", "exits", "nodes") if k not in r]
    if missing:
        raise CisError(f"{path}: no {', '.join(missing)}; expected the result.json of cis simulate --out (requests, "
                       "exits, nodes, latency, ...)")
    for key in ("exits", "nodes"):
        for name, x in _expect(path, r[key], dict, key).items():
            _expect(path, x, dict, f"{key}.{name}")
    for key in ("latency", "config"):
        _expect(path, r.get(key), dict, key)
    _expect(path, r.get("requests"), dict, "requests")
    return r


def _sim_config(c: Mapping[str, Any]) -> dict:
    out = {k: c.get(k) for k in ("arrivals", "requests", "duration", "seed", "service", "loopback", "visit_overhead")}
    rtt = c.get("hop_rtt") or []
    out["hop_rtt_median"] = float(np.median(rtt)) if rtt else None
    return out


def runtime_section(path: Path) -> dict:
    s = _expect(path / "summary.json", read_json(path / "summary.json"), dict, "the file")
    latency, _ = served_latencies(read_requests(path / "requests.csv"))
    return {
        "path": str(path),
        "requests": s.get("requests"),
        "answered": s.get("samples_answered"),
        "errors": s.get("errors"),
        "accuracy": s.get("accuracy"),
        "served_share_per_exit": s.get("served_share_per_exit"),
        "served_share_per_node": s.get("served_share_per_node"),
        "degraded": s.get("degraded"),
        "capped": s.get("capped"),
        "latency": latency_summary(latency),
        "wall_s": s.get("wall_s"),
        "calibration": s.get("calibration"),
    }


SECTIONS = {"run": run_section, "bundle": bundle_section, "runtime": runtime_section, "sim": sim_section}
"""Folder kind -> its section reader (a demo folder holds one of each in a subfolder of the same name)."""
