"""What ``cis infer`` sends, from files, with the core install only (numpy; no torch).

- ``FILE.npz`` (or ``npz:FILE``): array ``x`` (N, ...), optional labels ``y`` (N,). With
  ``--bundle``, ``x`` has the samples of the bundle's stage 1 input (the manifest's ``inputs``) in any
  dtype it takes: floats are sent in the model's float dtype (the model's input space, normalised like
  the training data: ``np.savez(f, x=splits.test.x, y=splits.test.y)`` writes one), integers (token
  ids) in the model's integer dtype, and uint8 (N, C, H, W) to an image model is raw pixels,
  normalised like images (below). Without ``--bundle``, ``x`` is float (N, C, H, W) images, sent
  as float32.
- an image folder ``DIR`` (or ``images:DIR``): ``DIR/<class>/*.png`` (labels: the class
  folder's name, looked up in the bundle's class list) or ``DIR/*.png`` (no labels).
  Pixels are scaled to 0..1 and normalised with the bundle's mean and std, converted
  to the model's channels (ITU-R 601 luma for one channel, as pillow's ``convert("L")``).
  PNG is decoded by :mod:`cis.png`; JPEG and other formats, interlaced PNGs and
  resizing to the model's input size need pillow (``pip install pillow``).

Raw pixels need the bundle (``--bundle``): its manifest has the normalisation, the
class names and stage 1's input shape.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cis.core.bundle import Bundle, TensorInfo
from cis.core.errors import CisError
from cis.core.extras import installed
from cis.core.png import UnsupportedPng, read_png

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class Inputs:
    """Samples in the model's input space, their labels (or None) and, for images, file names."""

    x: np.ndarray
    y: np.ndarray | None
    names: list[str] | None = None


def is_input_source(source: str) -> bool:
    """Whether ``source`` names arrays or an image folder (else: a built-in data set)."""
    kind, sep, _ = source.partition(":")
    return bool(sep and kind in ("npz", "images")) or source.endswith(".npz") or Path(source).is_dir()


def load_inputs(source: str, bundle: Bundle | None = None, entry: TensorInfo | None = None) -> Inputs:
    """``FILE.npz`` / ``npz:FILE`` or ``DIR`` / ``images:DIR`` (module docstring); ``entry``: stage 1's input as the
    serving node says, for an npz without a bundle."""
    kind, sep, rest = source.partition(":")
    if sep and kind == "npz":
        return load_npz(rest, bundle, entry)
    if sep and kind == "images":
        return load_image_folder(rest, bundle)
    if source.endswith(".npz"):
        return load_npz(source, bundle, entry)
    return load_image_folder(source, bundle)


def needs_entry(source: str) -> bool:
    """Whether ``source`` is an npz whose ``x`` is not float (N, C, H, W) images: without a bundle, its samples go
    as the serving node's stage 1 takes them (the node says: its status reply's ``inputs``)."""
    kind, sep, rest = source.partition(":")
    prefixed = bool(sep) and kind == "npz"
    path = Path(rest if prefixed else source)
    if not (prefixed or source.endswith(".npz")) or not path.is_file():
        return False
    try:
        with np.load(path, allow_pickle=False) as z:
            x = z["x"] if "x" in z.files else None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # EOFError: an empty file
        return False
    return x is not None and not (x.ndim == 4 and np.issubdtype(x.dtype, np.floating))


def load_npz(path: str | Path, bundle: Bundle | None = None, entry: TensorInfo | None = None) -> Inputs:
    path = Path(path)
    if not path.is_file():
        raise CisError(f"{path}: file not found; expected a .npz with array 'x' (N, C, H, W) and optional labels 'y'")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
        raise CisError(f"{path}: cannot read ({exc}); expected a .npz written by numpy.savez") from None
    if "x" not in arrays:
        raise CisError(
            f"{path}: no array 'x' (has {', '.join(sorted(arrays)) or 'nothing'}); expected 'x' (N, C, H, W)"
        )
    x, y = arrays["x"], arrays.get("y")
    if y is not None and (x.ndim < 1 or y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer)):
        raise CisError(f"{path}: 'y' has shape {y.shape} and dtype {y.dtype}; expected {len(x)} integer labels")
    labels = None if y is None else check_labels(y.astype(np.int64), bundle, str(path))
    if bundle is None and entry is None:
        if x.ndim != 4 or not (np.issubdtype(x.dtype, np.floating) or x.dtype == np.uint8):
            raise CisError(
                f"{path}: 'x' has shape {x.shape} and dtype {x.dtype}; without --bundle expected (N, C, H, W) float "
                "images: pass --bundle BUNDLE for the inputs its model takes (any shape and dtype)"
            )
        if x.dtype == np.uint8:
            _need_bundle(bundle, f"{path}: 'x' is uint8 pixels, which")
        return Inputs(np.ascontiguousarray(x, dtype=np.float32), labels)
    return Inputs(entry_array(x, bundle, str(path), entry), labels)


