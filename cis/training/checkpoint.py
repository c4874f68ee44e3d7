"""Model checkpoints: tensors in a torch file, everything else in JSON beside it.

``checkpoint.pt`` holds only tensors (the model's state dict, plus optional
trainer state such as optimizer moments), so it loads with
``torch.load(..., weights_only=True)`` and never runs code from the file.
``checkpoint.json`` holds the metadata needed to rebuild and use the model:

    model          the model's record: a built-in's config (``arch`` and its fields) or a user model's
                   reference, arguments, source sha256 and input (``cis.training.models.model_ref.build_model``
                   rebuilds it)
    classes        class names in label order
    normalisation  {"mean": [...], "std": [...]} applied to inputs
    dataset        the dataset spec it was trained on (e.g. "digits")
    seed           the data split seed (so export can rebuild the same validation split)
    ...            anything else the trainer records (round, strategy, weights)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cis.core.errors import CisError, error_line
from cis.core.spec import CisSpec, parse_spec, states_classes
from cis.training.models.contract import EarlyExitNet, is_int
from cis.training.models.model_ref import build_model

WEIGHTS = "checkpoint.pt"
META = "checkpoint.json"
REQUIRED_META = ("model", "classes", "normalisation", "dataset")


def save_checkpoint(
    run_dir: str | Path, model: EarlyExitNet, meta: dict[str, Any], extra_state: dict | None = None
) -> Path:
    """Write checkpoint.pt and checkpoint.json atomically (a crash never leaves half a checkpoint)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "model": model.config()}
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CisError(f"checkpoint metadata: missing {missing}; expected {list(REQUIRED_META)}")
    tmp = run_dir / (WEIGHTS + ".tmp")
    torch.save({"model": model.state_dict(), "extra": extra_state or {}}, tmp)
    tmp_meta = run_dir / (META + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=2, default=str))
    tmp.replace(run_dir / WEIGHTS)
    tmp_meta.replace(run_dir / META)
    return run_dir / WEIGHTS


def checkpoint_files(path: str | Path) -> tuple[Path, Path]:
    """(checkpoint.pt, checkpoint.json) of a run folder, or of either file of such a pair given itself."""
    path = Path(path)
    if path.is_dir() or not path.exists():
        return path / WEIGHTS, path / META
    pair = (path.with_suffix(".pt"), path.with_suffix(".json"))
    if path.suffix not in (".pt", ".json") or not all(p.is_file() for p in pair):
        raise CisError(f"{path}: a file; expected the run folder (with {WEIGHTS} and {META}, written by 'cis train')")
    return pair


def read_json(path: Path) -> Any:
    """A run dir's JSON file; one line where it does not parse."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CisError(f"{path}: not valid JSON ({exc})") from None


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and len(value) >= 2 and all(isinstance(c, str) for c in value)


def _is_normalisation(value: Any) -> bool:
    def numbers(v: Any) -> bool:
        return v is None or (isinstance(v, list) and all(isinstance(x, (int, float)) and x == x for x in v))

    return isinstance(value, dict) and numbers(value.get("mean")) and numbers(value.get("std"))


META_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {  # key: (accepts its value, what is expected)
    "model": (lambda v: isinstance(v, dict), "the model's record (an object)"),
    "classes": (_is_names, "a list of at least 2 class names (strings) in label order"),
    "normalisation": (_is_normalisation, 'an object {"mean": [...], "std": [...]} (null: inputs used as given)'),
    "dataset": (lambda v: isinstance(v, str) and bool(v.strip()), "the data reference (a string)"),
    "seed": (lambda v: v is None or is_int(v), "an integer"),
    "val_size": (lambda v: v is None or (is_int(v) and v >= 1), "an integer >= 1 or null"),
    "spec": (lambda v: v is None or isinstance(v, dict), "a CIS spec (an object) or null"),
}


def read_meta(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(checkpoint.json of the run ``path``, its path), checked: a JSON object with the fields the run's users
    read, each of its type (one line naming the file and the key)."""
    weights, meta_path = checkpoint_files(path)
    if not weights.is_file() or not meta_path.is_file():
        raise CisError(f"{path}: no checkpoint; expected {WEIGHTS} and {META} (written by 'cis train')")
    meta = read_json(meta_path)
    if not isinstance(meta, dict):
        got = "null" if meta is None else f"a JSON {type(meta).__name__}"
        raise CisError(f"{meta_path}: {got}; expected an object (the metadata 'cis train' writes)")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CisError(f"{meta_path}: missing {missing}; expected {list(REQUIRED_META)}")
    for key, (accepts, expected) in META_FIELDS.items():
        if not accepts(meta.get(key)):
            text = repr(meta[key])
            text = text if len(text) <= 60 else text[:57] + "..."
            raise CisError(f"{meta_path}: {key} is {text}; expected {expected}")
    return meta, meta_path


