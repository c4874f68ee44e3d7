"""The benchmarks as a package (issue 40 item 3): the house rule on function size holds in bench/ too, nothing reaches
the benchmarks through sys.path, a benchmark runs as ``python -m bench.NAME``, and the run files that left git
come back only where they belong (bench.runs)."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def test_no_function_in_bench_is_over_60_lines():
    long = []
    for path in python_files("bench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_nothing_reaches_the_benchmarks_through_sys_path():
    def tricks(path: Path) -> list[str]:
        """Lines that put a folder on the import path (in tests: a folder of the benchmarks)."""
        ours = path.relative_to(REPO).parts[0] == "bench"
        lines = enumerate(path.read_text().splitlines(), 1)
        return [f"{path.relative_to(REPO)}:{i}" for i, line in lines
                if "sys.path" in line and "(" in line and (ours or "bench" in line)]  # fmt: skip

    found = [t for p in python_files("bench", "tests") if p.name != "test_bench_package.py" for t in tricks(p)]
    assert not found, found
    assert not (REPO / "benchmarks").exists()


def test_a_benchmark_runs_as_a_module_from_the_root():
    done = subprocess.run([sys.executable, "-m", "bench.runs", "--help"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and "pack" in done.stdout, done.stderr


def _artifact(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_unpacking_writes_only_the_run_folders_and_keeps_a_newer_file(tmp_path, monkeypatch):
    from bench import runs

    results = tmp_path / "repo" / "bench" / "results"
    (results / "table1" / "runs").mkdir(parents=True)
    (results / "table1" / "runs" / "mine.json").write_text("newer")
    monkeypatch.setattr(runs, "RESULTS", results)
    monkeypatch.setattr(runs, "REPO", tmp_path / "repo")
    archive = _artifact(tmp_path / "a.tar.gz", {
        "bench/results/table1/runs/a.json": b"{}",
        "bench/results/table1/runs/mine.json": b"older",
        "bench/results/twin_spans/loopback-0.5.png": b"png",
        "bench/results/table1.json": b"not a run file",
        "bench/results/other/x.json": b"not a run folder",
        "bench/results/table1/../../../evil.json": b"outside",
        "cis/evil.py": b"outside",
    })  # fmt: skip
    written, kept = runs.unpack(archive)
    assert written == 2 and kept == ["bench/results/table1/runs/mine.json"]
    assert (results / "table1" / "runs" / "a.json").read_text() == "{}"
    assert (results / "table1" / "runs" / "mine.json").read_text() == "newer"
    assert (results / "twin_spans" / "loopback-0.5.png").read_bytes() == b"png"
    everything = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert everything == ["a.tar.gz", "repo/bench/results/table1/runs/a.json",
                          "repo/bench/results/table1/runs/mine.json",
                          "repo/bench/results/twin_spans/loopback-0.5.png"]  # fmt: skip


def test_the_artifact_holds_the_run_folders_git_last_held(tmp_path):
    from bench import runs

    try:
        rev = runs.last_rev()
    except (SystemExit, subprocess.CalledProcessError):
        pytest.skip("a clone without the history that removed the run folders")
    with tarfile.open(runs.pack(rev, tmp_path / "runs.tar.gz")) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    folders = {Path(n).parts[2] for n in names}
    assert folders <= set(runs.RUN_FOLDERS) and "table1" in folders
    assert all(n.startswith("bench/results/") for n in names)
