"""cis.png, the core install's PNG decoder, against exact pixels and against pillow."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from cis.core.png import PngError, UnsupportedPng, decode_png, read_png


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _filter_row(kind: int, row: np.ndarray, prev: np.ndarray, bpp: int) -> bytes:
    """The PNG filter ``kind`` applied to one row of bytes (the encoder side, written independently)."""
    out = bytearray()
    for i, x in enumerate(row.tolist()):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        a, b, c = int(a), int(b), int(c)
        if kind == 0:
            pred = 0
        elif kind == 1:
            pred = a
        elif kind == 2:
            pred = b
        elif kind == 3:
            pred = (a + b) // 2
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        out.append((x - pred) % 256)
    return bytes([kind]) + bytes(out)


def encode_png(
    pixels: np.ndarray, colour: int, depth: int = 8, filters=(0,), palette=None, interlace: int = 0
) -> bytes:
    """A PNG of raw samples ``pixels`` (H, W, samples) with the given per-row filter cycle."""
    h, w, samples = pixels.shape
    if depth == 16:
        raw_rows = pixels.astype(">u2").reshape(h, -1).view(np.uint8).reshape(h, -1)
    elif depth == 8:
        raw_rows = pixels.astype(np.uint8).reshape(h, -1)
    else:
        bits = ((pixels[:, :, 0, None] >> np.arange(depth - 1, -1, -1)) & 1).astype(np.uint8).reshape(h, -1)
        raw_rows = np.packbits(bits, axis=1)
    bpp = max(1, samples * depth // 8)
    prev = np.zeros(raw_rows.shape[1], np.uint8)
    body = b""
    for r in range(h):
        body += _filter_row(filters[r % len(filters)], raw_rows[r], prev, bpp)
        prev = raw_rows[r]
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace))
    if palette is not None:
        out += _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    half = len(body) // 2  # two IDAT chunks: the decoder must join them
    z = zlib.compress(body)
    return out + _chunk(b"IDAT", z[:half]) + _chunk(b"IDAT", z[half:]) + _chunk(b"IEND", b"")


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("filt", [0, 1, 2, 3, 4])
def test_every_filter_type_decodes_exactly(filt):
    rgb = RNG.integers(0, 256, (7, 9, 3), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(rgb, 2, filters=(filt,))), rgb)
    grey = RNG.integers(0, 256, (5, 11, 1), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(grey, 0, filters=(filt, 4, 3))), grey)


def test_colour_types_and_depths():
    rgba = RNG.integers(0, 256, (6, 5, 4), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(rgba, 6, filters=(1, 2, 3, 4))), rgba[:, :, :3])  # alpha dropped
    la = RNG.integers(0, 256, (6, 5, 2), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(la, 4, filters=(4,))), la[:, :, :1])
    wide = RNG.integers(0, 65536, (4, 3, 3), dtype=np.uint16)
    assert np.array_equal(decode_png(encode_png(wide, 2, 16, filters=(3, 4))), (wide >> 8).astype(np.uint8))
    for depth in (1, 2, 4):
        v = RNG.integers(0, 1 << depth, (5, 13, 1), dtype=np.uint8)  # 13 columns: rows end mid-byte
        got = decode_png(encode_png(v, 0, depth, filters=(0, 1, 2)))
        assert np.array_equal(got, v * (255 // ((1 << depth) - 1))), depth
    palette = RNG.integers(0, 256, (16, 3), dtype=np.uint8)
    idx = RNG.integers(0, 16, (4, 7, 1), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(idx, 3, 4, palette=palette)), palette[idx[:, :, 0]])


def test_bad_files_give_one_clear_error(tmp_path):
    with pytest.raises(PngError, match="not a PNG"):
        decode_png(b"GIF89a....")
    rgb = RNG.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    with pytest.raises(UnsupportedPng, match="interlaced"):
        decode_png(encode_png(rgb, 2, interlace=1))
    good = encode_png(rgb, 2)
    path = tmp_path / "cut.png"
    path.write_bytes(good[: len(good) - 30])
    with pytest.raises(PngError, match="cut.png"):
        read_png(path)
    with pytest.raises(PngError, match="PLTE"):
        decode_png(encode_png(rgb[:, :, :1] % 4, 3, 8))


def test_matches_pillow_on_the_files_pillow_writes(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rgb = RNG.integers(0, 256, (17, 23, 3), dtype=np.uint8)
    cases = {
        "rgb": (Image.fromarray(rgb, "RGB"), "RGB"),
        "rgba": (Image.fromarray(np.dstack([rgb, rgb[:, :, :1]]), "RGBA"), "RGB"),
        "grey": (Image.fromarray(rgb[:, :, 0], "L"), "L"),
        "grey_alpha": (Image.fromarray(rgb[:, :, 0], "L").convert("LA"), "L"),
        "palette": (Image.fromarray(rgb, "RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=50), "RGB"),
        "bilevel": (Image.fromarray(rgb[:, :, 0], "L").convert("1"), "L"),
    }
    for name, (img, mode) in cases.items():
        for optimize in (False, True):
            path = tmp_path / f"{name}-{optimize}.png"
            img.save(path, optimize=optimize)
            with Image.open(path) as ref:
                want = np.asarray(ref.convert(mode))
            got = read_png(path)
            assert np.array_equal(got[:, :, 0] if mode == "L" else got, want), (name, optimize)
