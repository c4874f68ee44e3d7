"""The client's argument checks (:class:`cis.runtime.client.Client`): one line (CisError) for an address, a
timeout, a window, a rate or a batch size that cannot work, before anything is sent; and a batch in the form a
request carries it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

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


def check_timeout(timeout: float) -> float:
    """``timeout``, or one line for one that cannot work: <= 0 times every request out, NaN or infinite never."""
    if isinstance(timeout, bool) or not (isinstance(timeout, Real) and math.isfinite(timeout) and timeout > 0):
        raise CisError(f"timeout is {timeout!r}; expected a finite number of seconds > 0")
    return float(timeout)


def request_array(batch: np.ndarray) -> np.ndarray:
    """A batch as a request carries it: floats as float32, integers and booleans (token ids) in their own dtype
    (the node checks it against its entry stage's)."""
    arr = np.asarray(batch)
    if arr.ndim == 0:  # a scalar stays one (ascontiguousarray would make it shape (1,)): request_samples refuses it
        return arr
    if arr.dtype.kind in "iub":
        return np.ascontiguousarray(arr)
    return np.ascontiguousarray(arr, dtype=np.float32)


def request_samples(tensors: dict) -> int:
    """The samples in a request's tensors (their first dimension), or one line for a batch without any: an empty
    dict, a scalar, or a name that is not a string."""
    if not tensors:
        raise CisError("batch is an empty dict; expected {input name: array (N, ...)} or an array (N, ...)")
    name, first = next(iter(tensors.items()))
    if not all(isinstance(k, str) for k in tensors):
        raise CisError(f"batch names {list(tensors)!r:.80}; expected input names (strings)")
    if np.ndim(first) == 0:
        raise CisError(f"batch {name!r} is a scalar ({first!r:.40}); expected an array of samples (N, ...)")
    return len(first)


def check_connection_options(curve: object, retry_after: object) -> None:
    """One line (for :class:`cis.runtime.entries.Entries`, a Client's sockets) for a ``curve`` that is not a
    :class:`~cis.runtime.security.CurveConfig` (None: no CurveZMQ) or a ``retry_after`` that is not seconds >= 0 and
    finite (None or 0: no retries)."""
    from cis.runtime.security import CurveConfig

    if curve is not None and not isinstance(curve, CurveConfig):
        raise CisError(f"Client: curve is a {type(curve).__name__}; expected a cis.runtime.security.CurveConfig "
                       "(or None: no CurveZMQ)")  # fmt: skip
    seconds = float(retry_after) if isinstance(retry_after, Real) and not isinstance(retry_after, bool) else None
    if retry_after is not None and not (seconds is not None and math.isfinite(seconds) and seconds >= 0):
        raise CisError(f"Client: retry_after is {retry_after!r}; expected seconds >= 0 and finite (None or 0: no "
                       "retries)")  # fmt: skip


def check_pacing(window: int, rate: float | None, batch_size: int = 1, timeout: float | None = None) -> None:
    """One line (CisError) for a window, rate, batch size or timeout that cannot work: a window of 0 would wait
    forever, a rate of 0 divide by zero, a negative rate send as fast as it can, a timeout <= 0 time out all."""
    if timeout is not None:
        check_timeout(timeout)
    if not _whole(window) or not window >= 1:
        raise CisError(f"window is {window!r}; expected requests in flight >= 1")
    if not _whole(batch_size) or not batch_size >= 1:
        raise CisError(f"batch size is {batch_size!r}; expected samples per request >= 1")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, Real) or not rate > 0):
        raise CisError(f"rate is {rate!r}; expected requests per second > 0 (None: as fast as the window allows)")


def check_spread(clients: dict, entries: dict, n: int) -> None:
    """One line for ``infer_spread``'s entries that name a node without a client or a sample x has not."""
    for nid, idx in entries.items():
        if nid not in clients:
            raise CisError(f"infer_spread: entries name node {nid!r}; expected one of clients' {', '.join(clients)}")
        bad = [int(i) for i in np.asarray(idx).ravel() if not 0 <= int(i) < n][:3]
        if bad:
            raise CisError(f"infer_spread: entries[{nid!r}] holds sample {bad[0]}; expected indices 0..{n - 1} of x")


def _whole(value: object) -> bool:
    """An integer (a Python or numpy one), not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)
