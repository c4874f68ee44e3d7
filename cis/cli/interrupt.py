"""SIGTERM as Ctrl-C: a command that must clean up after itself (stop its nodes, remove its temporary folder)
gets a ``KeyboardInterrupt`` for either signal, so its ``finally`` and ``except BaseException`` blocks run;
SIGTERM's default action would end the process without them."""

from __future__ import annotations

import signal
from collections.abc import Callable


def sigterm_as_interrupt() -> Callable[[], None]:
    """Turn SIGTERM into KeyboardInterrupt until the returned ``restore()`` is called (a no-op off the main
    thread, where no signal handler can be set)."""
    try:
        old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        signal.signal(signal.SIGTERM, old)

    return restore
