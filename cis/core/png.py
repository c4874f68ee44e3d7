"""A PNG decoder in numpy and zlib, so a core install (no pillow) reads image folders.

Covers what image data sets hold: greyscale, RGB, palette, greyscale+alpha and
RGBA, bit depths 1/2/4/8 (greyscale, palette) and 8/16 (all), the five scanline
filters. Not covered: interlaced (Adam7) images, which raise
:class:`UnsupportedPng` (``cis.core.input_files`` then tries pillow). Alpha is dropped and
16-bit samples keep their high byte, as pillow's ``convert("RGB")`` would give
for the images here. Spec: https://www.w3.org/TR/png/
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from cis.core.errors import CisError

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# colour type -> (samples per pixel, allowed bit depths)
_COLOUR = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (1, (1, 2, 4, 8)), 4: (2, (8, 16)), 6: (4, (8, 16))}


class PngError(CisError):
    """The file is not a valid PNG."""


class UnsupportedPng(PngError):
    """A valid PNG using a feature this decoder leaves to pillow (interlacing)."""


def read_png(path: str | Path) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W, 1) for greyscale (with or without alpha), else (H, W, 3)."""
    data = Path(path).read_bytes()
    try:
        return decode_png(data)
    except PngError as exc:
        raise type(exc)(f"image {path}: {exc}") from None


def decode_png(data: bytes) -> np.ndarray:
    """Decode PNG bytes; see :func:`read_png`."""
    if not data.startswith(SIGNATURE):
        raise PngError("not a PNG file (bad signature)")
    header, palette, idat = _chunks(data)
    width, height, depth, colour, interlace = header
    if colour not in _COLOUR or depth not in _COLOUR[colour][1]:
        raise PngError(f"colour type {colour} with bit depth {depth} is not valid PNG")
    if interlace:
        raise UnsupportedPng("interlaced PNG (Adam7)")
    if width == 0 or height == 0:
        raise PngError(f"empty image ({width}x{height})")
    samples = _COLOUR[colour][0]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise PngError(f"corrupt image data ({exc})") from None
    bits_per_pixel = samples * depth
    stride = (width * bits_per_pixel + 7) // 8
    if len(raw) < height * (stride + 1):
        raise PngError(f"image data too short ({len(raw)} bytes for {height} rows of {stride + 1})")
    rows = _unfilter(
        np.frombuffer(raw, np.uint8, height * (stride + 1)).reshape(height, stride + 1), max(1, bits_per_pixel // 8)
    )
    pixels = _samples(rows, width, samples, depth)  # (H, W, samples) uint8
    if colour == 3:
        if palette is None:
            raise PngError("palette image without a PLTE chunk")
        if int(pixels.max()) >= len(palette):
            raise PngError(f"palette index {int(pixels.max())} beyond the {len(palette)}-entry palette")
        return palette[pixels[:, :, 0]]
    if colour in (4, 6):  # drop alpha
        pixels = pixels[:, :, : samples - 1]
    if colour == 0 and depth < 8:  # 1/2/4-bit grey spans 0..255 (x255, x85, x17)
        pixels = pixels * np.uint8(255 // ((1 << depth) - 1))
    return np.ascontiguousarray(pixels)


def _chunks(data: bytes) -> tuple[tuple[int, int, int, int, int], np.ndarray | None, list[bytes]]:
    pos, header, palette, idat = len(SIGNATURE), None, None, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if len(body) < length:
            raise PngError(f"truncated {kind.decode('latin-1')} chunk")
        pos += 12 + length  # length, type, body, crc
        if kind == b"IHDR":
            if length != 13:
                raise PngError("IHDR chunk of the wrong size")
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            header = (w, h, depth, colour, interlace)
        elif kind == b"PLTE":
            palette = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise PngError("missing IHDR or IDAT chunk")
    return header, palette, idat


def _unfilter(rows: np.ndarray, bpp: int) -> np.ndarray:
    """Undo the per-row filters (None, Sub, Up, Average, Paeth); returns (H, stride) uint8."""
    height, stride = rows.shape[0], rows.shape[1] - 1
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for r in range(height):
        kind, line = int(rows[r, 0]), rows[r, 1:]
        if kind == 0:
            cur = line.copy()
        elif kind == 1:  # Sub: a running sum per byte position within a pixel
            cur = _sub(line, bpp)
        elif kind == 2:
            cur = line + prev  # uint8 wraps mod 256
        elif kind in (3, 4):  # Average, Paeth: each byte depends on the decoded byte to its left
            cur = _left_dependent(line, prev, bpp, kind)
        else:
            raise PngError(f"unknown filter type {kind} in row {r}")
        out[r] = prev = cur
    return out


def _sub(line: np.ndarray, bpp: int) -> np.ndarray:
    pad = (-len(line)) % bpp
    cols = np.concatenate([line, np.zeros(pad, np.uint8)]).reshape(-1, bpp).astype(np.uint64)
    return (np.cumsum(cols, axis=0) % 256).astype(np.uint8).reshape(-1)[: len(line)]


def _left_dependent(line: np.ndarray, prev: np.ndarray, bpp: int, kind: int) -> np.ndarray:
    cur = bytearray(line.tobytes())
    up = prev.tobytes()
    for i in range(len(cur)):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            cur[i] = (cur[i] + ((a + b) >> 1)) & 0xFF
        else:
            c = up[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (cur[i] + pred) & 0xFF
    return np.frombuffer(bytes(cur), np.uint8)


def _samples(rows: np.ndarray, width: int, samples: int, depth: int) -> np.ndarray:
    """Unpack rows of bytes into (H, W, samples) uint8 (sub-byte depths scaled to 0..255, except palette indices)."""
    height = rows.shape[0]
    if depth == 8:
        return rows[:, : width * samples].reshape(height, width, samples)
    if depth == 16:
        return rows[:, : width * samples * 2].reshape(height, width, samples, 2)[..., 0]
    bits = np.unpackbits(rows, axis=1)[:, : width * depth].reshape(height, width, depth)
    values = (bits * (1 << np.arange(depth - 1, -1, -1, dtype=np.uint8))).sum(axis=2, dtype=np.uint16)
    return values.astype(np.uint8)[:, :, None]
