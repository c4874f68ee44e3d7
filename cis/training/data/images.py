"""Image folders: ``DIR/<class>/*`` or ``DIR/{train,test}[,val]/<class>/*``, decoded to uint8 (N, C, H, W).

Classes are the class folders in alphabetical order (those of ``train/`` in the split layout, which
``test/`` and ``val/`` repeat); at least two, each with images. Hidden (dot) folders and files, such as
``.ipynb_checkpoints``, are skipped; split folders without both ``train/`` and ``test/`` are an error.
Images are png, jpg, bmp, gif, tif or webp (what ``cis infer`` reads too). Unless the caller fixes
them (CIFAR: 32x32 RGB), the size is the most common one among the images (the others are resized to
it, bilinear) and the channels are 1 when every image is greyscale, else 3 (RGB).

Decoded folders are cached as ``.npz`` under ``$CIS_CACHE_DIR`` (default ``~/.cache/cis``), keyed by
the folder's path and its files' sizes and mtimes; the folder itself is never written to.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from cis.core.errors import CisError
from cis.core.input_files import IMAGE_SUFFIXES

SPLIT_DIRS = ("train", "val", "test")  # the split layout's folders; their index is the split code
_GREY_MODES = {"1", "L", "LA", "I", "I;16", "F"}


@dataclass
class ImageFolder:
    """Decoded images ``x`` uint8 (N, C, H, W), labels ``y``, the split code of each (-1: no split layout)."""

    x: np.ndarray
    y: np.ndarray
    split: np.ndarray
    classes: list[str]


def has_split_layout(root: Path) -> bool:
    """Whether ``root`` holds ``train/`` and ``test/`` folders (CIFAR's image-folder layout)."""
    return (root / "train").is_dir() and (root / "test").is_dir()


def read_image_folder(
    root: Path, cache: bool = True, size: int | None = None, channels: int | None = None
) -> ImageFolder:
    """Decode the folder (see the module doc); ``size``/``channels`` fix the output shape, else from the images."""
    if not root.is_dir():
        raise CisError(f"image folder {root}: not found; expected a folder of class folders")
    files, split, classes = _listing(root)
    if size is None or channels is None:
        found_size, found_channels = _common_shape(files)
        size, channels = size or found_size, channels or found_channels
    cache_file = _cache_path(root, files, size, channels) if cache else None
    cached = _read_cache(cache_file)
    if cached is not None:
        return cached
    x, y = _decode(files, size, channels)
    out = ImageFolder(x, y, split, classes)
    _write_cache(cache_file, out)
    return out


def _listing(root: Path) -> tuple[list[tuple[Path, int]], np.ndarray, list[str]]:
    """Every image with its label, the split code of each, and the classes."""
    if not has_split_layout(root):
        _check_no_half_split(root)
        classes = _class_dirs(root)
        files = _class_files(root, classes)
        return files, np.full(len(files), -1, np.int64), classes
    classes = _class_dirs(root / "train")
    files, split = [], []
    for code, name in enumerate(SPLIT_DIRS):
        folder = root / name
        if not folder.is_dir():
            continue
        extra = sorted(set(_subfolders(folder)) - set(classes))
        if extra:
            raise CisError(f"image folder {folder}: classes {extra} are not in train/, expected the same classes")
        part = _class_files(folder, classes)
        files += part
        split += [code] * len(part)
    return files, np.array(split, np.int64), classes


def _visible(path: Path) -> bool:
    """Not a hidden (dot) file or folder: .ipynb_checkpoints, .DS_Store, macOS's ._ files are not data."""
    return not path.name.startswith(".")


def _subfolders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and _visible(p))


def _check_no_half_split(root: Path) -> None:
    """Split folders (train/, val/, test/) without both train/ and test/ are not classes: one line."""
    found = _subfolders(root)
    if found and set(found) <= set(SPLIT_DIRS):
        listing = ", ".join(f"{name}/" for name in found)
        raise CisError(
            f"image folder {root}: {listing} without {'test/' if 'train' in found else 'train/'}; expected train/ and "
            f"test/ together ({root}/{{train,test}}[,val]/<class>/*.png) or class folders ({root}/<class>/*.png)"
        )


