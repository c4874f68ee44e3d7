"""Where a file stands in the way of a folder: the one check behind every "a file; expected a folder" line.

Making a folder under a regular file fails with errno's "File exists" or "Not a directory", which names neither the
file nor what was expected; commands check the path first (before any work is done) and the command line's last
resort (:func:`cis.cli.os_errors.os_error_line`) words a late failure the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from cis.core.errors import CisError


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The file that stands where ``path`` needs a folder: ``path`` itself or one of its parents; None if none."""
    return next((p for p in (Path(path), *Path(path).parents) if p.exists() and not p.is_dir()), None)


def in_the_way_line(blocker: Path, path: str | os.PathLike) -> str:
    """``FILE: a file; expected a folder`` and, when the file is above ``path``, ``(for PATH)``."""
    return f"{blocker}: a file; expected a folder" + ("" if str(blocker) == os.fspath(path) else f" (for {path})")


def check_folder(path: str | os.PathLike, where: str) -> None:
    """One line (:class:`CisError`, prefixed by ``where``) when a file stands where ``path`` needs a folder."""
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise CisError(f"{where}: {in_the_way_line(blocker, path)}")
