"""cis.core.input_files: what ``cis infer`` reads from .npz files and image folders (core install, no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from cis.core.bundle import Bundle
from cis.core.errors import CisError
from cis.core.input_files import is_input_source, load_image_folder, load_inputs, load_npz

Image = pytest.importorskip("PIL.Image")  # writes the test images; the loader itself reads PNG without it

MEAN, STD = [0.3, 0.4, 0.5], [0.2, 0.25, 0.3]


def bundle_for(tmp_path, channels: int, size: int = 8, classes=("b", "a")) -> Bundle:
    """A manifest with what the loader reads: stage 1's input, the normalisation, the classes."""
    stage = {
        "index": 1,
        "exit": 1,
        "file": "stages/stage1.onnx",
        "outputs": [],
        "inputs": [{"name": "input", "shape": [None, channels, size, size], "dtype": "float32"}],
    }
    norm = {"mean": MEAN[:channels], "std": STD[:channels]}
    return Bundle(tmp_path, {"stages": [stage], "normalisation": norm, "classes": list(classes)})


def normalised(pixels: np.ndarray, channels: int) -> np.ndarray:
    """(N, H, W, C) uint8 -> the model's input, written out independently of the loader."""
    x = pixels.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    return (x - np.array(MEAN[:channels], np.float32)[:, None, None]) / np.array(STD[:channels], np.float32)[
        :, None, None
    ]


def test_sources_are_told_apart(tmp_path):
    assert not is_input_source("digits") and not is_input_source("cifar10:/data/c10")
    assert is_input_source("x.npz") and is_input_source("npz:x") and is_input_source("images:somewhere")
    assert is_input_source(str(tmp_path))


def test_npz_float_inputs_go_as_they_are_and_uint8_pixels_are_normalised(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8))
    np.savez(tmp_path / "f.npz", x=x, y=np.arange(5))
    got = load_inputs(str(tmp_path / "f.npz"))
    assert (
        got.x.dtype == np.float32 and np.array_equal(got.x, x.astype(np.float32)) and got.y.tolist() == [0, 1, 2, 3, 4]
    )
    px = np.random.default_rng(1).integers(0, 256, (4, 3, 8, 8), dtype=np.uint8)
    np.savez(tmp_path / "u.npz", x=px)
    with pytest.raises(CisError, match="--bundle"):
        load_npz(tmp_path / "u.npz")
    got = load_npz(tmp_path / "u.npz", bundle_for(tmp_path, 3))
    assert got.y is None and np.allclose(got.x, normalised(px.transpose(0, 2, 3, 1), 3), atol=1e-6)
    with pytest.raises(CisError, match=r"takes \(1, 8, 8\)"):
        load_npz(tmp_path / "u.npz", bundle_for(tmp_path, 1))


def test_npz_mistakes_are_one_line(tmp_path):
    np.savez(tmp_path / "a.npz", inputs=np.zeros((2, 1, 8, 8)))
    with pytest.raises(CisError, match="no array 'x'"):
        load_npz(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", x=np.zeros((2, 64)))
    with pytest.raises(CisError, match=r"expected \(N, C, H, W\)"):
        load_npz(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 1, 8, 8)), y=np.zeros(3, int))
    with pytest.raises(CisError, match="2 integer labels"):
        load_npz(tmp_path / "c.npz")
    (tmp_path / "d.npz").write_text("not a zip")
    with pytest.raises(CisError, match="cannot read"):
        load_npz(tmp_path / "d.npz")
    with pytest.raises(CisError, match="file not found"):
        load_npz(tmp_path / "missing.npz")


def test_class_folders_take_their_labels_from_the_bundle(tmp_path):
    rng = np.random.default_rng(2)
    imgs = {"a": rng.integers(0, 256, (2, 8, 8), dtype=np.uint8), "b": rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)}
    for cls, arr in imgs.items():
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i, img in enumerate(arr):
            Image.fromarray(img, "L").save(tmp_path / "data" / cls / f"{i}.png")
    got = load_image_folder(tmp_path / "data", bundle_for(tmp_path, 1, classes=("b", "a")))
    assert got.names == ["a/0.png", "a/1.png", "b/0.png", "b/1.png", "b/2.png"]
    assert got.y.tolist() == [1, 1, 0, 0, 0]  # the bundle's order (b, a), not the folders' alphabetical one
    want = normalised(np.concatenate([imgs["a"], imgs["b"]])[..., None], 1)
    assert got.x.shape == (5, 1, 8, 8) and np.allclose(got.x, want, atol=1e-6)
    with pytest.raises(CisError, match="class folder 'a' is not a class"):
        load_image_folder(tmp_path / "data", bundle_for(tmp_path, 1, classes=("b", "c")))
    with pytest.raises(CisError, match="--bundle"):
        load_inputs(str(tmp_path / "data"))


def test_flat_folders_channels_and_sizes(tmp_path):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    (tmp_path / "flat").mkdir()
    Image.fromarray(rgb, "RGB").save(tmp_path / "flat" / "rgb.png")
    got = load_image_folder(tmp_path / "flat", bundle_for(tmp_path, 1))  # RGB into a 1-channel model: pillow's luma
    assert got.y is None and got.names == ["rgb.png"]
    luma = np.asarray(Image.fromarray(rgb, "RGB").convert("L"))
    assert np.allclose(got.x, normalised(luma[None, :, :, None], 1), atol=1e-6)
    got = load_image_folder(tmp_path / "flat", bundle_for(tmp_path, 3))
    assert np.allclose(got.x, normalised(rgb[None], 3), atol=1e-6)
    big = rng.integers(0, 256, (16, 16), dtype=np.uint8)  # another size: resized as the training loader does
    (tmp_path / "big").mkdir()
    Image.fromarray(big, "L").save(tmp_path / "big" / "g.png")
    got = load_image_folder(tmp_path / "big", bundle_for(tmp_path, 3))
    want = np.asarray(Image.fromarray(big, "L").resize((8, 8), Image.BILINEAR))
    assert np.allclose(got.x, normalised(np.repeat(want[None, :, :, None], 3, axis=3), 3), atol=1e-6)


def test_folder_mistakes_are_one_line(tmp_path):
    b = bundle_for(tmp_path, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CisError, match="no images"):
        load_image_folder(tmp_path / "empty", b)
    (tmp_path / "mixed" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8), "L").save(tmp_path / "mixed" / "x.png")
    Image.fromarray(np.zeros((8, 8), np.uint8), "L").save(tmp_path / "mixed" / "a" / "y.png")
    with pytest.raises(CisError, match="both images and class folders"):
        load_image_folder(tmp_path / "mixed", b)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nshort")
    with pytest.raises(CisError, match="x.png"):
        load_image_folder(tmp_path / "bad", b)
