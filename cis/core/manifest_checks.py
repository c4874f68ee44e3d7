"""A bundle's manifest checked before anything reads it: one line naming the manifest and the key.

:func:`cis.core.bundle.load_bundle` calls :func:`check_manifest` on the parsed JSON, so every reader of
a bundle (``cis inspect``, ``serve``, ``simulate``, ``deploy``, ``report``) gets the same line for a
hand-edited manifest instead of a traceback: its shape (a JSON object), the keys the code reads (the
stages and their tensors, the files, the nodes, the policy) and their types, and that every stage file
(and engine) is inside the bundle folder and listed with its sha256 in ``files`` (so the verification
covers it, and a manifest cannot point a node at a file elsewhere). docs/bundle.md has the fields.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import BundleError
from cis.core.policy.patience import MEASURE as PATIENCE
from cis.core.spec import CONFIDENCE_MEASURES
from cis.core.stages.contract import LOGITS

SCHEMA_VERSION = 1
FEATURE_DTYPES = ("fp32", "fp16", "int8")
THRESHOLD = 'a number, "inf" or "-inf"'
OBJECTS = ("model", "normalisation", "calibration", "feature_dtypes", "verification", "versions", "profiles")
LISTS = ("inputs", "classes")


def check_manifest(manifest: Any, mpath: Path) -> dict:
    """``manifest`` (parsed from ``mpath``) if it is one a bundle can be read by; else a one-line BundleError."""
    if not isinstance(manifest, dict):
        raise BundleError(f"{mpath}: a JSON {type(manifest).__name__}; expected an object (the manifest 'cis "
                          "export' writes, docs/bundle.md)")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(f"{mpath}: schema_version is {version!r}; expected {SCHEMA_VERSION}")
    for key in ("stages", "files"):
        if key not in manifest:
            raise BundleError(f"{mpath}: missing {key!r}")
    files = _files(manifest["files"], mpath)
    stages = manifest["stages"]
    if not isinstance(stages, list):
        raise BundleError(f"{mpath}: stages is {_short(stages)}; expected a list of stage objects, one per exit")
    for k, stage in enumerate(stages):
        _stage(stage, k, mpath, files)
    _nodes(manifest.get("nodes"), len(stages), mpath)
    _policy(manifest.get("policy"), mpath)
    for key in OBJECTS + LISTS:
        value = manifest.get(key)
        kind, name = (dict, "object") if key in OBJECTS else (list, "list")
        if value is not None and not isinstance(value, kind):
            raise BundleError(f"{mpath}: {key} is {_short(value)}; expected a JSON {name}")
    _classes_fit(manifest.get("classes"), stages, mpath)
    _inputs_fit(manifest.get("inputs"), stages, mpath)
    if manifest.get("feature_dtype", "fp32") not in FEATURE_DTYPES:
        raise BundleError(f"{mpath}: feature_dtype is {_short(manifest['feature_dtype'])}; expected one of "
                          f"{', '.join(FEATURE_DTYPES)}")
    return manifest


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _files(files: Any, mpath: Path) -> set[str]:
    """The ``files`` table: every path inside the bundle folder, every digest a string."""
    if not isinstance(files, dict):
        raise BundleError(f"{mpath}: files is {_short(files)}; expected an object {{path: sha256}}")
    root = mpath.parent.resolve()
    for rel, digest in files.items():
        _inside(rel, root, "a files key", mpath)
        if not isinstance(digest, str):
            raise BundleError(f"{mpath}: files[{rel!r}] is {_short(digest)}; expected the file's sha256 (hex)")
    return set(files)


def _inside(rel: Any, root: Path, key: str, mpath: Path) -> None:
    if not isinstance(rel, str) or not rel.strip():
        got = "is missing" if rel is None else f"is {_short(rel)}"
        raise BundleError(f"{mpath}: {key} {got}; expected a path inside the bundle folder")
    try:
        (root / rel).resolve().relative_to(root)
    except ValueError:
        raise BundleError(f"{mpath}: {key} {rel!r} is outside the bundle folder {root}; expected a path inside "
                          "it") from None


def _stage(stage: Any, k: int, mpath: Path, files: set[str]) -> None:
    where = f"stages[{k}]"
    if not isinstance(stage, dict):
        raise BundleError(f"{mpath}: {where} is {_short(stage)}; expected a stage object")
    if stage.get("index") != k + 1 or not _is_int(stage["index"]):
        raise BundleError(f"{mpath}: {where}.index is {_short(stage.get('index'))}; expected {k + 1} (stages in "
                          "order)")
    if stage.get("exit") != k + 1 or not _is_int(stage["exit"]):
        raise BundleError(f"{mpath}: {where}.exit is {_short(stage.get('exit'))}; expected {k + 1} (stage k serves "
                          "exit k)")
    for key in ("file", "engine"):
        rel = stage.get(key)
        if key == "engine" and rel is None:
            continue
        _inside(rel, mpath.parent.resolve(), f"{where}.{key}", mpath)
        if rel not in files:
            raise BundleError(f"{mpath}: {where}.{key} {rel!r} is not in the manifest's files; expected a file of "
                              "the bundle, listed with its sha256")
    for key in ("flops", "params", "bytes", "carry_bytes_per_sample"):
        if stage.get(key) is not None and not _is_number(stage[key]):
            raise BundleError(f"{mpath}: {where}.{key} is {_short(stage[key])}; expected a number")
    for key in ("inputs", "outputs"):
        tensors = stage.get(key)
        if not isinstance(tensors, list):
            raise BundleError(f"{mpath}: {where}.{key} is {_short(tensors)}; expected a list of tensors")
        for j, tensor in enumerate(tensors):
            _tensor(tensor, f"{where}.{key}[{j}]", mpath)


def _tensor(t: Any, where: str, mpath: Path) -> None:
    """``{name, shape, dtype}`` (int8 carries: ``scale``, ``zero_point``)."""
    expected = "expected {name, shape (null for the batch), dtype (a numpy name)}"
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise BundleError(f"{mpath}: {where} is {_short(t)}; {expected}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(d is None or (_is_int(d) and d >= 0) for d in shape):
        raise BundleError(f"{mpath}: {where}.shape is {_short(shape)}; expected a list of sizes (null: the batch)")
    try:
        if not isinstance(t.get("dtype"), str):
            raise TypeError
        np.dtype(t["dtype"])
    except TypeError:
        raise BundleError(f"{mpath}: {where}.dtype is {_short(t.get('dtype'))}; expected a numpy dtype name") from None
    for key, check in (("scale", _is_number), ("zero_point", _is_int)):
        if t.get(key) is not None and not check(t[key]):
            raise BundleError(f"{mpath}: {where}.{key} is {_short(t[key])}; expected a number")


def _classes_fit(classes: list | None, stages: list[dict], mpath: Path) -> None:
    """As many class names as every stage's logits have columns, where the stage declares that width."""
    if classes is None:
        return
    for k, stage in enumerate(stages):
        for t in stage["outputs"]:
            width = t["shape"][-1] if t["name"] == LOGITS and t["shape"] else None
            if width is not None and width != len(classes):
                raise BundleError(f"{mpath}: classes lists {len(classes)} names; stages[{k}] outputs {width} "
                                  "logits; expected one name per logit")


