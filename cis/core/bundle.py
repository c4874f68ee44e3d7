"""The bundle: what ``cis export`` writes and ``cis serve`` / ``cis simulate`` read.

A bundle is a folder::

    manifest.json                 schema version, model, stages, nodes, policy, profiles, file hashes
    manifest.sig                  optional: Ed25519 signature of manifest.json (cis export --sign; cis.core.signing)
    stages/stage1.onnx ...        one static graph per stage (TensorRT engines beside them, optional)
    profiles/confidence.npz       per validation sample and exit: confidence and correctness
    profiles/latency.json         seconds per stage at batch sizes 1, 8, 32 on the exporting machine, per backend

Every file listed in the manifest's ``files`` table carries its sha256; loading
checks the manifest's fields (:mod:`cis.core.manifest_checks`: every stage file inside the folder and
listed there), verifies each file before use and refuses a tampered or missing one. This
module needs no torch: nodes and the simulator read bundles with numpy only.
See docs/bundle.md for the manifest fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import BundleError
from cis.core.manifest_checks import (
    CONFIDENCE_PROFILE,
    LATENCY_PROFILE,
    SCHEMA_VERSION,
    check_against_spec,
    check_manifest,
)
from cis.core.policy.exit_policy import ExitPolicy
from cis.core.spec import CisSpec, parse_spec
from cis.core.stages.contract import LOGITS
from cis.core.user_code import sha256_file  # also what export and the tests import from here

ID_DIGITS = 16  # a bundle's id: the first 16 hex digits of its manifest.json's sha256 (Bundle.id)
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # cis.core.signing.signature_path(MANIFEST): written after the manifest, never listed in it


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int | None, ...]  # None is the dynamic batch dimension
    dtype: str  # numpy dtype name: float32, float16, int8, int64 ...
    # int8 carries: real value = (q - zero_point) * scale, calibrated on validation data at export
    scale: float | None = None
    zero_point: int | None = None

    @classmethod
    def from_json(cls, d: dict) -> TensorInfo:
        scale = d.get("scale")
        zero_point = d.get("zero_point")
        return cls(
            d["name"],
            tuple(d["shape"]),
            d["dtype"],
            None if scale is None else float(scale),
            None if zero_point is None else int(zero_point),
        )

    def to_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.scale is not None:
            out["scale"] = self.scale
            out["zero_point"] = int(self.zero_point or 0)
        return out

    def bytes_per_sample(self) -> int:
        return int(np.prod(np.array(self.shape[1:], dtype=np.int64))) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class StageInfo:
    index: int  # 1-based
    exit: int
    file: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]  # LOGITS plus the carry tensors (cis.core.stages.runner: the stage contract)
    flops: int
    params: int
    engine: str | None = None  # TensorRT engine file, when built

    @classmethod
    def from_json(cls, d: dict) -> StageInfo:
        return cls(
            d["index"],
            d["exit"],
            d["file"],
            tuple(TensorInfo.from_json(t) for t in d["inputs"]),
            tuple(TensorInfo.from_json(t) for t in d["outputs"]),
            int(d.get("flops", 0)),
            int(d.get("params", 0)),
            d.get("engine"),
        )

    @property
    def carry_outputs(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.outputs if t.name != LOGITS)

    def carry_bytes_per_sample(self) -> int:
        """Bytes per request that a node forwards after this stage."""
        return sum(t.bytes_per_sample() for t in self.carry_outputs)


class Bundle:
    """A verified bundle. Build it with :func:`load_bundle`."""

    def __init__(self, root: Path, manifest: dict, sha256: str = ""):
        self.root = root
        self.manifest = manifest
        self.sha256 = sha256  # of manifest.json's bytes, which list every file's sha256: the bundle's identity
        self.stages = [StageInfo.from_json(s) for s in manifest["stages"]]
        self.spec: CisSpec | None = (
            parse_spec(manifest["spec"], f"{root}/{MANIFEST}: spec") if manifest.get("spec") else None
        )
        self.policy = ExitPolicy.from_json(manifest["policy"]) if manifest.get("policy") else None

    @property
    def id(self) -> str:
        """The bundle's short identity: the first 16 hex digits of the sha256 of manifest.json (which lists every
        file's sha256, so it names the whole bundle). Nodes name it on the wire: a node continues only a carry
        made by a bundle it holds (docs/protocol.md, *Bundle identity*)."""
        return self.sha256[:ID_DIGITS]

    @property
    def num_exits(self) -> int:
        return len(self.stages)

    @property
    def feature_dtype(self) -> str:
        return self.manifest.get("feature_dtype", "fp32")

    def stage(self, index: int) -> StageInfo:
        return self.stages[index - 1]

    def path(self, relative: str) -> Path:
        return self.root / relative

    def stages_for_node(self, node_id: str) -> list[int]:
        nodes = self.manifest.get("nodes", {})
        if node_id not in nodes:
            raise BundleError(f"{self.root}: bundle has no node {node_id!r}; expected one of {', '.join(nodes)}")
        return list(nodes[node_id]["stages"])

    def confidence_profile(self) -> tuple[np.ndarray, np.ndarray]:
        """(confidence, correct), each (N, E): per validation sample, at every exit."""
        with np.load(self.path(CONFIDENCE_PROFILE)) as z:
            return z["confidence"].astype(np.float64), z["correct"].astype(bool)

    def predicted_profile(self) -> np.ndarray | None:
        """(N, E) the class each exit predicts per validation sample, or None (bundles before it was stored)."""
        with np.load(self.path(CONFIDENCE_PROFILE)) as z:
            return z["predicted"].astype(np.int64) if "predicted" in z.files else None

    def latency_profile(self, backend: str = "cpu") -> dict[int, dict[int, float]]:
        """Seconds per call of each stage on ``backend``, by batch size: {stage: {batch: seconds}}.

        The main profile is onnxruntime on the CPU (``backend``: ``cpu``); an export on a GPU machine
        adds ``cuda`` and ``tensorrt`` under ``backends``. A backend the bundle has no profile for
        raises :class:`BundleError` naming those it has."""
        raw = json.loads(self.path(LATENCY_PROFILE).read_text())
        profiles = {raw.get("backend", "cpu"): raw["stages"]}
        profiles.update({name: p["stages"] for name, p in raw.get("backends", {}).items()})
        if backend not in profiles:
            raise BundleError(
                f"{self.path(LATENCY_PROFILE)}: no latency profile for backend {backend!r} "
                f"(it has {', '.join(profiles)})"
            )
        return {int(k): {int(b): float(s) for b, s in v.items()} for k, v in profiles[backend].items()}


def sign_bundle(root: str | Path, key_path: str | Path) -> Path:
    """Sign a finished bundle's manifest (``cis export --sign``); writes manifest.sig beside it."""
    from cis.core.signing import sign_manifest

    return sign_manifest(Path(root) / MANIFEST, key_path)