def run_spec(meta: dict[str, Any], meta_path: str | Path) -> CisSpec:
    """The spec a run was trained under (its checkpoint metadata's); one line where there is none."""
    if not meta.get("spec"):
        raise CisError(f"{meta_path}: no 'spec' in the checkpoint metadata; pass --spec SPEC (a CIS spec TOML)")
    return parse_spec(meta["spec"], f"{meta_path}: spec")


def check_spec_fits(
    spec: CisSpec, model: EarlyExitNet, meta: dict[str, Any], where: str | Path, source: str | Path | None = None
) -> CisSpec:
    """``spec`` as it fits the run's model (in ``where``); one line where it does not: its exits, its classes.

    ``source``: the spec file ``spec`` was read from (``--spec FILE``). A file whose ``[cis]`` table does not
    state ``classes`` takes the count from the data (docs/spec.md), so it fits any class count: the returned spec
    has the run's (``spec`` itself says the parser's default, not the file)."""
    if spec.num_exits != model.num_exits:
        raise CisError(
            f"spec {spec.name!r}: [cis] exits is {spec.num_exits}; the model in {where} has {model.num_exits} exits"
        )
    if source is not None and not states_classes(source):
        return dataclasses.replace(spec, num_classes=len(meta["classes"]))
    if spec.num_classes != len(meta["classes"]):
        raise CisError(
            f"spec {spec.name!r}: [cis] classes is {spec.num_classes}; the model in {where} has {len(meta['classes'])}"
        )
    return spec


@torch.no_grad()
def _logits_width(model: EarlyExitNet) -> int | None:
    """How many logits the model's exits give, from one sample of zeros; None where it cannot take zeros (the
    export's verification and the data then judge it)."""
    try:
        return int(model(torch.zeros((1, *model.input_shape), dtype=model.input_dtype))[-1].shape[-1])
    except Exception:
        return None


def load_checkpoint(path: str | Path, allow_model_change: bool = False) -> tuple[EarlyExitNet, dict[str, Any], dict]:
    """Rebuild the model from a run dir (or its checkpoint.pt or checkpoint.json); returns (model, meta, extra_state).

    Refuses a checkpoint whose tensors do not match the architecture its metadata describes, and a user
    model whose source file changed since the run (``allow_model_change``: a warning instead).
    """
    meta, meta_path = read_meta(path)
    weights = checkpoint_files(path)[0]
    model = build_model(meta["model"], allow_model_change)
    try:
        blob = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt or foreign file: one line, not a traceback
        raise CisError(f"{weights}: cannot read checkpoint ({error_line(exc)})") from None
    state = blob.get("model") if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise CisError(f"{weights}: no model state; expected a checkpoint written by 'cis train'")
    expected = model.state_dict()
    wrong = [k for k in expected if k not in state or tuple(state[k].shape) != tuple(expected[k].shape)]
    extra = [k for k in state if k not in expected]
    if wrong or extra:
        first = (wrong or extra)[0]
        raise CisError(
            f"{weights}: tensors do not match the architecture in {meta_path.name} "
            f"({len(wrong)} missing or misshapen, {len(extra)} unexpected; first: {first!r})"
        )
    model.load_state_dict(state)
    model.eval()
    width = _logits_width(model)
    if width is not None and width != len(meta["classes"]):
        raise CisError(f"{meta_path}: classes lists {len(meta['classes'])} names; the model's exits give {width} "
                       "logits (one per class)")
    return model, meta, blob.get("extra", {})
