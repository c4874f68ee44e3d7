"""Helpers of the runtime robustness benchmarks (runtime_fuzz, runtime_overload, runtime_faults):
their common flags, a digits demo bundle, process RSS, machine load; the cluster is the harness's
(:func:`bench.harness.serve_command`: ``cis serve --all`` in a subprocess)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from bench.harness import RESULTS


def add_live_args(ap: argparse.ArgumentParser, name: str, quick_help: str) -> None:
    """The flags every runtime robustness benchmark ends with: --work, --bundle, --quick, --out (results/NAME.json)."""
    ap.add_argument("--work", default="/tmp/cis-bench/runtime-live", help="folder for the digits bundle")
    ap.add_argument("--bundle", help="a bundle to serve instead of the digits demo bundle")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=str(RESULTS / f"{name}.json"))


def live_bundle(args: argparse.Namespace) -> tuple[Path, Path]:
    """(the --work folder, the bundle to serve): --bundle, else the digits demo bundle cached in --work."""
    work = Path(args.work)
    return work, Path(args.bundle) if args.bundle else demo_bundle(work)


def write_out(path: str, out: dict, markdown: str) -> None:
    """``out`` as JSON at ``path`` (--out) and ``markdown`` beside it, with the suffix .md."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=2, default=str))
    Path(path).with_suffix(".md").write_text(markdown)


def demo_bundle(work: Path, steps: int = 300) -> Path:
    """The paper-7 digits bundle the runtime tests use (trained for ``steps`` steps), cached in ``work``."""
    bundle = work / "bundle"
    if (bundle / "manifest.json").is_file():
        return bundle
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(work, steps=steps)


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB (VmRSS), or nan when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def machine() -> dict:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "note": "shared 2-core VM unless said otherwise; timings are noisy",
    }


def wait_until(predicate, timeout: float, step: float = 0.02) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    return None
