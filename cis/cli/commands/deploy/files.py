"""Writing a deployment's files: the output folder holds what one ``cis deploy`` wrote and its record.

``deploy.json`` (the command's ``--json`` result) lists the files; a later ``cis deploy`` into the same folder
replaces them (a node taken out of the spec leaves no stale manifest behind), and refuses a folder that holds
anything else, so ``kubectl apply -f DIR`` applies exactly one deployment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cis.core.errors import CisError

RECORD = "deploy.json"


def prepare(out: Path) -> None:
    """Make ``out``, or empty it of a previous deployment's files; anything else there is refused."""
    if out.exists() and not out.is_dir():
        raise CisError(f"{out}: not a folder; expected a new or empty folder for the deployment's files")
    if not out.exists():
        out.mkdir(parents=True)
        return
    present = {p.name for p in out.iterdir()}
    ours = _previous(out) | {RECORD}
    if present - ours:
        raise CisError(
            f"{out}: holds {', '.join(sorted(present - ours))}, which no cis deploy wrote there; expected a new or "
            "empty folder (or one an earlier cis deploy wrote)"
        )
    for name in present & ours:
        (out / name).unlink()


def _previous(out: Path) -> set[str]:
    try:
        record = json.loads((out / RECORD).read_text())
        return {Path(f).name for f in record["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def write(out: Path, texts: dict[str, str], result: dict[str, Any]) -> dict[str, Any]:
    """Write every file and the record; the result with ``files`` (absolute paths, the record last)."""
    root = out.resolve()
    for name, text in texts.items():
        (root / name).write_text(text)
    result = {**result, "out": str(root), "files": [str(root / name) for name in [*texts, RECORD]]}
    (root / RECORD).write_text(json.dumps(result, indent=2) + "\n")
    return result
