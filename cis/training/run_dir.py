"""A run dir's life around ``cis train``: opened (a new run's made only once its data and model are built, so a
bad input leaves nothing), and cleaned up after a run that failed mid-way, so nothing is left that ``--resume``
would take for a run (cis/training/run.py writes the files)."""

from __future__ import annotations

from pathlib import Path

from cis.core.errors import CisError, error_line
from cis.core.paths import check_folder
from cis.core.spec import CisSpec, load_spec
from cis.training.checkpoint import read_json
from cis.training.federated import StepFailed

RUN_START_FILES = ("config.json", "spec.toml", "metrics.jsonl", "weights.json", "measured-spec.toml",
                   "measurement.json")
"""What a run writes before its first checkpoint (run.py's write_run_start and train_run; cis train --rates-from)."""


def check_out_folder(out: Path) -> None:
    """One line where ``out``, or a folder above it, is a file: a run directory is a folder."""
    check_folder(out, "the run directory (--out)")


def open_run_dir(out: Path, resume: bool) -> CisSpec | None:
    """A resumed run's spec; for a new run, None (its dir is made once the data and model are built)."""
    if resume:
        if not (out / "config.json").is_file():
            raise CisError(f"{out}: nothing to resume; expected config.json from an earlier 'cis train --out {out}'")
        return load_spec(out / "spec.toml")
    check_out_folder(out)
    if (out / "checkpoint.pt").exists():
        raise CisError(f"{out}: already holds a run; use --resume to continue it or choose another --out")
    return None  # made by write_run_start once the model and data are built: a bad input leaves nothing


def failed_run(out: Path, round_: int, exc: Exception) -> CisError:
    """The one line of a run that failed in round ``round_`` while training or evaluating, after cleaning up:
    without a checkpoint the files it wrote are removed (and its dir, if that leaves it empty), so nothing is
    left that ``--resume`` would take for a run; with one, the checkpoint stays (a round that finished) and
    ``--resume`` continues from it."""
    cause = exc.__cause__ if isinstance(exc, StepFailed) and exc.__cause__ is not None else exc
    where = str(exc) if isinstance(exc, StepFailed) else f"round {round_}"
    if (out / "checkpoint.json").is_file():
        saved = read_json(out / "checkpoint.json").get("round")
        kept = f"{out} keeps round {saved}'s checkpoint ('cis train --out {out} --resume' continues from it)"
    else:
        discard_unstarted(out)
        kept = f"nothing kept (no checkpoint yet; {out} removed)"
    return CisError(f"training stopped in {where}: {error_line(cause)}; {kept}")


def discard_unstarted(out: Path) -> None:
    """A run without a checkpoint: the files it wrote removed (and its dir, if that leaves it empty), so nothing
    is left that ``--resume`` would take for a run; a run with one keeps it."""
    if (out / "checkpoint.json").is_file():
        return
    for name in RUN_START_FILES:
        (out / name).unlink(missing_ok=True)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
