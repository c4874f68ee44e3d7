"""Nodes of tiny numpy stages (no bundle), in this process (a thread) or in a process of their own that a test
can SIGKILL: the parts of tests/test_replicas_runtime.py. Not a test module; run as a script it serves one node:

    python tests/replica_nodes.py NAME EXIT BIND [PARENT] [--delay S]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cis.runtime.client import Client
from cis.runtime.node import Node, NodeConfig

T = namedtuple("T", "name shape dtype")
FAST = dict(heartbeat=0.05, heartbeat_timeout=0.5)


@dataclass
class FakeStage:
    inputs: tuple
    outputs: tuple
    fn: object
    delay: float = 0.0

    def run(self, feeds):
        if self.delay:
            time.sleep(self.delay)
        return self.fn(feeds)


def stages(delay: float = 0.0) -> dict:
    """Stage 1: logits from the first 3 inputs (a large first value: confident), carry = the input doubled;
    stage 2: always class 2 (``delay`` seconds per batch)."""
    s1 = FakeStage(
        (T("input", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"), T("features", (None, 4), "float32")),
        lambda f: {"logits": f["input"][:, :3] * 10, "features": f["input"] * 2},
    )
    s2 = FakeStage(
        (T("features", (None, 4), "float32"),),
        (T("logits", (None, 3), "float32"),),
        lambda f: {"logits": np.tile(np.array([0, 0, 50], np.float32), (len(f["features"]), 1))},
        delay,
    )
    return {1: s1, 2: s2}


UNSURE = np.array([[0.1, 0, 0, 0]], np.float32)  # forwarded by a leaf of threshold 0.9, answered class 2 above


class Running:
    """A node served by a thread of this process until :meth:`close`."""

    def __init__(self, node: Node):
        self.node = node
        self.stop = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=node.run, kwargs=dict(install_signals=False, ready=ready.set, stop=self.stop.is_set), daemon=True
        )
        self.thread.start()
        assert ready.wait(5)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


def leaf(bind: str, parents: list[str], **kw) -> Running:
    """A leaf (exit 1, threshold 0.9) whose parent is ``parents`` (the replicas of one parent)."""
    cfg = dict(bind=bind, parent=",".join(parents), threshold=0.9, forward_timeout=5.0, parent_id="root", **FAST)
    cfg.update(kw)
    return Running(Node(NodeConfig("leaf", 1, **cfg), {1: stages()[1]}))


def spawn(name: str, bind: str, delay: float = 0.0) -> subprocess.Popen:
    """A root replica (exit 2) as a process of its own, serving once it answers status."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__)), name, "2", bind, "--delay", str(delay)])
    end = time.monotonic() + 30
    with Client(bind) as c:
        while True:
            try:
                c.status(0.5)
                return proc
            except TimeoutError:
                assert proc.poll() is None and time.monotonic() < end, f"{name} did not start"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("exit", type=int)
    p.add_argument("bind")
    p.add_argument("parent", nargs="?")
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    node_id = a.name.partition("#")[0]
    cfg = NodeConfig(node_id, a.exit, bind=a.bind, parent=a.parent, name=a.name, **FAST)
    have = stages(a.delay)
    Node(cfg, {k: v for k, v in have.items() if k <= a.exit}).run()


if __name__ == "__main__":
    main()
