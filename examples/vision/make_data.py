"""Draws the vision example's data: a tiny image folder of four shapes, nothing downloaded.

    python make_data.py OUT [--train 40] [--test 10] [--size 32] [--seed 0]

writes ``OUT/train/<shape>/NNNN.png`` and ``OUT/test/<shape>/NNNN.png`` (the image-folder layout that
``cis train --data OUT`` and ``cis infer --dataset OUT/test`` read): a filled circle, cross, square or
triangle of a random colour, size and place on a dark background, with pixel noise. Needs numpy and
pillow (the 'train' extra has both).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "cross", "square", "triangle")


def draw(shape: str, rng: np.random.Generator, size: int) -> Image.Image:
    """One RGB image of ``shape``."""
    background = tuple(int(v) for v in rng.integers(0, 90, 3))
    colour = tuple(int(v) for v in rng.integers(140, 256, 3))
    image = Image.new("RGB", (size, size), background)
    pen = ImageDraw.Draw(image)
    r = rng.uniform(0.22, 0.4) * size
    cx, cy = rng.uniform(r + 1, size - r - 1, 2)
    if shape == "circle":
        pen.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        pen.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    else:  # cross
        w = r / 3
        pen.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
        pen.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)
    noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 12, (size, size, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def write_folder(out: Path, counts: dict[str, int], size: int, seed: int) -> None:
    """``out/<split>/<shape>/NNNN.png`` for each split's count of images per shape."""
    rng = np.random.default_rng(seed)
    for split, count in counts.items():
        for shape in SHAPES:
            folder = out / split / shape
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                draw(shape, rng, size).save(folder / f"{i:04d}.png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="folder to write (train/ and test/ inside)")
    p.add_argument("--train", type=int, default=40, help="training images per shape (default 40)")
    p.add_argument("--test", type=int, default=10, help="test images per shape (default 10)")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    write_folder(args.out, {"train": args.train, "test": args.test}, args.size, args.seed)
    total = (args.train + args.test) * len(SHAPES)
    print(f"{args.out}: {total} images of {', '.join(SHAPES)} ({args.size}x{args.size} RGB PNG)")


if __name__ == "__main__":
    main()
