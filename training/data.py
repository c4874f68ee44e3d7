"""Datasets: the bundled 8x8 digits and CIFAR-10/100 read from a local folder.

``load_dataset(spec)`` returns train/validation/test splits as normalised float32
arrays in (N, C, H, W) layout. Specs:

- ``digits``: scikit-learn's bundled 8x8 digits (no download), split 70/10/20 %
  with a seed and normalised with the training split's mean and std.
- ``cifar10:PATH`` / ``cifar100:PATH``: a local copy in either layout, detected
  automatically:

  * the python-pickle layout of the official archives
    (``PATH/cifar-10-batches-py/{data_batch_1..5,test_batch}`` or
    ``PATH/cifar-100-python/{train,test}``, or PATH being that folder itself);
  * an image folder ``PATH/{train,test}/<class>/*.png|jpg`` with the classes in
    alphabetical order (images are converted to RGB and resized to 32x32 when
    they are another size).

  The training set is split into train/validation with a seed (the paper's
  45k/5k: ``val_size`` defaults to 5000, capped at 10 % of a smaller training
  set) and everything is normalised with the standard CIFAR constants.

Decoded image folders are cached as ``.npz`` under ``$CIS_CACHE_DIR`` (default
``~/.cache/cis``), keyed by the folder's path and its files' sizes and mtimes;
the dataset folder itself is never written to (it may be read-only).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from cis.errors import CisError

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

_CIFAR_VAL_SIZE = 5000
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
_CIFAR_SIZE = 32


@dataclass
class Dataset:
    """Normalised images ``x`` (N, C, H, W) float32 and labels ``y`` (N,) int64."""

    x: np.ndarray
    y: np.ndarray
    classes: list[str]
    mean: list[float]
    std: list[float]
    name: str

    def __len__(self) -> int:
        return len(self.y)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    def subset(self, indices: np.ndarray) -> Dataset:
        """The samples at ``indices`` (e.g. one node's partition), same metadata."""
        return Dataset(self.x[indices], self.y[indices], self.classes, self.mean, self.std, self.name)


@dataclass
class DataSplits:
    """Train, validation (held out of the training set) and test sets of one dataset."""

    train: Dataset
    val: Dataset
    test: Dataset


def load_dataset(spec: str, seed: int = 0, val_size: int | None = None, cache: bool = True) -> DataSplits:
    """Load ``digits``, ``cifar10:PATH`` or ``cifar100:PATH`` as seeded train/val/test splits.

    ``val_size`` is the number of training samples held out for validation
    (default: 10 % for digits, 5000 capped at 10 % of the training set for CIFAR).
    ``cache`` enables the decoded-image cache for image-folder layouts.
    """
    name, sep, path = spec.partition(":")
    if name == "digits" and not sep:
        return _load_digits(seed, val_size)
    if name in ("cifar10", "cifar100"):
        if not path:
            raise CisError(f"dataset {spec!r}: missing folder, expected '{name}:PATH'")
        return _load_cifar(name, Path(path).expanduser(), seed, val_size, cache)
    raise CisError(f"dataset {spec!r}: unknown dataset, expected 'digits', 'cifar10:PATH' or 'cifar100:PATH'")


def augment_options(name: str) -> dict[str, int | bool]:
    """Keyword arguments of :func:`augment_batch` suited to dataset ``name``.

    Digits get 1-pixel shifts and no flip (a mirrored digit is another symbol or
    none); CIFAR gets the standard 4-pixel crop and horizontal flip.
    """
    if name == "digits":
        return {"padding": 1, "flip": False}
    if name in ("cifar10", "cifar100"):
        return {"padding": 4, "flip": True}
    raise CisError(f"augmentation for dataset {name!r}: unknown dataset, expected 'digits', 'cifar10' or 'cifar100'")


def augment_batch(
    x: torch.Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True
) -> torch.Tensor:
    """Random crop after zero padding, plus a random horizontal flip, per sample.

    Vectorised over the batch (one gather, no Python loop). The padding value is
    0 in the space of ``x``; on normalised data that is the dataset's mean colour.
    The random draws come from ``generator`` on its own device (the engine's CPU
    generators) and move to ``x``'s, so a GPU run crops and flips as a CPU run does.
    """
    n, _, h, w = x.shape
    g = generator.device
    if padding > 0:
        padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
        top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=g).to(x.device)
        left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=g).to(x.device)
        rows = top[:, None] + torch.arange(h, device=x.device)  # (N, H)
        cols = left[:, None] + torch.arange(w, device=x.device)  # (N, W)
        batch = torch.arange(n, device=x.device)[:, None, None]
        # Advanced indices around a slice put the indexed dims first: (N, H, W, C).
        x = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if flip:
        mask = torch.rand(n, generator=generator, device=g).to(x.device) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x.contiguous()


