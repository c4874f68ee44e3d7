"""``cis`` commands as real processes, for the tests that serve: start one, read its lines, stop it.

Not a test module (pytest collects ``test_*.py`` only); the tests import it by name, as pytest puts
tests/ on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time


def cis_argv(*args) -> list[str]:
    """``python -m cis.cli.main ARGS`` with this interpreter (the arguments as strings)."""
    return [sys.executable, "-m", "cis.cli.main", *map(str, args)]


def start(*args, **popen) -> subprocess.Popen:
    """``cis ARGS`` in a subprocess; stdout and stderr piped as text unless ``popen`` says otherwise."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen(cis_argv(*args), **options)


def read_until(stream, proc: subprocess.Popen, wanted: str, timeout: float = 90) -> list[str]:
    """Complete lines of ``stream`` up to the first that contains ``wanted``. Reads the raw pipe: a buffered
    readline may take two lines at once and leave select() nothing to wake on."""
    text = ""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if select.select([stream.fileno()], [], [], 0.2)[0]:
            chunk = os.read(stream.fileno(), 65536).decode()
            if not chunk:
                break
            text += chunk
            lines = text.splitlines(keepends=True)
            hit = [i for i, line in enumerate(lines) if wanted in line and line.endswith("\n")]
            if hit:
                return lines[: hit[0] + 1]
        elif proc.poll() is not None:
            break
    said = text[-3000:]
    try:  # its output ended: it is exiting, so its error line (on stderr, read below) is there in a moment
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is not None and proc.stderr is not None and stream is not proc.stderr:
        err = proc.stderr.read()
        said += (err if isinstance(err, str) else err.decode(errors="replace"))[-3000:]
    raise AssertionError(f"no line with {wanted!r} (exit {proc.poll()}): {said}")


def started_nodes(proc: subprocess.Popen, timeout: float = 90) -> dict:
    """``nodes`` of the JSON line that ``cis serve --all --json`` prints once every node is up."""
    return json.loads(read_until(proc.stdout, proc, "{", timeout)[-1])["nodes"]


def stop(proc: subprocess.Popen, grace: float = 30) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds; the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)