def load_bundle(path: str | Path, verify: bool = True, trust: str | Path | None = None) -> Bundle:
    """Read a bundle's manifest and check every listed file's sha256.

    ``trust``: an Ed25519 public key (PEM); the manifest must carry a valid
    signature by it (``manifest.sig``, see :mod:`cis.core.signing`), checked on the
    same bytes that are then parsed, before any file hash."""
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{root}: no {MANIFEST}; expected a bundle folder written by 'cis export'")
    raw = mpath.read_bytes()
    if trust is not None:
        from cis.core.signing import verify_manifest

        verify_manifest(mpath, raw, trust)
    try:
        manifest = check_manifest(json.loads(raw.decode()), mpath)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{mpath}: not valid JSON ({exc})") from None
    bundle = Bundle(root, manifest, hashlib.sha256(raw).hexdigest())  # parses the spec and the policy
    check_against_spec(manifest, bundle.spec, mpath)  # the nodes table, the policy, the profiles: the spec's
    if verify:
        for rel, digest in manifest["files"].items():
            f = root / rel
            if not f.is_file():
                raise BundleError(f"{f}: listed in the manifest but missing")
            actual = sha256_file(f)
            if actual != digest:
                raise BundleError(
                    f"{f}: sha256 is {actual[:16]}..., manifest says {digest[:16]}...; the file was changed after "
                    "export"
                )
    return bundle


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> Path:
    """Fill in the schema version and the sha256 of every file under ``root`` and write manifest.json."""
    root = Path(root)
    skip = (MANIFEST, SIGNATURE)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in skip)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        **manifest,
        "files": {str(p.relative_to(root)): sha256_file(p) for p in files},
    }
    out = root / MANIFEST
    out.write_text(json.dumps(manifest, indent=2, default=str))
    return out


def write_profiles(
    root: str | Path,
    confidence: np.ndarray,
    correct: np.ndarray,
    latency: dict[int, dict[int, float]],
    predicted: np.ndarray | None = None,
    backends: dict[str, dict[int, dict[int, float]]] | None = None,
) -> None:
    """Write the confidence profile (N, E) and the latency profile {stage: {batch: seconds}}.

    ``predicted`` (N, E), the class each exit predicts, is stored too when given
    (the patience rule decides from labels, not from a confidence). ``latency`` is
    onnxruntime on the CPU (``"backend": "cpu"``); ``backends`` adds the profiles of
    other backends ({"cuda": ..., "tensorrt": ...}) under ``"backends"``.
    """
    root = Path(root)
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {} if predicted is None else {"predicted": np.asarray(predicted).astype(np.int32)}
    np.savez_compressed(
        root / CONFIDENCE_PROFILE, confidence=confidence.astype(np.float32), correct=correct.astype(bool), **extra
    )
    def table(profile: dict[int, dict[int, float]]) -> dict:
        return {"stages": {str(k): {str(b): s for b, s in v.items()} for k, v in profile.items()}}

    doc = {"backend": "cpu", **table(latency)}
    if backends:
        doc["backends"] = {name: table(p) for name, p in backends.items()}
    (root / LATENCY_PROFILE).write_text(json.dumps(doc, indent=2))
