"""What ``cis train --data REF`` names, parsed without torch (the CLI and the run config read it).

    digits                     scikit-learn's bundled 8x8 digits
    cifar10:PATH | cifar100:PATH   a local CIFAR copy (cis/training/data/loading.py)
    PATH.npz                   arrays x, y; optional node, split, classes (cis/training/data/sources.py)
    DIR                        an image folder DIR/<class>/*, or DIR/{train,test}[,val]/<class>/*
    hf:DIR[?x=COL,y=COL]       a saved Hugging Face dataset (datasets.Dataset.save_to_disk)
    PATH.py:NAME | pkg.module:NAME   a factory returning a map-style torch Dataset, or train/val/test datasets

A run records the reference with its paths made absolute (:func:`absolute_ref`) and the sha256 of
the data it names (:func:`data_sha256`), so ``cis evaluate``, ``cis export`` and ``--resume`` rebuild
the same data and say in one line when it changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cis.core.errors import CisError
from cis.core.user_code import Reference, is_reference, parse_reference, sha256_of, source_sha256

BUILTIN = ("digits", "cifar10", "cifar100")
USER_KINDS = ("npz", "images", "hf", "factory")
EXPECTED = (
    "digits, cifar10:PATH, cifar100:PATH, PATH.npz, an image folder DIR, hf:DIR or PATH.py:FACTORY | "
    "pkg.module:FACTORY"
)
HF_OPTIONS = ("x", "y")  # hf:DIR?x=COL,y=COL: the columns read as x and y


@dataclass(frozen=True)
class DataRef:
    """A parsed data reference: its ``kind`` (a built-in name or one of :data:`USER_KINDS`) and what it points to."""

    text: str
    kind: str
    path: Path | None = None  # the file or folder (npz, images, hf, cifar*)
    factory: Reference | None = None
    options: dict[str, str] = field(default_factory=dict)  # hf's column overrides


def parse_data_ref(text: str, what: str = "--data") -> DataRef:
    """``text`` as a :class:`DataRef`; one line naming what was expected when it names nothing known."""
    text = str(text)
    name, sep, rest = text.partition(":")
    if text == "digits":
        return DataRef(text, "digits")
    if name == "digits":
        raise CisError(f"{what} {text!r}: unknown dataset; 'digits' takes no path, expected 'digits'")
    if name in ("cifar10", "cifar100"):
        if not rest:
            raise CisError(f"{what} {text!r}: missing folder, expected '{name}:PATH'")
        return DataRef(text, name, Path(rest).expanduser())
    if name == "hf" and sep:
        folder, _, query = rest.partition("?")
        if not folder:
            raise CisError(f"{what} {text!r}: missing folder, expected 'hf:DIR' (a datasets.save_to_disk folder)")
        return DataRef(text, "hf", Path(folder).expanduser(), options=_hf_options(text, query, what))
    if is_reference(text) and not Path(text).exists():
        return DataRef(text, "factory", factory=parse_reference(text, what))
    path = Path(text).expanduser()
    if path.suffix == ".npz":
        return DataRef(text, "npz", path)
    if path.is_dir():
        return DataRef(text, "images", path)
    if path.exists():
        raise CisError(f"{what} {text!r}: a {path.suffix or 'suffix-less'} file; expected {EXPECTED}")
    raise CisError(f"{what} {text!r}: unknown dataset (no such file or folder); expected {EXPECTED}")


def _hf_options(text: str, query: str, what: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in filter(None, query.split(",")):
        key, eq, value = item.partition("=")
        if key not in HF_OPTIONS or not eq or not value:
            raise CisError(f"{what} {text!r}: option {item!r}; expected x=COLUMN or y=COLUMN after '?'")
        options[key] = value
    return options


def data_kind(text: str) -> str:
    """The kind of a data reference: ``digits``, ``cifar10``, ``cifar100`` or one of :data:`USER_KINDS`."""
    return parse_data_ref(text).kind


def absolute_ref(text: str) -> str:
    """The reference with its file or folder made absolute, so a run rebuilds its data from any directory."""
    ref = parse_data_ref(text)
    if ref.kind == "digits" or (ref.kind == "factory" and ref.factory is not None and ref.factory.path is None):
        return text
    if ref.kind == "factory" and ref.factory is not None and ref.factory.path is not None:
        return f"{ref.factory.path.resolve()}:{ref.factory.name}"
    assert ref.path is not None
    where = str(ref.path.resolve())
    if ref.kind in ("cifar10", "cifar100"):
        return f"{ref.kind}:{where}"
    if ref.kind == "hf":
        query = ",".join(f"{k}={v}" for k, v in ref.options.items())
        return f"hf:{where}" + (f"?{query}" if query else "")
    return where


_EXPECTED = {  # what a missing path of each kind should have been
    "npz": "an .npz file (arrays x, y)",
    "images": "an image folder (DIR/<class>/*)",
    "hf": "a folder written by datasets' save_to_disk",
}


def data_sha256(text: str) -> str | None:
    """sha256 of the data a reference names: the npz file, the image or hf folder (every file), the factory's
    source file; None for the built-in data sets."""
    ref = parse_data_ref(text)
    if ref.kind in BUILTIN:
        return None
    if ref.kind == "factory":
        assert ref.factory is not None
        return source_sha256(ref.factory, f"--data {text}")
    assert ref.path is not None
    if not ref.path.exists():
        raise CisError(f"data {text!r}: {ref.path} not found; expected {_EXPECTED.get(ref.kind, 'the data it names')}")
    return sha256_of(ref.path)


def check_unchanged(text: str, recorded: str | None, where: str) -> None:
    """One line when the data ``text`` names is not the data a run recorded (``recorded``: its sha256)."""
    if recorded:
        check_digest(text, data_sha256(text), recorded, where)


def check_digest(text: str, now: str | None, recorded: str | None, where: str) -> None:
    """One line when the data's sha256 ``now`` is not the one the run in ``where`` recorded."""
    if recorded and now != recorded:
        raise CisError(
            f"data {text!r}: changed since the run in {where} (sha256 {str(now)[:12]}..., recorded "
            f"{recorded[:12]}...); expected the data it was trained on"
        )
