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
from cis.core.spec import CONFIDENCE_MEASURES, CisSpec
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
    check_cross_fields(manifest, mpath)
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
        ids = t.get("index_range")
        if ids is not None and not (isinstance(ids, list) and len(ids) == 2 and all(map(_is_int, ids))
                                    and ids[0] < ids[1] and str(t["dtype"]).startswith(("int", "uint"))):
            raise BundleError(f"{mpath}: inputs[{j}].index_range is {_short(ids)} for a {t['dtype']} input; expected "
                              "[low, high] (integer ids low..high-1) on an integer input, or null")
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


# ---------------------------------------------------------------- fields that must agree with each other

CONFIDENCE_PROFILE = "profiles/confidence.npz"  # the paths a bundle reads its profiles from (cis.core.bundle)
LATENCY_PROFILE = "profiles/latency.json"


def check_cross_fields(manifest: dict, mpath: Path) -> None:
    """Fields that restate each other agree (a hand edit of one is a contradiction the runtime would act on): each
    stage's file is its own and its sha256 the files table's, each stage returns ``logits`` and stage k+1 takes
    exactly the carry stage k returns, the profiles are where the bundle reads them, a node's exit and stages
    agree, and the request's preprocessing is the normalisation's."""
    stages = manifest["stages"]
    seen: dict[str, int] = {}
    for k, stage in enumerate(stages):
        digest = stage.get("sha256")
        if digest is not None and digest != manifest["files"][stage["file"]]:
            raise BundleError(f"{mpath}: stages[{k}].sha256 is {_short(digest)}; files[{stage['file']!r}] says "
                              f"{manifest['files'][stage['file']][:16]}...; expected the same hash of the stage's file")
        if stage["file"] in seen:
            raise BundleError(f"{mpath}: stages[{k}].file {stage['file']!r} is stages[{seen[stage['file']]}]'s too; "
                              "expected one graph file per stage")
        seen[stage["file"]] = k
        _logits_out(stage, k, mpath)
        if k:
            _carry_fits(stages[k - 1], stage, k, mpath)
    profiles = manifest.get("profiles") or {}
    for key, where in (("confidence", CONFIDENCE_PROFILE), ("latency", LATENCY_PROFILE)):
        if profiles.get(key) is not None and profiles[key] != where:
            raise BundleError(f"{mpath}: profiles.{key} is {_short(profiles[key])}; expected {where!r} (the file "
                              "the bundle's profile is read from)")
    for nid, node in (manifest.get("nodes") or {}).items():
        if node.get("exit") is not None and node["stages"] != list(range(1, node["exit"] + 1)):
            raise BundleError(f"{mpath}: nodes[{nid!r}].stages is {node['stages']}; its exit is {node['exit']}; "
                              f"expected stages {list(range(1, node['exit'] + 1))} (a node holds stages 1..its exit)")
    _preprocessing(manifest, mpath)
    _model_fits(manifest, mpath)


def _model_fits(manifest: dict, mpath: Path) -> None:
    """The model record and the feature dtype agree with the stages: ``model.num_classes`` the class names,
    ``model.exits`` one per stage, and a variant (``fp16``, ``int8``) carries no float32 tensor (it converts every
    one; other dtypes pass as they are)."""
    model, stages = manifest.get("model") or {}, manifest["stages"]
    classes = manifest.get("classes")
    if isinstance(model, dict) and _is_int(model.get("num_classes")) and isinstance(classes, list):
        if model["num_classes"] != len(classes):
            raise BundleError(f"{mpath}: model.num_classes is {model['num_classes']}; classes names {len(classes)}; "
                              "expected the same count")  # fmt: skip
    if isinstance(model, dict) and isinstance(model.get("exits"), list) and len(model["exits"]) != len(stages):
        raise BundleError(f"{mpath}: model.exits is {_short(model['exits'])}; the bundle has {len(stages)} stages; "
                          "expected one exit per stage")  # fmt: skip
    feature = manifest.get("feature_dtype", "fp32")
    carries = [t for st in stages[:-1] for t in st["outputs"] if t["name"] != LOGITS]
    if feature != "fp32" and any(t["dtype"] == "float32" for t in carries):
        raise BundleError(f"{mpath}: feature_dtype is {_short(feature)}, but the stages carry float32 tensors; "
                          "expected the variant's carries (fp16: float16, int8: int8) or feature_dtype fp32")