def _train_val_split(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[val_size:]), np.sort(order[:val_size])


def _check_val_size(spec: str, val_size: int, n_train: int) -> None:
    if isinstance(val_size, bool) or not isinstance(val_size, int) or not 0 <= val_size < n_train:
        raise CisError(f"dataset {spec}: val_size is {val_size!r}, expected an integer in 0..{n_train - 1}")


def _load_digits(seed: int, val_size: int | None) -> DataSplits:
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = (raw.data.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    y = raw.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(0.2 * len(y))
    n_rest = len(y) - n_test
    n_val = round(0.1 * len(y)) if val_size is None else val_size
    _check_val_size("digits", n_val, n_rest)
    test_idx, val_idx, train_idx = (
        np.sort(order[:n_test]),
        np.sort(order[n_test : n_test + n_val]),
        np.sort(order[n_test + n_val :]),
    )
    mean = [float(x[train_idx].mean())]
    std = [float(x[train_idx].std())]
    x = ((x - mean[0]) / std[0]).astype(np.float32)
    classes = [str(d) for d in range(10)]

    def part(idx: np.ndarray) -> Dataset:
        return Dataset(x[idx], y[idx], classes, mean, std, "digits")

    return DataSplits(part(train_idx), part(val_idx), part(test_idx))


def _load_cifar(name: str, root: Path, seed: int, val_size: int | None, cache: bool) -> DataSplits:
    spec = f"{name}:{root}"
    if not root.is_dir():
        raise CisError(f"dataset {spec}: folder {root} not found, expected a CIFAR folder")
    num_classes = 10 if name == "cifar10" else 100
    pickle_dir = _find_pickle_dir(name, root)
    if pickle_dir is not None:
        train_x, train_y, test_x, test_y, classes = _read_cifar_pickles(name, pickle_dir)
    elif (root / "train").is_dir() and (root / "test").is_dir():
        train_x, train_y, test_x, test_y, classes = _read_image_folder_cached(root, cache)
    else:
        sub = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
        raise CisError(
            f"dataset {spec}: no known layout in {root}, expected {sub}/ (python pickles) "
            "or train/<class>/ and test/<class>/ image folders"
        )
    if len(classes) != num_classes:
        raise CisError(f"dataset {spec}: found {len(classes)} classes in {root}, expected {num_classes} for {name}")

    n_val = min(_CIFAR_VAL_SIZE, len(train_y) // 10) if val_size is None else val_size
    _check_val_size(spec, n_val, len(train_y))
    train_idx, val_idx = _train_val_split(len(train_y), n_val, seed)
    mean, std = (CIFAR10_MEAN, CIFAR10_STD) if name == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)

    def part(x: np.ndarray, y: np.ndarray) -> Dataset:
        return Dataset(_normalise(x, mean, std), y.astype(np.int64), classes, list(mean), list(std), name)

    return DataSplits(
        part(train_x[train_idx], train_y[train_idx]),
        part(train_x[val_idx], train_y[val_idx]),
        part(test_x, test_y),
    )


def _normalise(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    out = x.astype(np.float32)
    out /= 255.0
    out -= np.asarray(mean, np.float32)[None, :, None, None]
    out /= np.asarray(std, np.float32)[None, :, None, None]
    return out


# ---------------------------------------------------------------- pickle layout

_PICKLE_FILES = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "meta"),
}


