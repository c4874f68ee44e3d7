"""The user's data: a ``.npz`` file, an image folder, a saved Hugging Face dataset, or a Python factory.

Each reader returns a :class:`cis.training.data.dataset.Table` (x, y, and where the source has them class names,
a ``node`` and a ``split`` per sample); :func:`cis.training.data.dataset.make_splits` checks it and splits it.

- ``PATH.npz``: arrays ``x`` and ``y``; optional ``node`` (a node per sample: its index in the spec's node
  order, or its id), ``split`` (``train``/``val``/``test`` strings, or 0/1/2) and ``classes`` (names in label
  order). Loaded with ``allow_pickle=False``.
- ``DIR``: an image folder (cis/training/data/images.py); ``DIR/{train,test}[,val]/`` gives the splits.
- ``hf:DIR``: ``datasets.load_from_disk(DIR)`` (the ``hf`` extra): a Dataset, or a DatasetDict whose
  ``train``, ``validation``/``val`` and ``test`` members are the splits. y is the ``label`` (else ``labels``)
  column, x the first other column that holds arrays or images; ``hf:DIR?x=COL,y=COL`` names them. Columns
  ``node`` and ``split`` are read as in an npz; a ClassLabel's names are the classes.
- ``PATH.py:FACTORY`` / ``pkg.module:FACTORY``: called with no arguments; returns a map-style dataset
  (``len(ds)`` and ``ds[i] -> (x, y)``, e.g. a ``torch.utils.data.Dataset``), a ``(train, val, test)``
  tuple of them, or a dict with ``train``, ``test`` and optionally ``val``/``validation``. Samples are
  read once into arrays; a dataset's ``classes`` attribute (torchvision's) names the classes.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import CisError, error_line
from cis.core.extras import require
from cis.core.user_code import call
from cis.training.data.data_ref import DataRef
from cis.training.data.dataset import SPLITS, DataSplits, Table, make_splits
from cis.training.data.images import read_image_folder

NPZ_KEYS = ("x", "y", "node", "split", "classes")
HF_LABELS = ("label", "labels")
_VAL_NAMES = ("val", "validation")


def load_user_data(ref: DataRef, seed: int, val_size: int | None, cache: bool = True,
                   num_classes: int | None = None) -> DataSplits:
    """The train/val/test splits of a user data reference (kind npz, images, hf or factory); ``num_classes``:
    the class count a spec states, for data that names no classes (:func:`make_splits`)."""
    readers = {"npz": read_npz, "images": lambda r: read_images(r, cache), "hf": read_hf, "factory": read_factory}
    table = readers[ref.kind](ref)
    return make_splits(table, ref.text, ref.kind, seed, val_size, num_classes)


def read_npz(ref: DataRef) -> Table:
    path = _existing(ref)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CisError(f"data {path}: not an npz archive ({exc}); expected np.savez(x=..., y=...)") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise CisError(f"data {path}: no array {missing[0]!r} (has {sorted(arrays)}); expected arrays x and y")
    unknown = sorted(set(arrays) - set(NPZ_KEYS))
    if unknown:
        raise CisError(f"data {path}: unknown array {unknown[0]!r}; expected only {', '.join(NPZ_KEYS)}")
    classes = arrays.get("classes")
    return Table(
        arrays["x"], arrays["y"], None if classes is None else [str(c) for c in classes.tolist()],
        arrays.get("node"), arrays.get("split"),
    )


def read_images(ref: DataRef, cache: bool = True) -> Table:
    folder = read_image_folder(_existing(ref), cache)
    split = None if (folder.split < 0).all() else folder.split
    return Table(folder.x, folder.y, folder.classes, None, split, pixels=True)


def read_hf(ref: DataRef) -> Table:
    path = _existing(ref)
    require("hf", f"data {ref.text!r}")
    import datasets  # the 'hf' extra
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001  the library's own errors for a folder it cannot read
        raise CisError(
            f"data {ref.text}: {path} is not a saved dataset ({type(exc).__name__}: {exc}); "
            "expected a folder written by datasets.Dataset.save_to_disk"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        parts = _named_parts(dict(loaded), ref.text, "DatasetDict")
        return _concat([None if d is None else _hf_table(d, ref, part) for d, part in zip(parts, SPLITS)], ref.text)
    return _hf_table(loaded, ref)


def _hf_table(ds: Any, ref: DataRef, part: str = "") -> Table:
    names = list(ds.column_names)
    for axis in ("x", "y"):
        if ref.options.get(axis) and ref.options[axis] not in names:
            raise CisError(f"data {ref.text}: no column {ref.options[axis]!r} for {axis} (columns {names}); "
                           f"expected ?{axis}= one of them")  # fmt: skip
    y_col = ref.options.get("y") or next((c for c in HF_LABELS if c in names), None)
    if y_col is None:
        raise CisError(f"data {ref.text}: no label column (columns {names}); expected 'label' or 'labels', or ?y=COL")
    x_col = ref.options.get("x") or next(
        (c for c in names if c not in (y_col, "node", "split") and _array_like(ds.features[c])), None
    )
    if x_col is None:
        raise CisError(f"data {ref.text}: no column of arrays or images for x (columns {names}); expected ?x=COL")
    image = type(ds.features[x_col]).__name__ == "Image"
    x = _hf_images(ds[x_col], ref.text) if image else _hf_arrays(ds.with_format("numpy")[x_col], x_col, ref.text, part)
    label = ds.features[y_col]
    classes = list(label.names) if hasattr(label, "names") else None
    extra = {c: np.asarray(ds[c]) if c in names else None for c in ("node", "split")}
    return Table(x, np.asarray(ds[y_col]), classes, extra["node"], extra["split"], pixels=image)


def _array_like(feature: Any) -> bool:
    kind = type(feature).__name__
    return kind in ("Image", "Sequence", "List", "LargeList", "Array2D", "Array3D", "Array4D", "Array5D") or (
        kind == "Value" and str(getattr(feature, "dtype", "")).startswith(("float", "int", "uint", "bool"))
    )


def _hf_arrays(column: Any, name: str, where: str, part: str) -> np.ndarray:
    """A column of arrays as one array (N, ...); one line naming two rows whose lengths differ (ragged sequences)."""
    try:
        x = np.asarray(column)
    except ValueError:
        x = np.empty(0, object)
    if x.dtype != object:
        return x
    rows = list(column)
    shapes = [np.shape(np.asarray(r, dtype=object)) for r in rows]
    i = next((i for i, s in enumerate(shapes) if s != shapes[0]), 0)
    if not i:
        return np.asarray(rows, dtype=object)  # one shape, not numbers: the checks name the dtype
    label = (part + " sample") if part else "sample"
    lengths = len(shapes[0]) == len(shapes[i]) == 1  # sequences: say their lengths
    what, first, other = ("length", shapes[0][0], shapes[i][0]) if lengths else ("shape", shapes[0], shapes[i])
    raise CisError(
        f"data {where}: column {name!r} holds rows of different lengths ({label} 0 has {what} {first}, {label} {i} "
        f"has {what} {other}); expected rows of one length (pad the sequences to one length)"
    )


def _hf_images(images: Sequence[Any], where: str) -> np.ndarray:
    """PIL images of one size -> uint8 (N, C, H, W); RGB unless every image is greyscale."""
    grey = all(img.mode in ("1", "L", "I", "I;16", "F") for img in images)
    arrays = [np.asarray(img.convert("L" if grey else "RGB")) for img in images]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise CisError(f"data {where}: images of {len(shapes)} sizes {sorted(shapes)[:2]}...; expected one size")
    x = np.stack(arrays)
    return x[:, None] if grey else x.transpose(0, 3, 1, 2)


def read_factory(ref: DataRef) -> Table:
    assert ref.factory is not None
    made = call(ref.factory, f"--data {ref.text}")
    if isinstance(made, dict):
        parts = _named_parts(made, ref.text, "dict")
    elif isinstance(made, tuple) and len(made) == 3 and all(_map_style(d) and not isinstance(d, tuple) for d in made):
        parts = [made[0], made[1], made[2]]
    elif _map_style(made):
        return materialise(made, ref.text, "")
    else:
        raise CisError(
            f"data {ref.text}: the factory returned a {type(made).__name__}; expected a map-style dataset "
            "(len(ds) and ds[i] -> (x, y)), a (train, val, test) tuple of them or a dict with train, val, test"
        )
    return _concat([None if d is None else materialise(d, ref.text, part) for d, part in zip(parts, SPLITS)],
                   ref.text)


def _named_parts(parts: dict[str, Any], where: str, what: str) -> list[Any]:
    """[train, val or None, test] from a dict (or DatasetDict) keyed train, val/validation, test."""
    val_key = next((k for k in _VAL_NAMES if k in parts), None)
    unknown = sorted(set(parts) - {"train", "test", *_VAL_NAMES})
    if "train" not in parts or "test" not in parts or unknown:
        raise CisError(
            f"data {where}: a {what} with keys {sorted(parts)}; expected train, test and optionally val (or validation)"
        )
    return [parts["train"], parts[val_key] if val_key else None, parts["test"]]


def _map_style(ds: Any) -> bool:
    return hasattr(ds, "__len__") and hasattr(ds, "__getitem__") and not isinstance(ds, (str, bytes, dict))


def materialise(ds: Any, where: str, part: str) -> Table:
    """Read every ``ds[i] -> (x, y)`` into arrays (tensors become numpy arrays); one line naming the first sample
    that is not a pair, whose x differs in shape or kind of dtype from the first sample's, or whose label is not
    one integer. ``part``: the split these samples are (``train``, ...), or "" for the one dataset."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    name = (part + " sample") if part else "sample"
    for i in range(_length(ds, where, part)):
        item = _item(ds, i, where, name)
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise CisError(f"data {where}: {name} {i} is a {type(item).__name__}; expected a pair (x, y)")
        x, y = np.asarray(item[0]), np.asarray(item[1])
        if xs and (x.shape != xs[0].shape or _kind(x) != _kind(xs[0])):
            raise CisError(
                f"data {where}: {name} {i}'s x is {_described(x)}, {name} 0's {_described(xs[0])}; expected one "
                "shape and dtype"
            )
        if y.shape != () or _kind(y) != "integer":
            raise CisError(
                f"data {where}: {name} {i}'s label is {_described(y)} ({_shown(y)}); expected one integer class label"
            )
        xs.append(x)
        ys.append(y)
    if not xs:
        raise CisError(f"data {where}: an empty dataset; expected samples (x, y)")
    classes = getattr(ds, "classes", None)
    return Table(np.stack(xs), np.stack(ys), [str(c) for c in classes] if isinstance(classes, list) else None)