def _describe(t: dict) -> str:
    q = f" scale {t['scale']} zero_point {t.get('zero_point')}" if t.get("scale") is not None else ""
    return f"{t['name']} {t['dtype']} {json.dumps(t['shape'])}{q}"


def _logits_out(stage: dict, k: int, mpath: Path) -> None:
    names = [t["name"] for t in stage["outputs"]]
    if names.count(LOGITS) != 1:
        raise BundleError(f"{mpath}: stages[{k}].outputs are {_short(names)}; expected one {LOGITS!r} tensor (the "
                          f"exit's logits, which a node reads by that name)")


def _carry_fits(sender: dict, receiver: dict, k: int, mpath: Path) -> None:
    """Stage k+1 (``receiver``, stages[k]) takes exactly the carry stage k returns: names, dtypes, shapes, int8
    scales (the runtime passes the arrays on by name and never converts them). A stage that declares no inputs
    is one only the simulator reads (it never opens the graphs; a node refuses it when it opens the stage)."""
    sent = {t["name"]: _describe(t) for t in sender["outputs"] if t["name"] != LOGITS}
    taken = {t["name"]: _describe(t) for t in receiver["inputs"]}
    if sent == taken or not taken:
        return
    for j, t in enumerate(receiver["inputs"]):
        if sent.get(t["name"]) != taken[t["name"]]:
            what = sent.get(t["name"], f"no {t['name']!r} (it returns {', '.join(sent) or 'no carry'})")
            raise BundleError(f"{mpath}: stages[{k}].inputs[{j}] is {taken[t['name']]}; stages[{k - 1}] returns "
                              f"{what}; expected stage {k + 1} to take exactly the carry stage {k} returns "
                              "(name dtype shape)")
    missing = next(name for name in sent if name not in taken)
    raise BundleError(f"{mpath}: stages[{k}].inputs has no {missing!r}, which stages[{k - 1}] returns; expected stage "
                      f"{k + 1} to take exactly the carry stage {k} returns")


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_number(v) and math.isfinite(v) for v in value)


def _preprocessing(manifest: dict, mpath: Path) -> None:
    """``normalisation``: both null, or per-channel ``mean`` and ``std`` (std > 0); each request tensor's
    ``preprocessing`` is what that normalisation makes of it (``normalise`` for float (N, C, H, W) images with
    one, with its numbers, else ``none``)."""
    norm: dict[str, Any] = manifest.get("normalisation") or {}
    mean: Any = norm.get("mean")
    std: Any = norm.get("std")
    if mean or std:  # null or [] for data without one (token ids, arrays used as given)
        if not (_numbers(mean) and _numbers(std) and len(mean) == len(std)):
            raise BundleError(f"{mpath}: normalisation is {_short(norm)}; expected mean and std, lists of as many "
                              "numbers as the input has channels (or both null or empty)")
        if min(std) <= 0:
            raise BundleError(f"{mpath}: normalisation.std is {_short(std)}; expected numbers > 0 (inputs are "
                              "divided by them)")
    for j, t in enumerate(manifest.get("inputs") or []):
        pre = t.get("preprocessing")
        if pre is None:
            continue
        image = str(t["dtype"]).startswith("float") and len(t["shape"]) == 4 and bool(mean) and bool(std)
        want = {"kind": "normalise", "scale": 1 / 255, "mean": mean, "std": std} if image else {"kind": "none"}
        if image and t["shape"][1] is not None and len(mean) != t["shape"][1]:
            raise BundleError(f"{mpath}: normalisation has {len(mean)} channels; inputs[{j}] {t['name']!r} has "
                              f"{t['shape'][1]} (shape {json.dumps(t['shape'])}); expected one mean and std per "
                              "channel")
        if not isinstance(pre, dict) or {k: pre.get(k) for k in want} != want or (not image and len(pre) != 1):
            raise BundleError(f"{mpath}: inputs[{j}].preprocessing is {_short(pre)}; the normalisation makes it "
                              f"{_short(want)}; expected the two to agree (docs/bundle.md)")