def entry_array(x: np.ndarray, bundle: Bundle | None, where: str, info: TensorInfo | None = None) -> np.ndarray:
    """``x`` as stage 1 takes it (``info``, else the bundle's): its per-sample shape, and its dtype: floats cast to
    the model's float; integers (token ids) to the model's integer dtype when they fit; uint8 (N, C, H, W) pixels
    into a float image model normalised with the bundle's normalisation."""
    info = info or entry_input(_need_bundle(bundle, f"{where}: 'x' and its model"))
    want, sample = np.dtype(info.dtype), tuple(info.shape[1:])
    if x.ndim < 1 or tuple(x.shape[1:]) != sample:
        raise CisError(f"{where}: 'x' has samples of shape {tuple(x.shape[1:])}; the bundle's model takes {sample}")
    if want.kind == "f" and x.dtype == np.uint8 and x.ndim == 4:
        return normalise_pixels(x, _need_bundle(bundle, f"{where}: 'x' is uint8 pixels, which"), where)
    if want.kind == "f" and np.issubdtype(x.dtype, np.floating):
        return np.ascontiguousarray(x, dtype=want)
    if want.kind in "iu" and np.issubdtype(x.dtype, np.integer):
        if x.size and (x.min() < np.iinfo(want).min or x.max() > np.iinfo(want).max):
            raise CisError(f"{where}: 'x' holds values outside {want}'s range; the bundle's model takes {want}")
        check_ids(x, index_range(bundle, info.name) if bundle is not None else False, where)
        return np.ascontiguousarray(x, dtype=want)
    kind = "uint8 pixels or floats" if want.kind == "f" else "integers (e.g. token ids)"
    raise CisError(f"{where}: 'x' has dtype {x.dtype}; the bundle's model takes {want} ({kind})")


def index_range(bundle: Bundle, name: str) -> list[int] | None | bool:
    """The ids request tensor ``name`` takes, as the manifest's ``inputs`` record them (``index_range`` [low, high]:
    ids low..high-1, the model's input embedding's rows); None where the bundle says none applies (no embedding
    reads the input as it is), False where it does not say (a bundle written before the range was recorded)."""
    entry = next((t for t in bundle.manifest.get("inputs") or [] if t.get("name") == name), None)
    if entry is None or "index_range" not in entry:
        return False
    return entry["index_range"]


def check_ids(x: np.ndarray, ids: list[int] | None | bool, where: str) -> None:
    """Integer inputs (token ids) within the range the bundle records (``ids``: [low, high], None: any value, False:
    not recorded, then ids are 0 or more: onnxruntime's Gather reads a negative id from the end of the table,
    a silently wrong answer); one line naming the file, the sample and the value."""
    if ids is None or not x.size:
        return
    low, high = (int(ids[0]), int(ids[1])) if isinstance(ids, list) else (0, None)
    flat = x.reshape(len(x), -1)
    bad = (flat < low) | (flat >= high) if high is not None else flat < low
    if not bad.any():
        return
    i, j = (int(v) for v in np.argwhere(bad)[0])
    takes = (f"the bundle's model takes token ids {low}..{high - 1} (its input embedding's rows: the manifest's "
             "inputs index_range)" if high is not None else
             "token ids are 0 or more (the model's embedding would read a negative id from the end of its table)")
    raise CisError(f"{where}: sample {i} holds {int(flat[i, j])} at position {j} of x; {takes}")


def check_labels(y: np.ndarray, bundle: Bundle | None, where: str) -> np.ndarray:
    """Labels ``y`` as class indices of the bundle (0..K-1, K its class names; without a bundle, 0 or more): one
    line naming the file and the labels outside that range, which no answer could match (an accuracy of them would
    say nothing about the model)."""
    classes = (bundle.manifest.get("classes") or []) if bundle is not None else []
    bad = (y < 0) | (y >= len(classes)) if classes else y < 0
    if bad.any():
        values = sorted(set(y[bad].tolist()))
        shown = ", ".join(map(str, values[:5])) + (f" and {len(values) - 5} more" if len(values) > 5 else "")
        expected = (f"the bundle's {len(classes)} classes, 0..{len(classes) - 1} in its class order" if classes
                    else "class indices 0 or more")
        first = int(np.argmax(bad))
        raise CisError(f"{where}: 'y' holds labels {shown} (first at sample {first}); expected {expected}")
    return y


def entry_input(bundle: Bundle) -> TensorInfo:
    """Stage 1's input (what a request carries)."""
    info = next((t for t in bundle.stage(1).inputs if t.name == "input"), None)
    if info is None or any(not isinstance(d, int) for d in info.shape[1:]):
        raise CisError(f"{bundle.root}: stage 1 has no static input 'input'; expected one written by cis export")
    return info


