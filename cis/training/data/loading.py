"""Datasets: ``load_dataset(ref)`` -> train/validation/test splits for any data reference.

References (cis/training/data/data_ref.py parses them, torch-free):

- ``digits``: scikit-learn's bundled 8x8 digits (no download), split 70/10/20 %
  with a seed and normalised with the training split's mean and std.
- ``cifar10:PATH`` / ``cifar100:PATH``: a local copy in either layout, detected
  automatically:

  * the python-pickle layout of the official archives
    (``PATH/cifar-10-batches-py/{data_batch_1..5,test_batch}`` or
    ``PATH/cifar-100-python/{train,test}``, or PATH being that folder itself);
  * an image folder ``PATH/{train,test}/<class>/*.png|jpg`` with the classes in
    alphabetical order (images are converted to RGB and resized to 32x32 when
    they are another size; cis/training/data/images.py).

  The training set is split into train/validation with a seed (the paper's
  45k/5k: ``val_size`` defaults to 5000, capped at 10 % of a smaller training
  set) and everything is normalised with the standard CIFAR constants.
- ``PATH.npz``, an image folder ``DIR``, ``hf:DIR``, ``PATH.py:FACTORY`` | ``pkg.module:FACTORY``: the
  user's data (cis/training/data/sources.py), checked and split by cis/training/data/dataset.py.

The splits carry the sha256 of the user's data (:func:`cis.training.data.data_ref.data_sha256`); a run records it
and :func:`load_run_data` refuses data that changed since.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cis.core.errors import CisError
from cis.training.data.data_ref import BUILTIN, check_unchanged, data_sha256, parse_data_ref
from cis.training.data.dataset import Dataset, DataSplits, check_val_size, seeded_split, train_val_split
from cis.training.data.images import has_split_layout, read_image_folder
from cis.training.data.sources import load_user_data

__all__ = ["DataSplits", "Dataset", "augment_batch", "augment_options", "load_dataset", "load_run_data"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

_CIFAR_VAL_SIZE = 5000
_CIFAR_SIZE = 32


def load_dataset(
    spec: str, seed: int = 0, val_size: int | None = None, cache: bool = True, num_classes: int | None = None
) -> DataSplits:
    """The seeded train/val/test splits of a data reference (the module doc lists them).

    ``val_size`` is the number of training samples held out for validation
    (default: 10 % for digits and the user's data, 5000 capped at 10 % of the training set for CIFAR).
    ``cache`` enables the decoded-image cache for image folders. ``num_classes``: the class count a spec
    states, for the user's data that names no classes (cis/training/data/dataset.py ``class_names``).
    """
    ref = parse_data_ref(spec, "dataset")
    if ref.kind == "digits":
        return _load_digits(seed, val_size)
    if ref.kind in ("cifar10", "cifar100"):
        assert ref.path is not None
        return _load_cifar(ref.kind, ref.path, seed, val_size, cache)
    sha256 = data_sha256(spec)
    splits = load_user_data(ref, seed, val_size, cache, num_classes)
    splits.sha256 = sha256
    return splits


def load_run_data(meta: dict[str, Any], where: str) -> DataSplits:
    """The splits a run (its checkpoint meta or config) trained on; one line when its data file changed since."""
    check_unchanged(str(meta["dataset"]), meta.get("data_sha256"), where)
    classes = meta.get("classes")  # the count the run trained with (a spec's, where the data names none)
    return load_dataset(
        str(meta["dataset"]),
        seed=int(meta.get("seed", 0)),
        val_size=meta.get("val_size"),
        num_classes=len(classes) if classes else None,
    )


def image_family(name: str, input_shape: tuple[int, ...]) -> str:
    """The built-in data set whose model fits data of ``input_shape``: its own for a built-in data set, else
    ``digits`` (the small CNN) for square images up to 16 px and ``cifar10`` (ResNet-18) for larger ones."""
    if name in BUILTIN:
        return name
    if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
        raise CisError(
            f"data of shape {input_shape} per sample: the built-in models take square images (C, H, W); "
            "pass your own model (--model PATH.py:FACTORY, docs/your-model.md)"
        )
    return "digits" if input_shape[1] <= 16 else "cifar10"


def augment_options(name: str) -> dict[str, int | bool]:
    """Keyword arguments of :func:`augment_batch` suited to dataset ``name``.

    Digits get 1-pixel shifts and no flip (a mirrored digit is another symbol or
    none); CIFAR gets the standard 4-pixel crop and horizontal flip.
    """
    if name == "digits":
        return {"padding": 1, "flip": False}
    if name in ("cifar10", "cifar100", "images"):
        return {"padding": 4, "flip": True}
    raise CisError(
        f"augmentation for dataset {name!r}: crops and flips are for images; expected digits, cifar10, cifar100 "
        "or an image folder (set augment = false)"
    )


def augment_batch(x: torch.Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True) -> torch.Tensor:
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


def digits_table() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 x 64 pixels 0..16, and the labels), read from the file it ships.

    ``sklearn.datasets.load_digits`` reads the same file in 30 ms, but importing sklearn (scipy and more) takes
    about 3 s, paid by every process that trains or exports on digits (a Flower node's first ClientApp too). So
    the file is found without importing the package; its loader is the fallback if the file ever moves.
    """
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as table:
                data = np.loadtxt(table, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    raw = load_digits()
    return raw.data, raw.target.astype(np.int64)


def _load_digits(seed: int, val_size: int | None) -> DataSplits:
    pixels, y = digits_table()
    x = (pixels.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    train_idx, val_idx, test_idx = seeded_split(len(y), seed, val_size, "digits")
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
    elif has_split_layout(root):
        folder = read_image_folder(root, cache, _CIFAR_SIZE, 3)
        train, test = folder.split == 0, folder.split == 2
        train_x, train_y, test_x, test_y = folder.x[train], folder.y[train], folder.x[test], folder.y[test]
        classes = folder.classes
    else:
        sub = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
        raise CisError(
            f"dataset {spec}: no known layout in {root}, expected {sub}/ (python pickles) "
            "or train/<class>/ and test/<class>/ image folders"
        )
    if len(classes) != num_classes:
        raise CisError(f"dataset {spec}: found {len(classes)} classes in {root}, expected {num_classes} for {name}")

    n_val = min(_CIFAR_VAL_SIZE, len(train_y) // 10) if val_size is None else val_size
    check_val_size(spec, n_val, len(train_y))
    train_idx, val_idx = train_val_split(len(train_y), n_val, seed)
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