def _find_pickle_dir(name: str, root: Path) -> Path | None:
    sub, train_files, _, _ = _PICKLE_FILES[name]
    for candidate in (root / sub, root):
        if (candidate / train_files[0]).is_file():
            return candidate
    return None


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR batches: only numpy arrays and plain containers.

    The official batches are plain dicts of bytes, lists and numpy arrays, so
    refusing every other global costs nothing and closes the code-execution hole
    (the allowed names are what numpy 1.x and 2.x pickles of arrays reference).
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, LookupError, ImportError) as exc:
        raise CisError(f"CIFAR batch {path}: cannot be read ({exc}), expected a CIFAR python pickle") from None
    if not isinstance(obj, dict):
        raise CisError(f"CIFAR batch {path}: holds a {type(obj).__name__}, expected a dict")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _read_batch(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise CisError(f"CIFAR batch {path}: file not found, expected it in the python-pickle layout")
    batch = _unpickle(path)
    data, labels = batch.get("data"), batch.get(label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise CisError(f"CIFAR batch {path}: entry 'data' is missing or malformed, expected a uint8 array (N, 3072)")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        y = np.empty(0, np.int64)
    if y.shape != (len(data),) or (len(y) and (y.min() < 0 or y.max() >= num_classes)):
        raise CisError(
            f"CIFAR batch {path}: entry {label_key!r} is missing or malformed, "
            f"expected {len(data)} labels in 0..{num_classes - 1}"
        )
    return data.reshape(-1, 3, 32, 32), y


def _read_cifar_pickles(name: str, folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    _, train_files, test_files, meta_file = _PICKLE_FILES[name]
    num_classes = 10 if name == "cifar10" else 100
    label_key = "labels" if name == "cifar10" else "fine_labels"

    def read_all(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [_read_batch(folder / f, label_key, num_classes) for f in files]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    train_x, train_y = read_all(train_files)
    test_x, test_y = read_all(test_files)
    classes = [str(i) for i in range(num_classes)]
    if (folder / meta_file).is_file():
        names_key = "label_names" if name == "cifar10" else "fine_label_names"
        names = _unpickle(folder / meta_file).get(names_key)
        if not isinstance(names, list) or len(names) != num_classes:
            raise CisError(
                f"CIFAR meta {folder / meta_file}: entry {names_key!r} malformed, expected {num_classes} names"
            )
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return train_x, train_y, test_x, test_y, classes


# ---------------------------------------------------------- image-folder layout


def _class_files(split_dir: Path, classes: list[str]) -> list[tuple[Path, int]]:
    files = []
    for label, cls in enumerate(classes):
        cls_dir = split_dir / cls
        if not cls_dir.is_dir():
            raise CisError(
                f"image folder {split_dir}: class folder {cls!r} not found, expected the same classes as train/"
            )
        images = sorted(p for p in cls_dir.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
        if not images:
            raise CisError(f"image folder {cls_dir}: no images, expected *.png or *.jpg files")
        files.extend((p, label) for p in images)
    return files


def _image_folder_files(root: Path) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, int]]]:
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not classes:
        raise CisError(f"image folder {root / 'train'}: no class folders, expected train/<class>/*.png")
    extra = sorted({p.name for p in (root / "test").iterdir() if p.is_dir()} - set(classes))
    if extra:
        raise CisError(f"image folder {root / 'test'}: classes {extra} are not in train/, expected the same classes")
    return classes, _class_files(root / "train", classes), _class_files(root / "test", classes)


def _decode(files: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
    x = np.empty((len(files), 3, _CIFAR_SIZE, _CIFAR_SIZE), np.uint8)
    for i, (path, _) in enumerate(files):
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                if img.size != (_CIFAR_SIZE, _CIFAR_SIZE):
                    img = img.resize((_CIFAR_SIZE, _CIFAR_SIZE), Image.BILINEAR)
                x[i] = np.asarray(img).transpose(2, 0, 1)
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise CisError(f"image {path}: cannot be decoded ({exc}), expected a PNG or JPEG image") from None
    return x, np.array([label for _, label in files], np.int64)


def _cache_path(root: Path, files: list[tuple[Path, int]]) -> Path:
    digest = hashlib.sha256(str(root.resolve()).encode())
    for path, label in files:
        st = path.stat()
        digest.update(f"{path.relative_to(root)}|{label}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    cache_dir = Path(os.environ.get("CIS_CACHE_DIR") or Path.home() / ".cache" / "cis")
    return cache_dir / f"imagefolder-{digest.hexdigest()[:24]}.npz"


def _read_image_folder_cached(
    root: Path, cache: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    classes, train_files, test_files = _image_folder_files(root)
    cache_file = _cache_path(root, train_files + test_files) if cache else None
    if cache_file is not None and cache_file.is_file():
        try:
            with np.load(cache_file, allow_pickle=False) as z:
                return z["train_x"], z["train_y"], z["test_x"], z["test_y"], [str(c) for c in z["classes"]]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            pass  # a stale or truncated cache is rebuilt below
    train_x, train_y = _decode(train_files)
    test_x, test_y = _decode(test_files)
    if cache_file is not None:
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp.npz")
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y, classes=np.array(classes))
            os.replace(tmp, cache_file)
        except OSError:
            tmp.unlink(missing_ok=True)  # the cache is an optimisation; an unwritable home is fine
    return train_x, train_y, test_x, test_y, classes
