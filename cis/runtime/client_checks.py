"""The client's argument checks (:class:`cis.runtime.client.Client`): one line (CisError) for an address, a
timeout, a window, a rate or a batch size that cannot work, before anything is sent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

from cis.core.errors import CisError


def client_addresses(address: str | Sequence[str]) -> list[str]:
    """``address`` as a list of addresses: one string, or a list or tuple of strings, at least one."""
    addresses = [address] if isinstance(address, str) else list(address) if isinstance(address, (list, tuple)) else None
    if addresses is None or not all(isinstance(a, str) for a in addresses):
        raise CisError(f"Client: address {address!r} is a {type(address).__name__}; expected a node's address, a "
                       "string tcp://HOST:PORT (or a list of them)")  # fmt: skip
    if not addresses:
        raise CisError("Client: no address; expected a node's address (or several)")
    return addresses


def check_timeout(timeout: float) -> None:
    """One line for a timeout that cannot work: <= 0 times every request out, NaN or infinite never."""
    if isinstance(timeout, bool) or not (isinstance(timeout, Real) and math.isfinite(timeout) and timeout > 0):
        raise CisError(f"timeout is {timeout!r}; expected a finite number of seconds > 0")


def check_pacing(window: int, rate: float | None, batch_size: int = 1, timeout: float | None = None) -> None:
    """One line (CisError) for a window, rate, batch size or timeout that cannot work: a window of 0 would wait
    forever, a rate of 0 divide by zero, a negative rate send as fast as it can, a timeout <= 0 time out all."""
    if timeout is not None:
        check_timeout(timeout)
    if not window >= 1:
        raise CisError(f"window is {window!r}; expected requests in flight >= 1")
    if not batch_size >= 1:
        raise CisError(f"batch size is {batch_size!r}; expected samples per request >= 1")
    if rate is not None and not rate > 0:
        raise CisError(f"rate is {rate!r}; expected requests per second > 0 (None: as fast as the window allows)")