def _length(ds: Any, where: str, part: str) -> int:
    """``len(ds)``; what the user's ``__len__`` raises is one line."""
    try:
        return int(len(ds))
    except Exception as exc:  # noqa: BLE001  the user's code
        dataset = f"the {part} dataset" if part else "the dataset"
        raise CisError(f"data {where}: len() of {dataset} raised {error_line(exc)}; expected its number of "
                       "samples") from None  # fmt: skip


def _item(ds: Any, i: int, where: str, name: str) -> Any:
    """``ds[i]``; what the user's ``__getitem__`` raises is one line naming the sample."""
    try:
        return ds[i]
    except Exception as exc:  # noqa: BLE001  the user's code
        raise CisError(f"data {where}: reading {name} {i} (ds[{i}]) raised {error_line(exc)}; expected a pair "
                       "(x, y) for every index 0..len(ds)-1") from None  # fmt: skip


def _kind(a: np.ndarray) -> str:
    return "integer" if a.dtype.kind in "iub" else "float" if a.dtype.kind == "f" else str(a.dtype)


def _described(a: np.ndarray) -> str:
    return f"{a.dtype} {tuple(a.shape)}"


def _shown(a: np.ndarray) -> str:
    return repr(a.item()) if a.size == 1 else f"{a.size} values"


