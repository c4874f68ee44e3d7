"""The request ids a node holds or answered lately, per peer: a retry of one of them is answered once.

A client retries a request whose entry node did not answer in time with the same id
(docs/runtime.md, *Clients*, retries). When the first try was only slow and the retry reaches
the same node over the same connection, the node must not run it twice nor answer it twice:
the first try's answer is the answer. Keys are (peer identity, request id); a node keeps the
keys of the requests it holds, and of the last :data:`KEEP` it answered. A request refused when it
came (``overloaded``, ``shutting_down``, ...) was not run: it is forgotten, so a retry with the same
id, which is what such a refusal asks for, is a new request.
"""

from __future__ import annotations

from collections import deque
from typing import Any

KEEP = 8192  # answered keys remembered: seconds of traffic at thousands of requests/s


class Seen:
    def __init__(self, keep: int = KEEP) -> None:
        self.open: set[tuple[bytes, int]] = set()
        self.done: set[tuple[bytes, int]] = set()
        self.order: deque[tuple[bytes, int]] = deque()
        self.keep = keep

    def first(self, prefix: Any, req_id: int) -> bool:
        """True (and held from now on) unless the request is held or was answered lately: a duplicate.
        ``prefix``: the ROUTER's identity frames (a front door's ticket is always its own request)."""
        if type(prefix) is not list:
            return True
        key = (prefix[0], req_id)
        if key in self.open or key in self.done:
            return False
        self.open.add(key)
        return True

    def forget(self, prefix: Any, req_id: int) -> None:
        """A request refused at admission: neither held nor answered after running, so not remembered."""
        if type(prefix) is list:
            self.open.discard((prefix[0], req_id))

    def answered(self, prefix: Any, req_id: int) -> None:
        key = (prefix[0], req_id) if type(prefix) is list else None
        if key not in self.open:
            return
        self.open.discard(key)
        self.done.add(key)
        self.order.append(key)
        if len(self.order) > self.keep:
            self.done.discard(self.order.popleft())
