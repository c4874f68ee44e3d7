"""The one lines of the errors a path gives (:func:`cis.cli.main.main`'s last resort, and checks made before work
starts): the file where a folder must go, the file a UnicodeDecodeError came from (it carries none)."""

from __future__ import annotations

import io
import os
import traceback
from pathlib import Path

from cis.core.paths import file_in_the_way, in_the_way_line


def os_error_line(exc: OSError) -> str:
    """``PATH: what went wrong``; ``FILE: a file; expected a folder`` where a file stands in a folder's way (a file
    where a folder is made: "File exists"; one in a path: "Not a directory")."""
    if not isinstance(exc.filename, (str, bytes, os.PathLike)):
        return str(exc.strerror or exc)
    path = os.fsdecode(exc.filename)
    blocker = file_in_the_way(path) if isinstance(exc, (FileExistsError, NotADirectoryError)) else None
    if blocker is not None:
        return in_the_way_line(blocker, path)
    return f"{path}: {exc.strerror or exc}"


def undecodable_file(exc: BaseException) -> str | None:
    """The file whose bytes raised ``exc`` (a UnicodeDecodeError carries none): the open text file, else the path
    of an existing file, that the innermost frame of its traceback with one holds; None when none does."""
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        values = list(frame.f_locals.values())
        names = [getattr(v, "name", None) for v in values if isinstance(v, io.TextIOBase)]
        files = [name for name in names if isinstance(name, str)]
        paths = [str(v) for v in values if isinstance(v, (str, Path)) and len(str(v)) < 4096 and os.path.isfile(v)]
        if files or paths:
            return (files or paths)[0]
    return None
