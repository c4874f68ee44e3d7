"""A node started by a launcher dies with it (no orphans), set up in the node itself.

The launcher used to ask for ``PR_SET_PDEATHSIG`` through ``Popen(preexec_fn=...)``.
That forces a plain ``fork()`` of the launcher, which runs every library's fork
handlers in the child before ``exec``; a launcher that has gRPC's threads running
(a front-door client in the same process) then aborts its children now and then
(status -6 while starting). Without ``preexec_fn`` Python starts the node with
``vfork``, which runs no fork handlers, and the node asks for the signal itself,
first thing, from the launcher's pid in :data:`LAUNCHER_PID_ENV`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

LAUNCHER_PID_ENV = "CIS_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def launcher_env(env: dict[str, str] | None) -> dict[str, str] | None:
    """The environment for a node started from this thread: ``env`` (None: ours) plus the launcher's pid.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that started the child ends, so
    only a launcher on its main thread asks for it; otherwise ``env`` unchanged.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return env
    out = dict(os.environ if env is None else env)
    out[LAUNCHER_PID_ENV] = str(os.getpid())
    return out


def die_with_launcher() -> None:
    """In a node: SIGTERM when the launcher that started us dies, even by SIGKILL; exit now if it is gone."""
    wanted = os.environ.pop(LAUNCHER_PID_ENV, None)
    if not wanted or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != wanted:  # the launcher died before we asked (or a wrapper forked): is it gone?
        try:
            os.kill(int(wanted), 0)
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGTERM)
        except (PermissionError, ValueError):
            pass
