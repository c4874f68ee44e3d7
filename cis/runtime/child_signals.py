"""Nodes started by a launcher take no Ctrl-C: the launcher stops them.

A Ctrl-C at the terminal sends SIGINT to the whole process group: the launcher (``cis serve --all``, the demo,
the testbed) and every node it started. A node hit by it while it starts dies half-started, with a traceback
from whatever it was importing (or a fatal error, inside Python's own start); seven of them bury the one line
that matters. So each node is started with SIGINT blocked, which it keeps across ``exec`` and for its life (it
never unblocks it), and the launcher alone acts on the Ctrl-C: it stops every node with SIGTERM (a node that
serves drains first). The block is taken in the launcher's own thread only for the start of the process, and a
SIGINT that comes meanwhile stays pending and reaches the launcher when it is lifted: none is lost. A node
started by hand (``cis serve --node ID``) keeps its Ctrl-C.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the block runs: a child process started inside keeps it blocked."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to block
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
