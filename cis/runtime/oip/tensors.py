"""Tensors from the Open Inference Protocol: JSON ``data`` (flat or nested, strictly typed), raw little-endian
bytes (Triton's binary tensor data extension, gRPC's ``raw_input_contents``) and gRPC's typed ``contents``, each
checked against the input's datatype and shape; every fault an :class:`~cis.runtime.oip.errors.OipError`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from cis.runtime.oip.errors import OipError

# OIP datatype -> numpy dtype name (BYTES: length-prefixed byte strings, only as an output here)
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
OIP_DATATYPE = {v: k for k, v in DATATYPES.items()}


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: any size (the batch)

    def to_json(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


BROKEN = (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError)  # what a hostile JSON text raises


# the JSON value type of each datatype's elements: strict (a float input takes numbers, not strings or booleans)
_ELEMENT: dict[str, type] = {dt: bool if dt == "BOOL" else float if dt.startswith("FP") else int for dt in DATATYPES}
_NESTED: dict[tuple[str, int], msgspec.json.Decoder] = {}


def _nested_decoder(datatype: str, depth: int) -> msgspec.json.Decoder:
    """A decoder of lists nested ``depth`` deep whose elements are ``datatype``'s JSON type."""
    key = (datatype, depth)
    if key not in _NESTED:
        t: Any = _ELEMENT[datatype]
        for _ in range(depth):
            t = list[t]
        _NESTED[key] = msgspec.json.Decoder(t)
    return _NESTED[key]


def _decode_data(raw: bytes | memoryview, datatype: str, rank: int) -> tuple[np.ndarray | None, int]:
    """(array, nesting depth) of a ``data`` value, flat or nested ``rank`` deep, or (None, 0)."""
    for depth in (1,) if rank == 1 else (1, rank):  # a nested value fails the flat decoder at its first element
        try:
            a = np.array(_nested_decoder(datatype, depth).decode(raw), dtype=DATATYPES[datatype])
        except msgspec.ValidationError:
            continue
        except (*BROKEN, TypeError, OverflowError):  # ragged, out of the datatype's range, not JSON
            return None, 0
        return (a, depth) if a.dtype != object else (None, 0)
    return None, 0


def from_json(raw: bytes | memoryview, meta: Tensor, shape: Sequence[int]) -> np.ndarray:
    """A JSON ``data`` value, flat (row-major) or nested to ``shape``, as an array of ``shape``; its elements must
    be ``meta``'s datatype's JSON type (numbers for FP, integers for INT and UINT, true/false for BOOL)."""
    a, depth = _decode_data(raw, meta.datatype, len(shape))
    if a is None:
        raise OipError(
            "bad_tensor",
            f"input {meta.name!r}: data is not a flat or nested list of {meta.datatype} values (of the shape, each "
            f"within {meta.datatype}'s range)",
        )
    return _shaped(a, meta, shape, depth)


def from_data(data: Any, meta: Tensor, shape: Sequence[int]) -> np.ndarray:
    """Values already decoded (gRPC's typed ``contents``: a flat sequence) as an array of ``shape``."""
    try:
        a = np.asarray(data, dtype=DATATYPES[meta.datatype])
    except (ValueError, TypeError, OverflowError):
        raise OipError(
            "bad_tensor", f"input {meta.name!r}: data is not a flat or nested list of {meta.datatype} values"
        ) from None
    return _shaped(a, meta, shape, 1)


def _shaped(a: np.ndarray, meta: Tensor, shape: Sequence[int], depth: int) -> np.ndarray:
    count = math.prod(shape)
    if depth > 1 and a.shape != tuple(shape):
        raise OipError("bad_tensor", f"input {meta.name!r}: data nested as {list(a.shape)}; shape is {list(shape)}")
    if a.size != count:
        raise OipError("bad_tensor", f"input {meta.name!r}: {a.size} values in data; shape {list(shape)} holds {count}")
    return a.reshape(shape)


def from_bytes(raw: bytes | memoryview, meta: Tensor, shape: Sequence[int]) -> np.ndarray:
    """Raw little-endian row-major bytes as an array of ``shape`` (zero-copy)."""
    dtype = np.dtype(DATATYPES[meta.datatype])
    need = math.prod(shape) * dtype.itemsize
    if len(raw) != need:
        raise OipError(
            "bad_tensor", f"input {meta.name!r}: {len(raw)} bytes; shape {list(shape)} of {meta.datatype} needs {need}"
        )
    return np.frombuffer(raw, dtype).reshape(shape)
