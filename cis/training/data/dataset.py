"""A data set as the trainer holds it, and the checks and splits every reader shares (torch-free).

Every source (the built-in readers in cis/training/data/loading.py, the user's in cis/training/data/sources.py) ends
in :func:`make_splits`: arrays ``x`` (any shape, one row per sample), integer labels ``y`` and,
optionally, a ``node`` and a ``split`` per sample, checked once here:

- ``x`` and ``y`` (and ``node``, ``split``) have one entry per sample;
- ``y`` holds integers (an integer dtype: float labels, even integer-valued ones, are a mistake) in
  0..K-1, K >= 2: the number of class names where the data names them, else the spec's ``classes``
  where ``cis train --spec`` gives one, else max(y) + 1; with K guessed from the largest label, a
  class no sample has is a mistake too (a stray label 9 among 0..2, or labels 0 and 2 only); with K
  stated, a class without samples is logged as a warning, but samples of at least two classes must be there;
- ``x`` holds numbers with no NaN or inf; floats become float32, integers and booleans int64
  (token ids, for instance);

A fault names the first sample that has it, as the user knows the sample: ``sample 17`` (its row in the
npz, or in the one dataset a factory returned) or ``train sample 5`` (the fifth of the train part of a
factory's or a Hugging Face dataset's splits). Every :class:`Dataset` keeps each sample's row, so a
check after the split (a token id outside the model's embedding: cis/training/models/contract.py
``input_index_range``, checked in cis/training/run.py) names it the same way.
- ``split``: ``train``/``val``/``test`` as strings, or 0/1/2; with it the splits are as given (a
  missing val split is carved from train with ``val_size``); without it a seeded 70/10/20 split.

Images decoded from files (``pixels``) are normalised with the training split's per-channel mean
and std (recorded, so ``cis infer`` can send raw images); other arrays are used as given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cis.core.errors import CisError

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")  # a split column's values: these strings, or their index 0, 1, 2
Origin = tuple[tuple[str, int], ...]
"""Where the rows of a table came from: (part name, first row) per part of a factory's or a Hugging Face
dataset's splits, in row order; () for one array or dataset (row i is "sample i")."""


def sample_name(origin: Origin, row: int) -> str:
    """A sample as the user knows it: ``sample 17``, or ``train sample 5`` in a table of named parts."""
    part = next(((name, start) for name, start in reversed(origin) if start <= row), None)
    return f"sample {row}" if part is None else f"{part[0]} sample {row - part[1]}"