def _concat(parts: list[Table | None], where: str) -> Table:
    """One table from [train, val or None, test], its split column saying which was which."""
    tables = [(code, t) for code, t in enumerate(parts) if t is not None]
    shapes = {t.x.shape[1:] for _, t in tables}
    if len(shapes) != 1:
        raise CisError(f"data {where}: the splits hold samples of shapes {sorted(shapes)}; expected one shape")
    split = np.concatenate([np.full(len(t.y), code, np.int64) for code, t in tables])
    train = tables[0][1]
    node = None  # only the training samples are partitioned: the others get -1
    if train.node is not None:
        node = np.concatenate([np.asarray(train.node), np.full(len(split) - len(train.y), -1)])
    starts = np.cumsum([0] + [len(t.y) for _, t in tables])[:-1]
    return Table(
        np.concatenate([t.x for _, t in tables]),
        np.concatenate([np.asarray(t.y) for _, t in tables]),
        tables[0][1].classes,
        node,
        split,
        pixels=tables[0][1].pixels,
        origin=tuple((SPLITS[code], int(start)) for (code, _), start in zip(tables, starts)),
    )


def _existing(ref: DataRef) -> Path:
    assert ref.path is not None
    if not ref.path.exists():
        what = "an npz file" if ref.kind == "npz" else "a folder"
        raise CisError(f"data {ref.text}: {ref.path} not found; expected {what}")
    return ref.path