def _inputs_fit(inputs: list | None, stages: list[dict], mpath: Path) -> None:
    """The request's tensors (``inputs``) are stage 1's inputs: the same names, dtypes and shapes, in order."""
    if inputs is None or not stages:
        return
    for j, t in enumerate(inputs):
        _tensor(t, f"inputs[{j}]", mpath)
    got = [f"{t['name']} {t['dtype']} {json.dumps(t['shape'])}" for t in inputs]
    want = [f"{t['name']} {t['dtype']} {json.dumps(t['shape'])}" for t in stages[0]["inputs"]]
    if got != want:
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        seen = got[first] if first < len(got) else "missing"
        wanted = want[first] if first < len(want) else "nothing more"
        raise BundleError(f"{mpath}: inputs[{first}] is {seen}; stages[0] takes {wanted}; expected the request's "
                          "tensors to be stage 1's inputs (name dtype shape)")


def _threshold(value: Any) -> bool:
    return _is_number(value) or value in ("inf", "-inf")


def _nodes(nodes: Any, num_stages: int, mpath: Path) -> None:
    """``nodes{id}``: ``stages`` [1..E_i], ``exit`` E_i, ``threshold`` (a number, "inf", "-inf" or null)."""
    if nodes is None:
        return
    if not isinstance(nodes, dict):
        raise BundleError(f"{mpath}: nodes is {_short(nodes)}; expected an object {{node id: {{exit, stages, "
                          "threshold}}")
    for nid, node in nodes.items():
        where = f"nodes[{nid!r}]"
        if not isinstance(node, dict):
            raise BundleError(f"{mpath}: {where} is {_short(node)}; expected an object {{exit, stages, threshold}}")
        held = node.get("stages")
        if not isinstance(held, list) or not all(_is_int(s) and 1 <= s <= num_stages for s in held):
            raise BundleError(f"{mpath}: {where}.stages is {_short(held)}; expected a list of stage numbers 1 to "
                              f"{num_stages}")
        if node.get("exit") is not None and not (_is_int(node["exit"]) and 1 <= node["exit"] <= num_stages):
            raise BundleError(f"{mpath}: {where}.exit is {_short(node['exit'])}; expected an exit 1 to {num_stages}")
        if node.get("threshold") is not None and not _threshold(node["threshold"]):
            raise BundleError(f"{mpath}: {where}.threshold is {_short(node['threshold'])}; expected {THRESHOLD} or "
                              "null")


def _policy(policy: Any, mpath: Path) -> None:
    """``policy``: null, or ``{measure, thresholds{id}, patience}`` (ExitPolicy.to_json)."""
    if policy is None:
        return
    measures = (*CONFIDENCE_MEASURES, PATIENCE)
    if not isinstance(policy, dict):
        raise BundleError(f"{mpath}: policy is {_short(policy)}; expected an object {{measure, thresholds}} or null")
    if policy.get("measure") not in measures:
        raise BundleError(f"{mpath}: policy.measure is {_short(policy.get('measure'))}; expected one of "
                          f"{', '.join(measures)}")
    thresholds = policy.get("thresholds")
    if not isinstance(thresholds, Mapping):
        raise BundleError(f"{mpath}: policy.thresholds is {_short(thresholds)}; expected an object {{node id: "
                          "threshold}}")
    for nid, value in thresholds.items():
        if not _threshold(value):
            raise BundleError(f"{mpath}: policy.thresholds[{nid!r}] is {_short(value)}; expected {THRESHOLD}")
    patience = policy.get("patience")
    if (policy["measure"] == PATIENCE) != (patience is not None) or not (patience is None or _is_int(patience)
                                                                          and patience >= 1):
        raise BundleError(f"{mpath}: policy.patience is {_short(patience)}; expected an integer >= 1 with measure "
                          f"{PATIENCE!r}, else none")