def check_against_spec(manifest: dict, spec: CisSpec | None, mpath: Path) -> None:
    """The nodes table, the policy and the profiles agree with the bundle's spec (``spec``, parsed from the
    manifest; None: with each other only): its nodes are the nodes table's with their exits, every node's
    threshold in the nodes table is the policy's (the runtime serves the policy's, ``cis inspect`` shows the
    table's), and the policy measures the spec's confidence, as its profile does."""
    nodes, policy = manifest.get("nodes"), manifest.get("policy")
    if spec is not None and nodes is not None:
        _nodes_are_spec(nodes, spec, len(manifest["stages"]), mpath)
    measure = spec.confidence if spec is not None else (manifest.get("profiles") or {}).get("measure")
    whose = "the spec's [cis] confidence" if spec is not None else "profiles.measure"
    profiled = (manifest.get("profiles") or {}).get("measure")
    if spec is not None and profiled is not None and profiled != measure:
        raise BundleError(f"{mpath}: profiles.measure is {profiled!r}; {whose} is {measure!r}; expected the measure "
                          "the bundle was calibrated with")
    if not policy or policy["measure"] == PATIENCE:
        return
    if measure is not None and policy["measure"] != measure:
        raise BundleError(f"{mpath}: policy.measure is {policy['measure']!r}; {whose} is {measure!r}; expected the "
                          "measure the thresholds were calibrated on")
    _thresholds_agree(nodes or {}, policy["thresholds"], spec, len(manifest["stages"]), mpath)


def _nodes_are_spec(nodes: dict, spec: CisSpec, num_stages: int, mpath: Path) -> None:
    """One entry per spec node, with its exit and stages 1..exit (a node whose exit the bundle has no stage for
    may be left out: the bundle does not fit it, which serving it says)."""
    ids = spec.ids
    extra = [nid for nid in nodes if nid not in ids]
    missing = [n.id for n in spec.nodes if n.id not in nodes and n.exit <= num_stages]
    if extra or missing:
        got = f"nodes[{extra[0]!r}] is not a node of the spec" if extra else f"nodes has no {missing[0]!r}"
        raise BundleError(f"{mpath}: {got}; expected one entry per spec node ({', '.join(ids)})")
    for n in spec.nodes:
        if n.id not in nodes:
            continue
        if nodes[n.id].get("exit") is not None and nodes[n.id]["exit"] != n.exit:
            raise BundleError(f"{mpath}: nodes[{n.id!r}].exit is {nodes[n.id]['exit']}; the spec's node {n.id!r} has "
                              f"exit {n.exit}; expected the spec's")
        if nodes[n.id]["stages"] != list(range(1, n.exit + 1)):
            raise BundleError(f"{mpath}: nodes[{n.id!r}].stages is {nodes[n.id]['stages']}; the spec's node {n.id!r} "
                              f"has exit {n.exit}; expected stages {list(range(1, n.exit + 1))}")


def _thresholds_agree(nodes: dict, thresholds: dict, spec: CisSpec | None, num_stages: int, mpath: Path) -> None:
    """The policy's thresholds are for nodes of the bundle, and where the nodes table states a node's threshold,
    it is the policy's (a node without either is served with --threshold or calibrated by the simulator; the root
    serves everything, whatever either says)."""
    if spec is not None:
        ids, roots = spec.ids, {n.id for n in spec.nodes if n.parent is None}
    else:
        ids, roots = list(nodes), {nid for nid, n in nodes.items() if n.get("exit") == num_stages}
    for nid in thresholds:
        if ids and nid not in ids:
            raise BundleError(f"{mpath}: policy.thresholds[{nid!r}] is for no node of the bundle; expected one of "
                              f"{', '.join(ids)}")
    for nid in ids:
        if nid in roots:
            continue
        stated = (nodes.get(nid) or {}).get("threshold")
        if stated is not None and nid not in thresholds:
            raise BundleError(f"{mpath}: policy.thresholds has no {nid!r}; nodes[{nid!r}].threshold is {stated}; "
                              "expected one threshold (the runtime serves the policy's, cis inspect shows the nodes "
                              "table's)")
        if stated is not None and float(stated) != float(thresholds[nid]):
            raise BundleError(f"{mpath}: nodes[{nid!r}].threshold is {stated}; policy.thresholds[{nid!r}] is "
                              f"{thresholds[nid]}; expected one threshold (the runtime serves the policy's, cis "
                              "inspect shows the nodes table's)")
