"""Long campaigns shared by several processes: a run is claimed by a pid lock file and saved (and committed) at
once when it finishes; a timing benchmark stops the other processes while it measures."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench.harness import REPO


def claim(path: Path) -> bool:
    """Take the run whose result file is ``path`` for this process (``path``.lock holds the owner's pid).

    Several campaign processes (one per core) can then share one campaign; a lock
    left by a process that died is taken over.
    """
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(lock.read_text() or 0), 0)
            return False  # its owner is alive
        except (ProcessLookupError, ValueError):
            lock.write_text(str(os.getpid()))
            return True
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def save_run(path: Path, record: dict, commit: bool) -> None:
    """One finished run's numbers, written at once (and committed with --commit, with its campaign folder's
    scale.json: a report reads the planned seeds and the scale from it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    path.with_suffix(".lock").unlink(missing_ok=True)
    if commit:
        files = [str(f) for f in (path, path.parent.parent / "scale.json") if f.is_file()]
        subprocess.run(["git", "-C", str(REPO), "add", *files], check=False)
        message = f"{path.parent.parent.name}: {path.stem}"
        subprocess.run(["git", "-C", str(REPO), "commit", "-q", "-m", message, "--", *files], check=False)


@contextlib.contextmanager
def stopped(pids: list[int]) -> Iterator[list[int]]:
    """SIGSTOP ``pids`` (those still alive); SIGCONT them on the way out, also on an exception or Ctrl-C.
    Yields the pids stopped."""
    done: list[int] = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                done.append(pid)
        yield done
    finally:
        for pid in done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
