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

import json
from pathlib import Path
from typing import Any

import torch

from cis.core.errors import CisError, error_line
from cis.training.models.contract import EarlyExitNet
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


def _paths(path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    if path.is_dir():
        return path / WEIGHTS, path / META
    return path, path.with_suffix(".json")


def read_json(path: Path) -> Any:
    """A run dir's JSON file; one line where it does not parse."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CisError(f"{path}: not valid JSON ({exc})") from None


def load_checkpoint(path: str | Path, allow_model_change: bool = False) -> tuple[EarlyExitNet, dict[str, Any], dict]:
    """Rebuild the model from a run dir (or checkpoint.pt); returns (model, meta, extra_state).

    Refuses a checkpoint whose tensors do not match the architecture its metadata describes, and a user
    model whose source file changed since the run (``allow_model_change``: a warning instead).
    """
    weights, meta_path = _paths(path)
    if not weights.is_file() or not meta_path.is_file():
        raise CisError(f"{path}: no checkpoint; expected {WEIGHTS} and {META} (written by 'cis train')")
    meta = read_json(meta_path)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CisError(f"{meta_path}: missing {missing}; expected {list(REQUIRED_META)}")
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
    return model, meta, blob.get("extra", {})
