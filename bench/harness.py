"""Where the benchmarks' files are and what they record: the repository, the results folder, the
CIFAR-10 unzip, the machine's facts, result files; and the result heads of the ViT and nested-method benchmarks.

A benchmark runs as a script (``python -m bench.NAME``): Python puts bench/ first on
``sys.path``, so ``from _results import ...`` (and ``_args``, ``_stats``, ``_campaign``, ``_models``)
finds these modules, and the project comes from its installed package (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


RESULTS = REPO / "bench" / "results"


CIFAR_ZIP = next(
    (
        p
        for p in (REPO.parent / "shared" / "data" / "cifar10-jpeg.zip", Path("/work/shared/data/cifar10-jpeg.zip"))
        if p.is_file()
    ),
    REPO.parent / "shared" / "data" / "cifar10-jpeg.zip",
)


def ensure_cifar(path: Path) -> Path:
    """CIFAR-10 at ``path`` (an image folder, unzipped from ../shared/data/cifar10-jpeg.zip when missing, or the
    python-pickle layout ``path``/cifar-10-batches-py)."""
    if not (path / "train").is_dir() and not (path / "cifar-10-batches-py").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["unzip", "-q", "-o", str(CIFAR_ZIP), "-d", str(path)], check=True)
    return path


def write_scale(out: Path, scale: dict[str, Any], seeds: list[int]) -> None:
    """Write a campaign folder's scale.json: its scale and planned seeds. A campaign over fewer seeds at the
    same scale (``--seeds 1,2,3`` after a 5-seed one) keeps the seeds planned before, so the report still
    covers every finished run."""
    path = out / "scale.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    planned = old.pop("seeds", [])
    if old != scale:  # another scale: its seeds are not this campaign's
        planned = []
    path.write_text(json.dumps({**scale, "seeds": sorted(set(planned) | set(seeds))}, indent=1))


def machine() -> dict[str, Any]:
    """Where the numbers were measured (say the load: the development machine is shared)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def write_results(name: str, data: dict, markdown: str | list[str] | None = None) -> None:
    """``RESULTS/name.json`` and, given a table, ``RESULTS/name.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    if markdown is not None:
        text = markdown if isinstance(markdown, str) else "\n".join(markdown) + "\n"
        (RESULTS / f"{name}.md").write_text(text)
    print(f"wrote {RESULTS / name}.json" + (" and .md" if markdown is not None else ""), file=sys.stderr)


def vit_result(
    benchmark: str, args: argparse.Namespace, scale_keys: tuple[str, ...], cells: dict, start: float
) -> dict:
    """The result object of flame.py / reefl.py: its scale (the named args), its cells, its seconds."""
    return {
        "benchmark": benchmark,
        "quick": args.quick,
        "scale": {k: getattr(args, k) for k in scale_keys},
        "cells": cells,
        "seconds": time.perf_counter() - start,
    }


def vit_head(name: str, out: dict, setting: str) -> tuple[int, list[str]]:
    """(number of exits, the markdown's title and scale line) of a flame.py / reefl.py result ``out``."""
    exits = len(str(out["scale"]["exits"]).split(","))
    smoke = " (quick smoke run)" if out["quick"] else ""
    scale = f"Scale: {out['scale']}; {setting} Total {out['seconds'] / 60:.1f} min."
    return exits, [f"# {name} benchmark{smoke}", "", scale]


def nested_head(title: str, a: dict, what: str) -> list[str]:
    """The markdown's title and the sentence on the scale of a nested-method run (``a``: its args)."""
    scale = (
        f"{'QUICK SMOKE RUN, not a result. ' if a['quick'] else ''}Reduced scale: ResNet20 at width {a['width']}, "
        f"{a['train_subset']} training images, {a['rounds']} rounds x {a['local_steps']} local steps of "
        f"{a['batch_size']}, test on {a['test']} images, seed {a['seed']}; papers' weighting (--strategy equal)."
    )
    return [f"# {title}", "", f"{scale} {what}", ""]


DOCS = REPO / "docs"


def doc_block(name: str) -> tuple[str, str]:
    """The markers around a block of a doc that a benchmark writes from its JSON (``name``: the benchmark)."""
    return (f"<!-- {name}: generated from bench/results/{name}.json by bench/{name}.py -->",
            f"<!-- /{name} -->")


def write_doc_block(doc: Path, name: str, text: str) -> bool:
    """Replace the text between ``name``'s markers in ``doc`` (docs/simulator.md's "how close" figures) with
    ``text``; False (and nothing written) where the doc has no such block."""
    begin, end = doc_block(name)
    body = doc.read_text()
    if begin not in body or end not in body:
        return False
    head, rest = body.split(begin, 1)
    doc.write_text(head + begin + "\n" + text.rstrip("\n") + "\n" + end + rest.split(end, 1)[1])
    return True


def read_doc_block(doc: Path, name: str) -> str | None:
    """The text between ``name``'s markers in ``doc`` (None: no block)."""
    begin, end = doc_block(name)
    body = doc.read_text()
    if begin not in body or end not in body:
        return None
    return body.split(begin, 1)[1].split(end, 1)[0].strip("\n")
