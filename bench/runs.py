"""The benchmarks' run files that left git (bench/README.md): a release artifact, packed and unpacked.

    python -m bench.runs pack [--rev REV] [--out FILE]   # the run folders as git last held them, one .tar.gz
    python -m bench.runs unpack FILE                     # back into bench/results/ (for --report, reused cells)

``pack`` reads the folders from git's history (``--rev``; default: the commit before the one that removed them),
so any clone with history makes the same artifact; the release attaches it. ``unpack`` writes only below
bench/results/<one of RUN_FOLDERS>/ and never overwrites a file that differs (a newer run of the same name).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

from bench.harness import REPO, RESULTS

RUN_FOLDERS = ("budget_curve", "closed_loop", "table1", "table1_dev", "table1_large", "table1_rerun", "table2",
               "table2_diagnostics", "twin_spans")  # fmt: skip
PATHS = [f"bench/results/{name}" for name in RUN_FOLDERS]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def last_rev() -> str:
    """The commit before the one that removed the run folders from git (``--full-history``: that commit is on a
    merged branch's side, which git log's default history simplification does not walk once the merge's first
    parent never held the folders)."""
    removed = git("log", "-1", "--format=%H", "--diff-filter=D", "--full-history", "--", PATHS[2])
    if not removed:
        raise SystemExit(f"bench.runs: no commit removed {PATHS[2]}; give --rev")
    return git("rev-parse", f"{removed}^")


def pack(rev: str, out: Path) -> Path:
    """The run folders as ``rev`` held them, as one .tar.gz (paths relative to the repository root)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    present = [p for p in PATHS if git("ls-tree", "--name-only", rev, p)]
    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o", str(out.resolve()), rev, "--",
                    *present], check=True)  # fmt: skip
    return out


def unpack(archive: Path) -> tuple[int, list[str]]:
    """(files written, files kept because this checkout has another version) from ``archive``."""
    written, kept = 0, []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) < 4 or parts[:2] != ("bench", "results") or \
                    parts[2] not in RUN_FOLDERS or ".." in parts:  # fmt: skip
                continue
            target = RESULTS.joinpath(*parts[2:])
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if target.exists() and target.read_bytes() != data:
                kept.append(str(target.relative_to(REPO)))
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written += 1
    return written, kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="the run folders from git's history, one .tar.gz")
    p.add_argument("--rev", help="the commit to read them from (default: the one before they were removed)")
    p.add_argument("--out", default="dist/cis-bench-runs.tar.gz")
    u = sub.add_parser("unpack", help="an artifact's run folders back into bench/results/")
    u.add_argument("archive")
    args = ap.parse_args()
    if args.command == "pack":
        rev = args.rev or last_rev()
        print(f"wrote {pack(rev, Path(args.out))} from {rev[:12]}")
        return 0
    written, kept = unpack(Path(args.archive))
    print(f"{written} files into {RESULTS}" + (f"; kept this checkout's version of {len(kept)}" if kept else ""))
    for path in kept:
        print(f"  kept {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
