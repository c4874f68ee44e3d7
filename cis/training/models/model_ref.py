"""Model references: ``PATH.py:FACTORY`` or ``pkg.module:FACTORY`` (the uvicorn / Flower convention; parsed,
imported and hashed by :mod:`cis.core.user_code`, which the data references share).

The one way a model is built, a user's and every built-in alike:

    model = build_model({"reference": "models.py:make", "args": {"depth": 4}, ...})   # a user's, from its record
    model = build_model({"arch": "resnet18", "exits": [1, 4, 8], ...})               # a built-in's config

A built-in's ``arch`` is a short name for a factory of cis/training/architectures.py (:data:`BUILTIN`), and its
other fields are that factory's arguments, so old run dirs (whose checkpoint.json records ``arch``) rebuild
through the same path.

A factory is any callable returning an early-exit model in the public contract (cis/training/models/contract.py): a
list of ``(body, head)`` pairs or an :class:`~cis.training.models.contract.EarlyExitNet`. It is called with the
``--model-arg KEY=VALUE`` values as keyword arguments; the parameters it names among :data:`CONTEXT_ARGS`
(``num_classes``, ``num_exits``, ``input_shape``) that no ``--model-arg`` gives are filled from the data and
the spec.

A user model's record, written into the run dir (config.json: ``model``, ``model_args``, ``model_sha256``;
checkpoint.json: ``model``), is

    {"reference": "/abs/path/models.py:make", "args": {every argument the factory got},
     "sha256": "<the source file's>", "input_shape": [...], "input_dtype": "float32" | "int64" | ...,
     "root": "/abs/folder"}      # pkg.module:FACTORY only: the sys.path folder it was imported from

so ``cis evaluate``, ``cis export``, ``--resume`` and ``--init`` rebuild it without the flags. A source file
whose sha256 differs from the recorded one stops them with one line (``--allow-model-change``: a warning, and
the file as it is now). A file is imported with its folder on ``sys.path`` (so it may import its
neighbours); a module reference with the working directory on it. References into cis's own packages record
no sha256: they are versioned with cis.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cis.core import user_code
from cis.core.errors import CisError, error_line
from cis.core.user_code import Reference
from cis.training.models.contract import EarlyExitNet, as_early_exit
from cis.training.models.vision import import_torchvision

logger = logging.getLogger(__name__)

CONTEXT_ARGS = ("num_classes", "num_exits", "input_shape")
"""Factory parameters filled from the data and the spec where no --model-arg gives them."""
BUILTIN = {
    "digits-cnn": "cis.training.architectures:digits_cnn",
    "resnet18": "cis.training.architectures:resnet18",
    "vit": "cis.training.architectures:vit",
    "nested-resnet": "cis.training.architectures:nested_resnet",
}
"""A built-in model config's ``arch`` -> its factory."""
OWN_PACKAGES = ("cis",)
"""References into these are cis's own code: versioned with cis, no sha256 recorded."""
CHANGE_FLAG = "--allow-model-change"


def is_own(ref: Reference) -> bool:
    """Whether ``ref`` points into cis's own packages (versioned with cis: no sha256 recorded)."""
    return ref.module is not None and ref.module.split(".")[0] in OWN_PACKAGES


def parse_reference(text: str, recorded: bool = False) -> Reference:
    """``PATH.py:FACTORY`` (a file that must exist, made absolute) or ``pkg.module:FACTORY``
    (:func:`cis.core.user_code.parse_reference`, the one parser of references); one line when it is neither.
    ``recorded``: the reference a run recorded (evaluate, --resume, --init), not a --model flag."""
    ref = user_code.parse_reference(text, "the run's model" if recorded else "--model")
    if ref.path is None:
        return ref
    path = ref.path.resolve()
    if not path.is_file() and recorded:
        raise CisError(f"the run's model {text!r}: file {path} not found; expected the file the run was trained "
                       "with (restore it there, or train again with --model where it is now)")  # fmt: skip
    if not path.is_file():
        raise CisError(f"--model {text!r}: file {path} not found; expected a Python file")
    return Reference(f"{path}:{ref.name}", ref.name, path=path)


