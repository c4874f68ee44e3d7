"""Carry a file bigger than one device call allows (onnxruntime-gpu's wheel, about 255 MB) in parts.

    python3 scripts/gpu_parts.py split WHEEL DIR [--mib 55]   # here: DIR/part-000 ... and DIR/parts.json
    python3 scripts/gpu_parts.py join DIR OUT_DIR             # there: OUT_DIR/<the file's name>, sha256 checked

A device call carries at most 64 MiB of ignored paths, so each call of a warm machine carries one part
(and parts.json) and copies it to /tmp, which stays while the machine is warm; the last call joins them
(scripts/gpu_serve_check.sh does, from $PARTS). ``join`` refuses a missing, extra or changed part with one
line naming it, and checks the whole file's sha256 too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

MANIFEST = "parts.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(path: Path, out: Path, mib: float = 55.0) -> dict:
    """Cut ``path`` into parts of at most ``mib`` MiB in ``out``; returns the manifest (also in out/parts.json)."""
    size = int(mib * (1 << 20))
    if size < 1:
        raise SystemExit(f"gpu_parts: --mib is {mib}; expected a positive size")
    out.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    parts = []
    with open(path, "rb") as f:
        while chunk := f.read(size):
            whole.update(chunk)
            name = f"part-{len(parts):03d}"
            (out / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk), "sha256": _sha256(chunk)})
    manifest = {"file": path.name, "bytes": sum(p["bytes"] for p in parts), "sha256": whole.hexdigest(),
                "parts": parts}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def join(parts_dir: Path, out: Path) -> Path:
    """Join the parts named in parts_dir/parts.json into out/<file>; every part's and the whole's sha256 checked."""
    try:
        manifest = json.loads((parts_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"gpu_parts: {parts_dir / MANIFEST}: cannot read the manifest ({exc})") from None
    out.mkdir(parents=True, exist_ok=True)
    target = out / manifest["file"]
    whole = hashlib.sha256()
    with open(target, "wb") as f:
        for part in manifest["parts"]:
            p = parts_dir / part["name"]
            if not p.is_file():
                raise SystemExit(f"gpu_parts: {p}: missing; expected {len(manifest['parts'])} parts")
            data = p.read_bytes()
            if _sha256(data) != part["sha256"]:
                raise SystemExit(f"gpu_parts: {p}: sha256 differs from {MANIFEST}; carry it again")
            whole.update(data)
            f.write(data)
    if whole.hexdigest() != manifest["sha256"]:
        target.unlink()
        raise SystemExit(f"gpu_parts: {target.name}: the joined file's sha256 differs from {MANIFEST}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("split", help="cut a file into parts")
    s.add_argument("file", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--mib", type=float, default=55.0, help="largest part in MiB (default 55)")
    j = sub.add_parser("join", help="join the parts of a folder")
    j.add_argument("parts", type=Path)
    j.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.action == "split":
        m = split(args.file, args.out, args.mib)
        print(f"{m['file']}: {m['bytes']} bytes in {len(m['parts'])} parts under {args.out}")
    else:
        print(join(args.parts, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