def load_image_folder(path: str | Path, bundle: Bundle | None = None) -> Inputs:
    root = Path(path)
    if not root.is_dir():
        raise CisError(f"{root}: not a folder; expected FILE.npz or an image folder DIR/<class>/*.png")
    bundle = _need_bundle(bundle, f"{root}: images")
    files = _images(root)
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and _images(p))
    if files and class_dirs:
        raise CisError(f"{root}: holds both images and class folders ({class_dirs[0].name}/); expected one layout")
    y = None
    if class_dirs:
        classes = [str(c) for c in bundle.manifest.get("classes", [])]
        unknown = [d.name for d in class_dirs if d.name not in classes]
        if unknown:
            raise CisError(
                f"{root}: class folder {unknown[0]!r} is not a class of the bundle; "
                f"expected one of {', '.join(classes)}"
            )
        labelled = [(f, classes.index(d.name)) for d in class_dirs for f in _images(d)]
        files, y = [f for f, _ in labelled], np.array([lab for _, lab in labelled], np.int64)
    if not files:
        raise CisError(f"{root}: no images; expected {', '.join(IMAGE_SUFFIXES)} files in it or in class folders")
    _, channels, height, width = _input_shape(bundle)
    pixels = np.stack([_fit(decode_image(f), channels, height, width, f) for f in files])
    x = normalise_pixels(pixels.transpose(0, 3, 1, 2), bundle, str(root))
    return Inputs(x, y, [str(f.relative_to(root)) for f in files])


def normalise_pixels(pixels: np.ndarray, bundle: Bundle, where: str) -> np.ndarray:
    """uint8 (N, C, H, W) -> float32 (x / 255 - mean) / std with the bundle's normalisation."""
    norm = bundle.manifest.get("normalisation") or {}
    if not norm.get("mean") or not norm.get("std"):  # null (or []): data used as given
        raise CisError(f"{where}: raw uint8 pixels, but the bundle {bundle.root} has no pixel normalisation (its "
                       "model was trained on arrays used as given), so they cannot be converted; expected float32 "
                       "input, as the model was trained on")
    mean = np.asarray(norm["mean"], np.float32)
    std = np.asarray(norm["std"], np.float32)
    channels = pixels.shape[1]
    if mean.shape != (channels,) or std.shape != (channels,):
        raise CisError(
            f"{where}: {channels} channels, but the bundle's normalisation has "
            f"mean {norm.get('mean')} std {norm.get('std')}"
        )
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
        raise CisError(f"{where}: the bundle {bundle.root}'s normalisation has mean {norm['mean']} std {norm['std']}; "
                       "expected finite numbers, std > 0 (pixels are divided by it)")
    return ((pixels.astype(np.float32) / 255.0 - mean[None, :, None, None]) / std[None, :, None, None]).astype(
        np.float32
    )


def decode_image(path: Path) -> np.ndarray:
    """uint8 (H, W, 1 or 3): PNG with the core decoder, anything else (or interlaced PNG) with pillow."""
    if path.suffix.lower() == ".png":
        try:
            return read_png(path)
        except UnsupportedPng as exc:
            if not installed("PIL"):
                raise CisError(f"{exc}: needs pillow (pip install pillow)") from None
    elif not installed("PIL"):
        raise CisError(
            f"image {path}: decoding {path.suffix} needs pillow (pip install pillow); PNG needs nothing more"
        )
    return _pillow_decode(path)


def _pillow_decode(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            grey = img.mode in ("1", "L", "LA", "I", "I;16", "F")
            arr = np.asarray(img.convert("L" if grey else "RGB"))
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise CisError(f"image {path}: cannot be decoded ({exc})") from None
    return arr[:, :, None] if arr.ndim == 2 else arr


def _fit(img: np.ndarray, channels: int, height: int, width: int, path: Path) -> np.ndarray:
    """The image with the model's channels and size (resizing needs pillow: bilinear, as the training loader)."""
    if img.shape[2] != channels:
        if channels == 1:  # ITU-R 601-2 luma, pillow's integer form
            rgb = img.astype(np.uint32)
            img = ((rgb[:, :, 0] * 19595 + rgb[:, :, 1] * 38470 + rgb[:, :, 2] * 7471 + 0x8000) >> 16).astype(np.uint8)[
                :, :, None
            ]
        elif channels == 3 and img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        else:
            raise CisError(f"image {path}: {img.shape[2]} channels; the model takes {channels}")
    if img.shape[:2] != (height, width):
        if not installed("PIL"):
            raise CisError(
                f"image {path}: {img.shape[1]}x{img.shape[0]}; the model takes {width}x{height}: "
                "resize it, or install pillow (pip install pillow) to resize on load"
            )
        from PIL import Image

        mode = "L" if channels == 1 else "RGB"
        picture = Image.fromarray(img[:, :, 0] if channels == 1 else img, mode)
        img = np.asarray(picture.resize((width, height), Image.Resampling.BILINEAR))
        img = img[:, :, None] if img.ndim == 2 else img
    return img


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _input_shape(bundle: Bundle) -> tuple:
    shape = entry_input(bundle).shape
    if len(shape) != 4:
        raise CisError(f"{bundle.root}: stage 1 input shape {shape}; expected (N, C, H, W) images")
    return tuple(shape)


def _need_bundle(bundle: Bundle | None, what: str) -> Bundle:
    if bundle is None:
        raise CisError(f"{what} need the model's normalisation and input size: pass --bundle BUNDLE")
    return bundle
