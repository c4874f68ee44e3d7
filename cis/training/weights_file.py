"""``cis train --weights FILE``: starting weights from a local state dict (e.g. a pretrained backbone).

The file is read with ``torch.load(..., weights_only=True)`` (tensors only, never code). It holds a state dict
(name -> tensor), or a dict with one under ``"model"`` or ``"state_dict"`` (a cis checkpoint.pt, a
Lightning-style checkpoint). A tensor loads where its name is the model's, or, for a model whose stages came
from one backbone (:func:`cis.training.models.backbone.with_exits`, or any ``(body, head)`` pairs), where its name is
the backbone's own: the model's ``stage_list.K.body.NAME`` takes the file's ``NAME`` (where no other body has
a ``NAME``). A partial load says so in one line each, as warnings: which of the model's tensors the file did not give
(missing, e.g. the new exit heads) and which of the file's the model has no place for (unexpected, e.g. the
backbone's own classifier). A tensor whose shape differs from the model's, or a file none of whose tensors
fit, is one line and exit 2.

``--weights-prefix PREFIX`` (e.g. ``model.backbone.``, a wrapper's attribute path) strips PREFIX from the names
of the file's tensors that start with it before they are matched; a prefix no tensor starts with is one line,
and where nothing fits, the line names the prefix whose stripping would make them fit.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from cis.core.errors import CisError, error_line

logger = logging.getLogger(__name__)

_BODY = re.compile(r"^stage_list\.\d+\.body\.")
_SHOWN = 6


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a state-dict file; one line when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CisError(f"--weights {path}: file not found; expected a state dict saved with torch.save")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a foreign or corrupt file, or one that holds more than tensors
        raise CisError(f"--weights {path}: cannot read it as a state dict ({error_line(exc)})") from None
    for key in ("model", "state_dict"):
        if isinstance(blob, Mapping) and isinstance(blob.get(key), Mapping):
            blob = blob[key]
            break
    if not isinstance(blob, Mapping) or not blob or not all(isinstance(v, Tensor) for v in blob.values()):
        raise CisError(f"--weights {path}: not a state dict; expected a dict of tensor names to tensors")
    return {str(k): v for k, v in blob.items()}


def match_keys(model_keys: list[str], file_keys: list[str]) -> dict[str, str]:
    """model key -> file key: the same name, else the backbone's own name of a stage body's tensor (where that
    name is one stage body's only: bodies made apart may each have a ``0.weight``)."""
    have = set(file_keys)
    own = {key: _BODY.sub("", key) for key in model_keys}
    count: dict[str, int] = {}
    for name in own.values():
        count[name] = count.get(name, 0) + 1
    out = {}
    for key in model_keys:
        if key in have:
            out[key] = key
        elif own[key] != key and own[key] in have and count[own[key]] == 1:
            out[key] = own[key]
    return out


def _listing(keys: list[str]) -> str:
    more = f", ... ({len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def strip_prefix(state: dict[str, Tensor], prefix: str, path: str | Path) -> dict[str, Tensor]:
    """The file's tensors with ``prefix`` stripped from the names that start with it; one line when none does."""
    if not any(k.startswith(prefix) for k in state):
        raise CisError(
            f"--weights-prefix {prefix!r}: none of {path}'s {len(state)} tensors starts with it (first: "
            f"{next(iter(state))!r})"
        )
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def fitting_prefix(model_keys: list[str], file_keys: list[str]) -> str:
    """The shortest dotted prefix of the file's first name (``"model.backbone."``) whose stripping lets some of
    the file's names fit the model's, or ""."""
    parts = file_keys[0].split(".")[:-1]
    for i in range(1, len(parts) + 1):
        prefix = "".join(p + "." for p in parts[:i])
        stripped = [k[len(prefix):] if k.startswith(prefix) else k for k in file_keys]
        if match_keys(model_keys, stripped):
            return prefix
    return ""


def _warning(log: Callable[[str], None]) -> Callable[[str], None]:
    """Where a partial load's lines go: WARNING records (``--log-level warning`` and ``--json`` still show them on
    stderr), of ``log``'s own logger where it is a logger's method, and to ``log`` too where it is not (a caller
    that collects the lines)."""
    owner = getattr(log, "__self__", None)
    if isinstance(owner, logging.Logger):
        return owner.warning

    def both(line: str) -> None:
        logger.warning(line)
        log(line)

    return both


def load_weights(model: nn.Module, path: str | Path, log: Callable[[str], None],
                 prefix: str | None = None) -> dict[str, list[str]]:
    """Load the file's tensors into ``model`` in place (``prefix`` stripped from their names first); log what
    loaded, what is missing, what is unexpected (one line each: WARNING records where the load is partial);
    returns {"loaded", "missing", "unexpected"}
    (model keys, model keys, file keys)."""
    state = read_state_dict(path)
    if prefix:
        state = strip_prefix(state, prefix, path)
    own = model.state_dict()
    pairs = match_keys(list(own), list(state))
    if not pairs:
        fits = "" if prefix else fitting_prefix(list(own), list(state))
        hint = f"; without the prefix {fits!r} they fit: --weights-prefix {fits}" if fits else ""
        raise CisError(
            f"--weights {path}: none of its {len(state)} tensors has a name of the model's (first: "
            f"{next(iter(state))!r}; the model's first: {next(iter(own))!r}){hint}"
        )
    for mk, fk in pairs.items():
        if tuple(state[fk].shape) != tuple(own[mk].shape):
            raise CisError(
                f"--weights {path}: tensor {fk!r} has shape {tuple(state[fk].shape)}; the model's {mk!r} has "
                f"{tuple(own[mk].shape)}"
            )
    with torch.no_grad():
        for mk, fk in pairs.items():
            own[mk].copy_(state[fk].to(own[mk].dtype))
    used = set(pairs.values())
    missing = [k for k in own if k not in pairs]
    unexpected = [k for k in state if k not in used]
    say = _warning(log) if missing or unexpected else log
    say(f"--weights {path}: loaded {len(pairs)} of the model's {len(own)} tensors")
    if missing:
        say(f"--weights {path}: missing {len(missing)} (the model's own start): {_listing(missing)}")
    if unexpected:
        say(f"--weights {path}: unexpected {len(unexpected)} (not used): {_listing(unexpected)}")
    return {"loaded": list(pairs), "missing": missing, "unexpected": unexpected}
