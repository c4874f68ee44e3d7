"""References to user code, in the convention of uvicorn and Flower: ``PATH.py:NAME`` or ``pkg.module:NAME``.

    ref = parse_reference("my_data.py:make", "--data")      # Reference(text, path=Path("my_data.py"), ...)
    make = resolve(ref)                                     # the callable, imported from the file or module
    digest = source_sha256(ref)                             # sha256 of the file that defines it

``PATH.py`` is imported by path (its folder need not be a package); ``pkg.module`` by name, with the
current directory on ``sys.path`` as uvicorn does. Each failure is one :class:`cis.core.errors.CisError`
line naming the reference, what went wrong and what was expected. Torch-free: the model and the data
references of ``cis train`` (cis/training/) share it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cis.core.errors import CisError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
EXPECTED = "PATH.py:NAME or pkg.module:NAME"


@dataclass(frozen=True)
class Reference:
    """A parsed reference: a file (``path``) or an importable module (``module``), and the attribute ``name``."""

    text: str
    name: str
    path: Path | None = None
    module: str | None = None


def is_reference(text: str) -> bool:
    """Whether ``text`` has the shape of a reference (``X.py:NAME`` or ``dotted.module:NAME``)."""
    head, sep, name = str(text).rpartition(":")
    if not sep or not _IDENTIFIER.fullmatch(name):
        return False
    return head.endswith(".py") or bool(_MODULE.fullmatch(head))


def parse_reference(text: str, what: str) -> Reference:
    """``text`` as a :class:`Reference`; ``what`` names the flag or field in the error (e.g. ``--model``)."""
    head, sep, name = str(text).rpartition(":")
    if not sep or not head or not _IDENTIFIER.fullmatch(name):
        raise CisError(f"{what} {text!r}: expected {EXPECTED}")
    if head.endswith(".py"):
        return Reference(str(text), name, path=Path(head).expanduser())
    if not _MODULE.fullmatch(head):
        raise CisError(f"{what} {text!r}: {head!r} is neither a .py file nor a module name; expected {EXPECTED}")
    return Reference(str(text), name, module=head)


def import_file(path: Path, what: str) -> ModuleType:
    """Import the Python file at ``path`` as a module of its own (its folder need not be a package)."""
    if not path.is_file():
        raise CisError(f"{what}: file {path} not found; expected a Python file")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"cis_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CisError(f"{what}: {path} cannot be imported; expected a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling-free helpers look themselves up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: whatever it raises is one line, not a traceback
        sys.modules.pop(name, None)
        raise CisError(f"{what}: importing {path} failed ({type(exc).__name__}: {exc})") from None
    return module


def import_module(module: str, what: str) -> ModuleType:
    """Import ``module`` by name, the current directory first on ``sys.path`` (as uvicorn does)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise CisError(f"{what}: module {module!r} not found ({exc}); expected an importable module") from None
    except Exception as exc:  # the user's code
        raise CisError(f"{what}: importing {module!r} failed ({type(exc).__name__}: {exc})") from None


def resolve(ref: Reference, what: str | None = None) -> Callable[..., Any]:
    """The callable ``ref`` names; one line when the file or module does not import or has no such callable."""
    what = what or ref.text
    module = import_file(ref.path, what) if ref.path is not None else import_module(str(ref.module), what)
    found = getattr(module, ref.name, None)
    where = ref.path if ref.path is not None else ref.module
    if found is None:
        raise CisError(f"{what}: {where} has no {ref.name!r}; expected a callable of that name")
    if not callable(found):
        raise CisError(f"{what}: {where}:{ref.name} is a {type(found).__name__}; expected a callable")
    return found


def call(ref: Reference, what: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Resolve ``ref`` and call it with ``kwargs``; what the user's code raises is one line."""
    fn = resolve(ref, what)
    try:
        return fn(**(kwargs or {}))
    except CisError:
        raise
    except Exception as exc:
        raise CisError(f"{what}: {ref.text}({_kwargs_text(kwargs)}) raised {type(exc).__name__}: {exc}") from None


def _kwargs_text(kwargs: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in (kwargs or {}).items())


def source_file(ref: Reference, what: str | None = None) -> Path | None:
    """The file that defines ``ref``: its path, or the module's file (None for a module without one)."""
    if ref.path is not None:
        return ref.path
    module = import_module(str(ref.module), what or ref.text)
    file = getattr(module, "__file__", None)
    return Path(file) if file else None


def source_sha256(ref: Reference, what: str | None = None) -> str | None:
    """sha256 of the file that defines ``ref`` (None for a module without a file)."""
    file = source_file(ref, what)
    return sha256_file(file) if file is not None and file.is_file() else None


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_tree(root: Path) -> str:
    """sha256 over a folder: every file's path relative to ``root`` and its bytes' sha256, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    """sha256 of a file, or :func:`sha256_tree` of a folder."""
    return sha256_tree(path) if path.is_dir() else sha256_file(path)