@dataclass
class Dataset:
    """Samples ``x`` (N, ...) float32 or int64, labels ``y`` (N,) int64 and, from the data, a ``node`` per sample.

    ``mean``/``std``: the per-channel normalisation applied to pixels (None: ``x`` is used as given).
    """

    x: np.ndarray
    y: np.ndarray
    classes: list[str]
    mean: list[float] | None
    std: list[float] | None
    name: str
    node: np.ndarray | None = field(default=None)
    rows: np.ndarray | None = field(default=None)  # each sample's row in the data as read (None: its position)
    origin: Origin = ()

    def __len__(self) -> int:
        return len(self.y)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: (C, H, W) for images, (C, L) for sequences, (L,) for token ids."""
        return tuple(self.x.shape[1:])

    def subset(self, indices: np.ndarray) -> Dataset:
        """The samples at ``indices`` (e.g. one node's partition), same metadata."""
        node = None if self.node is None else self.node[indices]
        rows = np.asarray(indices) if self.rows is None else self.rows[indices]
        return Dataset(self.x[indices], self.y[indices], self.classes, self.mean, self.std, self.name, node, rows,
                       self.origin)

    def sample_name(self, i: int) -> str:
        """Sample ``i`` of this split as the user knows it (:func:`sample_name`)."""
        return sample_name(self.origin, i if self.rows is None else int(self.rows[i]))


@dataclass
class DataSplits:
    """Train, validation (held out of the training set) and test sets of one dataset, and the data's sha256."""

    train: Dataset
    val: Dataset
    test: Dataset
    sha256: str | None = None


@dataclass
class Table:
    """What a reader found, before the checks: one row per sample."""

    x: np.ndarray
    y: np.ndarray
    classes: list[str] | None = None
    node: np.ndarray | None = None
    split: np.ndarray | None = None
    pixels: bool = False  # uint8 images decoded from files: normalised per channel
    origin: Origin = ()


def seeded_split(n: int, seed: int, val_size: int | None, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) sorted indices: 20 % test, 10 % validation (or ``val_size``), the rest train."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = round(0.2 * n)
    n_val = round(0.1 * n) if val_size is None else val_size
    check_val_size(where, n_val, n - n_test)
    return (
        np.sort(order[n_test + n_val :]),
        np.sort(order[n_test : n_test + n_val]),
        np.sort(order[:n_test]),
    )


def train_val_split(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded (train, val) split of range(n), ``val_size`` held out."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[val_size:]), np.sort(order[:val_size])


def check_val_size(where: str, val_size: int, n_train: int) -> None:
    if isinstance(val_size, bool) or not isinstance(val_size, int) or not 0 <= val_size < n_train:
        raise CisError(f"dataset {where}: val_size is {val_size!r}, expected an integer in 0..{n_train - 1}")


def make_splits(table: Table, where: str, name: str, seed: int, val_size: int | None,
                num_classes: int | None = None) -> DataSplits:
    """Check ``table`` (one line at the first fault) and split it into train/val/test :class:`Dataset` s.
    ``num_classes``: the count the spec states (``cis train --spec``), for data that names no classes."""
    x, y = checked_x(table.x, where, table.origin), checked_labels(table.y, len(table.x), where, table.origin)
    classes = class_names(table.classes, y, where, table.origin, num_classes)
    for column in ("node", "split"):
        values = getattr(table, column)
        if values is not None and len(values) != len(x):
            raise CisError(f"data {where}: {column} has {len(values)} entries, x {len(x)}; expected one per sample")
    if table.split is None:
        train_idx, val_idx, test_idx = seeded_split(len(y), seed, val_size, where)
    else:
        train_idx, val_idx, test_idx = _column_split(split_codes(table.split, where), seed, val_size, where)
    mean: list[float] | None = None
    std: list[float] | None = None
    if table.pixels:
        x, mean, std = normalise_pixels(x, train_idx)

    def part(idx: np.ndarray) -> Dataset:
        node = None if table.node is None else np.asarray(table.node)[idx]
        return Dataset(x[idx], y[idx], classes, mean, std, name, node, idx, table.origin)

    return DataSplits(part(train_idx), part(val_idx), part(test_idx))


def checked_x(x: np.ndarray, where: str, origin: Origin = ()) -> np.ndarray:
    """``x`` as float32 (floats) or int64 (integers, booleans); one line for non-numbers, NaN or inf."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise CisError(f"data {where}: x has shape {x.shape}; expected one row per sample, (N, ...) with N >= 1")
    if not len(x):
        raise CisError(f"data {where}: x has no samples (shape {x.shape}); expected one row per sample, (N, ...) "
                       "with N >= 1")  # fmt: skip
    if np.issubdtype(x.dtype, np.floating):
        bad = ~np.isfinite(x)
        if bad.any():
            first = sample_name(origin, int(np.argwhere(bad.reshape(len(x), -1))[0][0]))
            raise CisError(f"data {where}: x holds NaN or inf (first at {first}); expected finite numbers")
        return x.astype(np.float32, copy=False)
    if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
        return x.astype(np.int64, copy=False)
    raise CisError(f"data {where}: x has dtype {x.dtype}; expected numbers (floats, or integers such as token ids)")


def checked_labels(y: np.ndarray, n: int, where: str, origin: Origin = ()) -> np.ndarray:
    """``y`` as int64 labels >= 0, one per sample, of an integer dtype."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise CisError(f"data {where}: y has shape {y.shape} and x {n} samples; expected one label per sample")
    if not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        first = f" ({sample_name(origin, 0)}'s label is {y[0].item()!r})" if len(y) and y.dtype.kind in "fc" else ""
        raise CisError(
            f"data {where}: y has dtype {y.dtype}{first}; expected integer class labels 0..K-1 "
            "(y.astype(int) where the values are classes)"
        )
    y = y.astype(np.int64)
    if len(y) and y.min() < 0:
        i = int(np.argmax(y < 0))
        raise CisError(f"data {where}: {sample_name(origin, i)} has label {int(y[i])}; expected class labels 0..K-1")
    return y


def class_names(names: list[str] | None, y: np.ndarray, where: str, origin: Origin = (),
                stated: int | None = None) -> list[str]:
    """The class names: the data's, else "0".."K-1" with K the spec's ``stated`` count, else max label + 1
    (the module doc's rules); one line for a label outside them, or a class the guessed K has no sample of."""
    said = f"the data's {len(names)} class names" if names is not None else None
    if said is None and stated is not None:
        said = f"the spec's classes = {stated}"
    k = len(names) if names is not None else stated if stated is not None else (int(y.max()) + 1 if len(y) else 0)
    if len(y) and int(y.max()) >= k:
        i = int(np.argmax(y >= k))
        raise CisError(
            f"data {where}: {sample_name(origin, i)} has label {int(y[i])}; expected labels 0..{k - 1} ({said})"
        )
    if k < 2:
        raise CisError(f"data {where}: {k} class; expected at least 2 classes")
    check_classes_present(y, where, said)
    absent = np.flatnonzero(np.bincount(y, minlength=k) == 0).tolist()
    if absent and said is None:  # K guessed from the largest label, and labels below it unused
        last = int(np.argmax(y == k - 1))
        raise CisError(
            f"data {where}: no sample has label {listed(absent)}, yet {sample_name(origin, last)} has label "
            f"{k - 1} (so {k} classes); expected labels 0..K-1 with a sample of each, or K said: class names (an "
            "npz 'classes' array) or a spec's [cis] classes"
        )
    if absent:
        logger.warning("data %s: no sample has label %s of the %d classes (%s)", where, listed(absent), k, said)
    return [str(c) for c in names] if names is not None else [str(c) for c in range(k)]


def check_classes_present(y: np.ndarray, where: str, said: str | None = None) -> None:
    """One line unless samples of at least two classes are present (whatever K the names or a spec state)."""
    present = np.unique(y).tolist()
    if len(present) < 2:
        stated = f" of {said}" if said else ""
        raise CisError(f"data {where}: every sample has label {present[0]} (1 class present{stated}); expected "
                       "samples of at least 2 classes")  # fmt: skip


def listed(values: Sequence[object], most: int = 6) -> str:
    """Up to ``most`` values, comma-separated, and how many more."""
    shown = ", ".join(str(v) for v in values[:most])
    return shown + (f" (and {len(values) - most} more)" if len(values) > most else "")


def check_index_range(data: Dataset, high: int, what: str, where: str) -> None:
    """Every integer of ``data.x`` in 0..high-1 (``what`` declares the range, e.g. a model's embedding); one line
    naming the first sample outside it."""
    if not len(data) or data.x.dtype.kind not in "iub":
        return
    flat = data.x.reshape(len(data), -1)
    bad = (flat < 0) | (flat >= high)
    if not bad.any():
        return
    i, j = (int(v) for v in np.argwhere(bad)[0])
    raise CisError(
        f"data {where}: {data.sample_name(i)} holds {int(flat[i, j])} at position {j} of x; {what} takes "
        f"0..{high - 1}"
    )


def split_codes(split: np.ndarray, where: str) -> np.ndarray:
    """A split column as codes 0 (train), 1 (val), 2 (test); one line for any other value."""
    split = np.asarray(split)
    if split.dtype.kind in "USO":
        values = np.array([s.decode() if isinstance(s, bytes) else str(s) for s in split.tolist()])
        unknown = sorted(set(values.tolist()) - set(SPLITS))
        if unknown:
            raise CisError(f"data {where}: split value {unknown[0]!r}; expected train, val or test (or 0, 1, 2)")
        return np.array([SPLITS.index(v) for v in values.tolist()], np.int64)
    if np.issubdtype(split.dtype, np.integer):
        unknown = sorted(set(split.tolist()) - {0, 1, 2})
        if unknown:
            raise CisError(f"data {where}: split value {unknown[0]!r}; expected 0 (train), 1 (val) or 2 (test)")
        return split.astype(np.int64)
    raise CisError(f"data {where}: split has dtype {split.dtype}; expected train/val/test strings or 0/1/2")


def _column_split(
    codes: np.ndarray, seed: int, val_size: int | None, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    train, val, test = (np.flatnonzero(codes == k) for k in range(3))
    if not len(train) or not len(test):
        missing = "train" if not len(train) else "test"
        raise CisError(f"data {where}: the split column names no {missing} sample; expected train and test samples")
    if len(val):
        return train, val, test
    n_val = (max(1, len(train) // 10) if len(train) > 1 else 0) if val_size is None else val_size
    check_val_size(where, n_val, len(train))
    keep, held = train_val_split(len(train), n_val, seed)
    return train[keep], train[held], test


def normalise_pixels(x: np.ndarray, train_idx: np.ndarray) -> tuple[np.ndarray, list[float], list[float]]:
    """uint8-valued images (N, C, H, W) -> float32 (x / 255 - mean) / std, per channel from the training split."""
    x01 = x.astype(np.float32) / 255.0
    ref = x01[train_idx] if len(train_idx) else x01
    mean = ref.mean(axis=(0, 2, 3))
    std = np.maximum(ref.std(axis=(0, 2, 3)), 1e-6)
    out = (x01 - mean[None, :, None, None]) / std[None, :, None, None]
    return out.astype(np.float32), [float(m) for m in mean], [float(s) for s in std]
