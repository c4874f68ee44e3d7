"""A spec file's TOML tables, read once for every reader of a spec (cis/core/spec.py's ``load_spec`` and
``states_classes``): a missing file, a folder, unreadable bytes or a TOML syntax error is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib  # novermin (3.10 takes the tomli fallback below)
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib  # type: ignore[no-redef]

from cis.core.errors import SpecError

_MAKE_ONE = "expected a TOML file (make one with 'cis spec new')"


def read_spec_tables(path: str | Path) -> dict[str, Any]:
    """The parsed TOML of the spec file ``path``; :class:`SpecError` with one line where it cannot be had."""
    if not str(path).strip():  # Path('') is '.', the current folder: say what was given
        raise SpecError(f"spec path is empty; {_MAKE_ONE}")
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a folder; {_MAKE_ONE}")
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found; {_MAKE_ONE}")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:  # unreadable (permissions)
        raise SpecError(f"{path}: cannot read ({exc.strerror or exc}); {_MAKE_ONE}") from None