def load_factory(ref: Reference) -> Callable[..., Any]:
    """The callable a reference names (:func:`cis.core.user_code.resolve`: one line when it does not import or names
    no callable). A file's folder goes on ``sys.path``, so it may import its neighbours; a CUDA torchvision
    beside a CPU torch is imported through cis/training/models/vision.py's fallback, then the reference again."""
    if ref.path is not None and str(ref.path.parent) not in sys.path:
        sys.path.insert(0, str(ref.path.parent))
    what = f"model {ref.text}"
    try:
        return user_code.resolve(ref, what)
    except CisError as exc:
        if "operator torchvision::" not in str(exc) or "does not exist" not in str(exc):
            raise
    import_torchvision()
    return user_code.resolve(ref, what)


def source_sha256(ref: Reference) -> str | None:
    """The sha256 of the reference's source file (a module's ``__file__``); None for cis's own code."""
    return None if is_own(ref) else user_code.source_sha256(ref, f"model {ref.text}")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` -> {key: value}: VALUE read as JSON where it parses (3, 0.5, true, [1, 2],
    "text"), a comma list as a list (1,4,8), anything else as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise CisError(f"--model-arg {item!r}: expected KEY=VALUE with KEY a Python name, e.g. --model-arg depth=4")
        value = value.strip()
        if "," in value and not value.startswith(("[", "{", '"')):
            out[key] = [_value(v.strip()) for v in value.split(",") if v.strip()]
        else:
            out[key] = _value(value)
    return out


def factory_args(factory: Callable[..., Any], given: dict[str, Any], context: dict[str, Any],
                 where: str) -> dict[str, Any]:
    """``given`` plus the context arguments the factory names; one line for a name it does not take or a
    parameter without a default that nothing gives."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass what was given
        return dict(given)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in given if k not in named and not takes_any]
    if unknown:
        raise CisError(f"{where}: no argument {unknown[0]!r}; it takes {', '.join(named) or 'none'}")
    args = dict(given)
    for name in CONTEXT_ARGS:
        if name in named and name not in args and name in context:
            args[name] = context[name]
    missing = [n for n in named if n not in args and params[n].default is inspect.Parameter.empty]
    if missing:
        raise CisError(f"{where}: needs {missing[0]!r}; pass --model-arg {missing[0]}=VALUE")
    for key, value in given.items():
        if key in params:
            _check_kind(key, value, params[key], where)
    return args


_KINDS = {bool: "true or false", int: "an integer", float: "a number"}


def _check_kind(key: str, value: Any, param: inspect.Parameter, where: str) -> None:
    """One line for a --model-arg whose value is not of the kind the parameter declares: its annotation (``int``,
    ``float``, ``bool``) or, without one, its default's type; other parameters take what they are given."""
    kind = param.annotation if param.annotation in _KINDS else None
    if kind is None and isinstance(param.annotation, str):  # from __future__ import annotations
        kind = {"int": int, "float": float, "bool": bool}.get(param.annotation)
    if kind is None and param.default is not inspect.Parameter.empty and type(param.default) in _KINDS:
        kind = type(param.default)
    if kind is None:
        return
    fits = isinstance(value, bool) if kind is bool else (
        isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool))
    if not fits:
        default = "" if param.default is inspect.Parameter.empty else f", default {param.default!r}"
        raise CisError(f"{where}: --model-arg {key}={value!r}: expected {_KINDS[kind]} ({key}{default})")


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def call_factory(ref: Reference, factory: Callable[..., Any], args: dict[str, Any]) -> EarlyExitNet:
    """``factory(**args)`` as an early-exit model (``input_shape`` handed over as a tuple); one line when the
    factory raises or returns something else."""
    call = {k: tuple(v) if k == "input_shape" and isinstance(v, list) else v for k, v in args.items()}
    try:
        result = factory(**call)
    except CisError:
        raise
    except Exception as exc:  # the user's factory failed on these arguments: one line, the arguments shown
        shown = ", ".join(f"{k}={_short(v)}" for k, v in call.items())
        raise CisError(f"model {ref.text}: {ref.name}({shown}) raised {error_line(exc)}") from None
    return as_early_exit(result, f"model {ref.text}: {ref.name}(...)")


def _short(value: Any, most: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def check_source(ref: Reference, recorded: str | None, allow_changed: bool = False) -> str | None:
    """The source's sha256 now; one line when it differs from ``recorded`` (a warning with ``allow_changed``)."""
    now = source_sha256(ref)
    if recorded and now and now != recorded:
        where = ref.path or ref.module
        what = f"model {ref.text}: {where} changed since the run (sha256 {recorded[:12]} recorded, {now[:12]} now)"
        if not allow_changed:
            raise CisError(f"{what}; restore it, or pass {CHANGE_FLAG} to use it as it is now")
        logger.warning("%s; using it as it is now (%s)", what, CHANGE_FLAG)
    return now


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise CisError(f"model record: input_dtype {name!r}; expected a torch dtype name such as float32 or int64")
    return dtype


def user_model(reference: str, model_args: dict[str, Any] | None, context: dict[str, Any],
               input_dtype: torch.dtype, sha256: str | None = None, allow_changed: bool = False,
               root: str | None = None) -> EarlyExitNet:
    """A model from ``--model REFERENCE --model-arg ...``: the factory called with the context arguments it names
    (``num_classes``, ``num_exits``, ``input_shape``); its record kept as ``model.config()``. ``root``: the
    folder a ``pkg.module`` reference was imported from when the run started (put on ``sys.path`` first, so the
    run rebuilds from any working directory)."""
    ref = parse_reference(reference, recorded=sha256 is not None)
    if ref.module is not None and root and root not in sys.path:
        sys.path.insert(0, root)
    now = check_source(ref, sha256, allow_changed)
    factory = load_factory(ref)
    args = factory_args(factory, dict(model_args or {}), context, f"model {ref.text}")
    model = call_factory(ref, factory, args)
    model.set_input(context["input_shape"], input_dtype)
    record = {
        "reference": ref.text, "args": _jsonable(args), "sha256": now,
        "input_shape": list(context["input_shape"]), "input_dtype": dtype_name(input_dtype),
    }
    found = module_root(ref)
    model.set_config({**record, "root": found} if found else record)
    return model


def module_root(ref: Reference) -> str | None:
    """The folder on ``sys.path`` that a ``pkg.module`` reference was imported from (absolute; None for a file
    reference, cis's own code, or a module without a file)."""
    if ref.module is None or is_own(ref):
        return None
    file = getattr(sys.modules.get(ref.module), "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    depth = ref.module.count(".") + (path.name == "__init__.py")
    return str(path.parents[depth])


def build_model(record: dict[str, Any], allow_changed: bool = False) -> EarlyExitNet:
    """Rebuild a model from its record: ``{"reference", "args", "sha256", "input_shape", "input_dtype"}`` (a user
    model's) or a built-in's config (``arch`` and that factory's arguments)."""
    if not isinstance(record, dict):
        raise CisError(
            f"model config: got {type(record).__name__}, expected a dict with a 'reference' (or built-in 'arch') field"
        )
    if "reference" in record:
        args = record.get("args") or {}
        if not isinstance(args, dict) or "input_shape" not in record:
            raise CisError(
                "model record: expected 'args' (a table) and 'input_shape' beside 'reference' (written by cis train)"
            )
        context = {"input_shape": tuple(record["input_shape"])}
        model = user_model(
            str(record["reference"]), args, context, torch_dtype(record.get("input_dtype", "float32")),
            record.get("sha256"), allow_changed, record.get("root"),
        )
        model.set_config({**model.config(), "sha256": record.get("sha256") or model.config()["sha256"]})
        return model
    arch = record.get("arch")
    if arch not in BUILTIN:
        raise CisError(f"model config: field 'arch' is {arch!r}, expected one of {sorted(BUILTIN)}")
    ref = parse_reference(BUILTIN[arch])
    factory = load_factory(ref)
    fields = {k: v for k, v in record.items() if k != "arch"}
    return call_factory(ref, factory, factory_args(factory, fields, {}, f"model config ({arch})"))
