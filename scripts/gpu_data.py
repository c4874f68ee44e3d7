"""Carry a CIFAR-10 subset to a lent GPU machine (its calls carry at most 64 MiB), and unpack it there.

    python scripts/gpu_data.py pack CIFAR_DIR .gpu [--train-per-class 2100] [--test-per-class 300]
    python3 scripts/gpu_data.py unpack .gpu /tmp/cifar-gpu      # on the GPU machine: cifar-10-batches-py/

``pack`` reads CIFAR-10 in any layout cis reads (cis/training/data/loading.py), picks a class-balanced subset
with a fixed seed, and writes it as HWC uint8 compressed with xz and a delta filter (about 0.54 of
the raw bytes; 24,000 images take 44 MB); ``unpack`` needs only numpy and writes the python-pickle
layout that ``cifar10:PATH`` reads. bench/results/gpu_check.md used 2,100 training and 300
test images per class.
"""

from __future__ import annotations

import argparse
import json
import lzma
import pickle
from pathlib import Path

import numpy as np

FILTERS = [{"id": lzma.FILTER_DELTA, "dist": 3}, {"id": lzma.FILTER_LZMA2, "preset": 9}]


def pack(src: Path, dst: Path, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    from cis.training.data.loading import load_dataset  # the project's reader, on the machine that has the data

    splits = load_dataset(f"cifar10:{src}", seed=0, val_size=0)
    rng = np.random.default_rng(seed)
    dst.mkdir(parents=True, exist_ok=True)
    for name, part, per in (("train", splits.train, train_per_class), ("test", splits.test, test_per_class)):
        idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(part.y == c), per, replace=False) for c in range(10)]))
        x = part.x[idx] * np.asarray(part.std)[None, :, None, None] + np.asarray(part.mean)[None, :, None, None]
        x = np.clip(np.rint(x * 255), 0, 255).astype(np.uint8)  # back to the stored pixels
        hwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).tobytes()
        (dst / f"{name}.xz").write_bytes(lzma.compress(hwc, format=lzma.FORMAT_XZ, filters=FILTERS))
        np.save(dst / f"{name}_labels.npy", part.y[idx].astype(np.int64))
    (dst / "classes.json").write_text(json.dumps(splits.train.classes))


def unpack(src: Path, dst: Path) -> None:
    out = dst / "cifar-10-batches-py"
    out.mkdir(parents=True, exist_ok=True)

    def load(name: str) -> tuple[np.ndarray, np.ndarray]:
        y = np.load(src / f"{name}_labels.npy")
        x = np.frombuffer(lzma.decompress((src / f"{name}.xz").read_bytes()), np.uint8).reshape(len(y), 32, 32, 3)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).reshape(len(y), 3072), y

    tx, ty = load("train")
    for k, (xs, ys) in enumerate(zip(np.array_split(tx, 5), np.array_split(ty, 5)), 1):
        (out / f"data_batch_{k}").write_bytes(pickle.dumps({"data": xs, "labels": ys.tolist()}))
    sx, sy = load("test")
    (out / "test_batch").write_bytes(pickle.dumps({"data": sx, "labels": sy.tolist()}))
    names = json.loads((src / "classes.json").read_text())
    (out / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    print(f"CIFAR-10 subset in {out}: {len(ty)} training, {len(sy)} test images")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--train-per-class", type=int, default=2100)
    p.add_argument("--test-per-class", type=int, default=300)
    u = sub.add_parser("unpack")
    u.add_argument("src", type=Path)
    u.add_argument("dst", type=Path)
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args.src, args.dst, args.train_per_class, args.test_per_class)
    else:
        unpack(args.src, args.dst)


if __name__ == "__main__":
    main()
