"""A run dir's life around ``cis train``: opened (a new run's made only once its data and model are built, so a
bad input leaves nothing), and cleaned up after a run that failed mid-way, so nothing is left that ``--resume``
would take for a run (cis/training/run.py writes the files).

The clean-up removes only what the run made: the files of :data:`RUN_START_FILES` that were not in the folder
before it began (:func:`files_before`), and the folder when the run made it and that leaves it empty. A new run
whose input (its ``--spec``, ``--config`` ...) is a file it would write in ``--out`` is refused before anything is
written (:func:`check_inputs_apart`): it would overwrite it, and remove it if it failed; so is an ``--out`` that
holds such a file but no run (:func:`check_foreign_files`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cis.core.errors import CisError, error_line
from cis.core.paths import check_folder
from cis.core.spec import CisSpec, load_spec
from cis.training.checkpoint import read_json
from cis.training.federated import StepFailed

RUN_START_FILES = ("config.json", "spec.toml", "metrics.jsonl", "weights.json", "measured-spec.toml",
                   "measurement.json")
"""What a run writes before its first checkpoint (run.py's write_run_start and train_run; cis train --rates-from)."""
RUN_FILES = (*RUN_START_FILES, "checkpoint.pt", "checkpoint.json", "summary.json")
"""Every file a run writes in its dir."""


def check_out_folder(out: Path) -> None:
    """One line where ``out``, or a folder above it, is a file: a run directory is a folder."""
    check_folder(out, "the run directory (--out)")


def check_inputs_apart(out: Path, inputs: Mapping[str, object]) -> None:
    """One line where an input file (``inputs``: what names it -> its path; None: not given) is a file the run
    writes in ``out``: the run would overwrite it (and remove it, failing before its first checkpoint)."""
    written = {(out / name).resolve(): name for name in RUN_FILES}
    for what, path in inputs.items():
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            continue  # not given (a value of the wrong kind is the config's line)
        if name := written.get(Path(path).expanduser().resolve()):
            raise CisError(
                f"--out {out}: the run writes its own {name} there, and {path} is the {what} it reads; "
                "expected an --out apart from the run's inputs (a folder of its own)"
            )


def check_out_outside_data(out: Path, dataset: object) -> None:
    """One line where ``out`` is the data folder (an image folder, a saved Hugging Face set) or inside it: the
    run's files would change the data, whose hash the run records (export then says the data changed)."""
    if not isinstance(dataset, str):
        return
    text = dataset[3:] if dataset.startswith("hf:") else dataset.split(":", 1)[-1] if ":" in dataset else dataset
    data = Path(text.split("?", 1)[0]).expanduser()
    if not data.is_dir():
        return
    here, there = out.expanduser().resolve(), data.resolve()
    if here == there or there in here.parents:
        raise CisError(
            f"--out {out}: is {'the data folder' if here == there else 'inside the data folder'} {dataset}; the "
            "run's files would change the data; expected an --out outside it"
        )


def check_foreign_files(out: Path) -> None:
    """One line where ``out`` holds a file a new run writes but is not a run of cis (whose config.json and
    metrics.jsonl every run writes first; one stopped before its first checkpoint starts over): the run would
    overwrite a file of the user's own."""
    if (out / "config.json").is_file() and (out / "metrics.jsonl").is_file():
        return
    held = [name for name in RUN_FILES if (out / name).exists()]
    if held:
        raise CisError(
            f"--out {out}: holds {held[0]} but no run of cis (no config.json and metrics.jsonl); a new run would "
            "overwrite it; expected a new or empty folder, or a run's"
        )


def files_before(out: Path) -> frozenset[str] | None:
    """The run files already in ``out`` before a run begins (None: no folder ``out`` yet): what its clean-up
    keeps."""
    if not out.is_dir():
        return None
    return frozenset(name for name in RUN_START_FILES if (out / name).exists())


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


def failed_run(out: Path, round_: int, exc: Exception, before: frozenset[str] | None = None) -> CisError:
    """The one line of a run that failed in round ``round_`` while training or evaluating, after cleaning up:
    without a checkpoint the files it wrote are removed (and its dir, if it made it and that leaves it empty), so
    nothing is left that ``--resume`` would take for a run; with one, the checkpoint stays (a round that
    finished) and ``--resume`` continues from it. ``before``: :func:`files_before` as the run began."""
    cause = exc.__cause__ if isinstance(exc, StepFailed) and exc.__cause__ is not None else exc
    where = str(exc) if isinstance(exc, StepFailed) else f"round {round_}"
    if (out / "checkpoint.json").is_file():
        saved = read_json(out / "checkpoint.json").get("round")
        kept = f"{out} keeps round {saved}'s checkpoint ('cis train --out {out} --resume' continues from it)"
    else:
        discard_unstarted(out, before)
        gone = f"{out} removed" if not out.exists() else f"the files it wrote removed from {out}"
        kept = f"nothing kept (no checkpoint yet; {gone})"
    return CisError(f"training stopped in {where}: {error_line(cause)}; {kept}")


def discard_unstarted(out: Path, before: frozenset[str] | None = None) -> None:
    """A run without a checkpoint: the files it wrote removed (those not in ``before``, :func:`files_before` as
    it began), and its dir when ``before`` is None (the run made it) and that leaves it empty, so nothing is left
    that ``--resume`` would take for a run; a run with one keeps it."""
    if (out / "checkpoint.json").is_file() or not out.is_dir():
        return
    for name in RUN_START_FILES:
        if before is None or name not in before:
            (out / name).unlink(missing_ok=True)
    if before is None and not any(out.iterdir()):
        out.rmdir()
