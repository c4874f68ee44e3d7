"""Where the time goes: py-spy records every process of a system while the load generator drives it.

``record(pids, seconds, folder)`` starts one ``py-spy record --format raw`` per process (sampling at 250 Hz,
idle frames dropped) for ``seconds``; ``summary(path)`` reads one collapsed-stack file back:
the samples, the functions with the most samples on top of the stack (self) and the most samples anywhere in the
stack (inclusive), and the share of samples under a few named parts of a request's path (onnxruntime's run,
ZeroMQ, cis's protocol, the exit decision, the HTTP front door, asyncio), each sample given to the part named
by the frame nearest the top of its stack. py-spy needs ptrace: root, or
``--cap-add SYS_PTRACE`` in a container.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

# a part of the path, by what its frames hold (file or function), first match wins
PARTS = [
    ("onnxruntime (the stages)", re.compile(r"onnxruntime|StageRunner\.run|run_stages|_run_stages")),
    ("front door (HTTP parse, JSON)", re.compile(r"doors\.py|httptools|json/|_json|oip")),
    ("cis protocol (encode, decode, checks)", re.compile(r"runtime/protocol\.py|runtime/wire\.py|msgspec|msgpack")),
    ("exit decision", re.compile(r"decision\.py|policy\.py|confidence\.py")),
    ("ZeroMQ send/receive/poll", re.compile(r"zmq/|zmq\.|sugar/socket|_poll|poll \(")),
    ("metrics and events", re.compile(r"metrics_http|prometheus_client|runtime/events\.py|tracing")),
    ("asyncio / event loop", re.compile(r"asyncio/|uvloop|selectors\.py")),
    ("Ray core (serialisation, router, RPC)", re.compile(r"ray/_private|ray/serve/_private|_raylet|cloudpickle")),
    ("web framework (uvicorn, starlette, fastapi, pydantic)", re.compile(r"uvicorn|starlette|fastapi|pydantic")),
]


def record(pids: dict[str, int], seconds: float, folder: Path) -> dict[str, subprocess.Popen]:
    """Start py-spy on each process (name -> pid); returns the recorders (wait for them to end)."""
    spy = shutil.which("py-spy") or str(Path(__import__("sys").executable).parent / "py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, pid in pids.items():
        out = folder / f"{name}.txt"
        cmd = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250", "--format",
               "raw", "--output", str(out), "--nonblocking"]  # fmt: skip
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return procs


def _frame(text: str) -> str:
    """``function (path/file.py:123)`` as ``function (file.py)`` (the line dropped, the folder kept short)."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", text.strip())
    if not m:
        return text.strip()
    func, path = m.groups()
    parts = path.split("/")
    return f"{func} ({'/'.join(parts[-2:])})"


def summary(path: Path, top: int = 12) -> dict:
    """Samples, top self and inclusive functions, and the share of samples per part of the path."""
    self_count: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines() if path.is_file() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        if frames and not frames[0].startswith("process") and frames[0].startswith("thread"):
            frames = frames[1:]
        total += n
        names = [_frame(f) for f in frames]
        if names:
            self_count[names[-1]] += n
        for name in set(names):
            incl[name] += n
        # the part of the path this sample is in: the one named by the frame nearest the top of the stack
        part = next((label for f in reversed(frames) for label, rx in PARTS if rx.search(f)), "other Python")
        parts[part] += n
    share = lambda c: [{"function": k, "share": v / total} for k, v in c.most_common(top)] if total else []  # noqa: E731
    return {
        "samples": total,
        "self": share(self_count),
        "inclusive": share(incl),
        "parts": {k: v / total for k, v in parts.most_common()} if total else {},
    }