def _class_dirs(folder: Path) -> list[str]:
    classes = _subfolders(folder)
    if len(classes) < 2:
        found = f"1 class folder ({classes[0]}/)" if classes else "no class folders"
        raise CisError(f"image folder {folder}: {found}; expected at least 2 classes, {folder}/<class>/*.png")
    return classes


def _class_files(folder: Path, classes: list[str]) -> list[tuple[Path, int]]:
    """(image, label) of every class folder in ``folder``: each class must be there, with images."""
    files: list[tuple[Path, int]] = []
    for label, cls in enumerate(classes):
        cls_dir = folder / cls
        if not cls_dir.is_dir():
            raise CisError(f"image folder {folder}: class folder {cls!r} not found, expected the classes of train/")
        images = sorted(
            p for p in cls_dir.iterdir() if p.is_file() and _visible(p) and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not images:
            raise CisError(f"image folder {cls_dir}: no images, expected {', '.join(IMAGE_SUFFIXES)} files")
        files.extend((p, label) for p in images)
    return files


def _common_shape(files: list[tuple[Path, int]]) -> tuple[int, int]:
    """The most common (square side) size among the images and their channel count (1 if all are greyscale)."""
    sizes: Counter[tuple[int, int]] = Counter()
    grey = True
    for path, _ in files:
        try:
            with Image.open(path) as img:  # reads the header only
                sizes[img.size] += 1
                grey = grey and img.mode in _GREY_MODES
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise CisError(f"image {path}: cannot be decoded ({exc}), expected an image file") from None
    (w, h), _ = sizes.most_common(1)[0]
    if w != h:
        raise CisError(f"image folder: most images are {w}x{h}; expected square images (the models take H = W)")
    return w, 1 if grey else 3


def _decode(files: list[tuple[Path, int]], size: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.empty((len(files), channels, size, size), np.uint8)
    mode = "L" if channels == 1 else "RGB"
    for i, (path, _) in enumerate(files):
        try:
            with Image.open(path) as img:
                picture = img.convert(mode)
                if picture.size != (size, size):
                    picture = picture.resize((size, size), Image.Resampling.BILINEAR)
                pixels = np.asarray(picture)
                x[i] = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise CisError(f"image {path}: cannot be decoded ({exc}), expected an image file") from None
    return x, np.array([label for _, label in files], np.int64)


def _cache_path(root: Path, files: list[tuple[Path, int]], size: int, channels: int) -> Path:
    digest = hashlib.sha256(f"{root.resolve()}|{size}|{channels}".encode())
    for path, label in files:
        st = path.stat()
        digest.update(f"{path.relative_to(root)}|{label}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    cache_dir = Path(os.environ.get("CIS_CACHE_DIR") or Path.home() / ".cache" / "cis")
    return cache_dir / f"imagefolder-{digest.hexdigest()[:24]}.npz"


def _read_cache(cache_file: Path | None) -> ImageFolder | None:
    if cache_file is None or not cache_file.is_file():
        return None
    try:
        with np.load(cache_file, allow_pickle=False) as z:
            return ImageFolder(z["x"], z["y"], z["split"], [str(c) for c in z["classes"]])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # a stale or truncated cache is rebuilt


def _write_cache(cache_file: Path | None, folder: ImageFolder) -> None:
    if cache_file is None:
        return
    tmp = cache_file.with_suffix(f".{os.getpid()}.tmp.npz")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, x=folder.x, y=folder.y, split=folder.split, classes=np.array(folder.classes))
        os.replace(tmp, cache_file)
    except OSError:
        tmp.unlink(missing_ok=True)  # the cache is an optimisation; an unwritable home is fine
