import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from cis.core.errors import CisError
from cis.training.data.loading import CIFAR10_MEAN, CIFAR10_STD, augment_batch, augment_options, load_dataset


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))


def raw_images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10_pickles(root, per_batch=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        x = raw_images(per_batch, i)
        labels = [(i + k) % 10 for k in range(per_batch)]
        write_pickle(folder / f"data_batch_{i}", {b"data": x.reshape(per_batch, -1), b"labels": labels})
    write_pickle(folder / "test_batch", {b"data": raw_images(3, 9).reshape(3, -1), b"labels": [0, 1, 2]})
    write_pickle(folder / "batches.meta", {b"label_names": [f"c{k}".encode() for k in range(10)]})
    return folder


def write_image_folder(root, classes, per_class=2, suffix=".png", size=32):
    for split, n in (("train", per_class), ("test", 1)):
        for k, cls in enumerate(classes):
            d = root / split / cls
            d.mkdir(parents=True)
            for j in range(n):
                img = np.full((size, size, 3), 20 * k + j, np.uint8)
                Image.fromarray(img).save(d / f"{j}{suffix}")


def test_digits_splits_and_normalisation():
    splits = load_dataset("digits", seed=0)
    sizes = [len(splits.train), len(splits.val), len(splits.test)]
    assert sum(sizes) == 1797 and sizes[2] == 359 and sizes[1] == 180
    assert splits.train.x.shape[1:] == (1, 8, 8) and splits.train.x.dtype == np.float32
    assert splits.train.y.dtype == np.int64 and splits.train.num_classes == 10
    assert abs(splits.train.x.mean()) < 1e-4 and abs(splits.train.x.std() - 1) < 1e-3
    again = load_dataset("digits", seed=0)
    assert np.array_equal(again.val.y, splits.val.y)
    assert not np.array_equal(load_dataset("digits", seed=1).val.y, splits.val.y)
    assert len(load_dataset("digits", val_size=0).val) == 0


def test_digits_are_sklearn_s_digits_read_without_importing_sklearn():
    from sklearn.datasets import load_digits

    from cis.training.data.loading import digits_table

    pixels, labels = digits_table()
    raw = load_digits()
    assert np.array_equal(pixels, raw.data) and np.array_equal(labels, raw.target)
    code = (
        "import sys; from cis.training.data.loading import load_dataset; load_dataset('digits');"
        " print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_cifar10_pickle_layout(tmp_path):
    folder = write_cifar10_pickles(tmp_path)
    for path in (tmp_path, folder):  # parent folder or the batches folder itself
        splits = load_dataset(f"cifar10:{path}", seed=0)
        assert len(splits.train) + len(splits.val) == 20 and len(splits.val) == 2 and len(splits.test) == 3
        assert splits.train.classes[3] == "c3" and splits.train.name == "cifar10"
        assert splits.test.x.shape == (3, 3, 32, 32) and splits.test.x.dtype == np.float32
    mean, std = (np.array(v, np.float32)[:, None, None] for v in (CIFAR10_MEAN, CIFAR10_STD))
    expected = (raw_images(3, 9)[0].astype(np.float32) / 255 - mean) / std
    np.testing.assert_allclose(splits.test.x[0], expected, rtol=1e-5, atol=1e-5)
    assert list(splits.test.y) == [0, 1, 2]
    assert len(load_dataset(f"cifar10:{tmp_path}", val_size=5).val) == 5


def test_cifar100_pickle_layout(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = {b"data": raw_images(30, 1).reshape(30, -1), b"fine_labels": list(range(30)), b"coarse_labels": [0] * 30}
    write_pickle(folder / "train", train)
    write_pickle(folder / "test", {b"data": raw_images(2, 2).reshape(2, -1), b"fine_labels": [99, 98]})
    splits = load_dataset(f"cifar100:{tmp_path}")
    assert splits.train.num_classes == 100 and list(splits.test.y) == [99, 98]
    assert len(splits.train) == 27 and len(splits.val) == 3


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_image_folder_layout(tmp_path, suffix):
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    write_image_folder(tmp_path / "data", classes[::-1], suffix=suffix)  # creation order must not matter
    splits = load_dataset(f"cifar10:{tmp_path / 'data'}", seed=0)
    assert splits.train.classes == classes
    assert len(splits.train) + len(splits.val) == 20 and len(splits.test) == 10
    assert sorted(splits.test.y) == list(range(10))
    # images were written in reverse class order with pixel value 20 * position (JPEG: approximately)
    mean, std = (np.array(v, np.float32)[:, None, None] for v in (CIFAR10_MEAN, CIFAR10_STD))
    raw = splits.test.x * std + mean
    np.testing.assert_allclose(raw.mean(axis=(1, 2, 3)) * 255, 20 * (9 - splits.test.y), atol=2)
    cached = load_dataset(f"cifar10:{tmp_path / 'data'}", seed=0)  # second read comes from the cache
    assert np.array_equal(cached.train.x, splits.train.x) and cached.train.classes == classes
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1


def test_image_folder_resizes_other_sizes(tmp_path):
    write_image_folder(tmp_path, [f"k{i}" for i in range(10)], size=40)
    assert load_dataset(f"cifar10:{tmp_path}", cache=False).test.x.shape == (10, 3, 32, 32)
    assert not (tmp_path / "cache").exists()


def test_augment_batch_crops_and_flips():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    gen = torch.Generator().manual_seed(0)
    out = augment_batch(x, gen, padding=0, flip=True)
    for i in range(2):
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(2))
    big = torch.randn(64, 3, 32, 32)
    out = augment_batch(big, torch.Generator().manual_seed(1), **augment_options("cifar10"))
    assert out.shape == big.shape
    changed = [not torch.equal(out[i], big[i]) for i in range(64)]
    assert sum(changed) > 50
    # each output is a shifted window of the zero-padded input (or of its mirror)
    padded = torch.nn.functional.pad(big, (4, 4, 4, 4))
    for i in range(8):
        windows = [padded[i, :, r : r + 32, c : c + 32] for r in range(9) for c in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(2)) for w in windows)
    a = augment_batch(big, torch.Generator().manual_seed(5))
    b = augment_batch(big, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_digits_augmentation_shifts_by_one_without_flip():
    opts = augment_options("digits")
    assert opts == {"padding": 1, "flip": False}
    x = torch.randn(16, 1, 8, 8)
    out = augment_batch(x, torch.Generator().manual_seed(0), **opts)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for i in range(16):
        assert any(torch.equal(out[i], padded[i, :, r : r + 8, c : c + 8]) for r in range(3) for c in range(3))


def test_error_paths(tmp_path):
    def fails(spec, match, **kw):
        with pytest.raises(CisError, match=match):
            load_dataset(spec, **kw)

    fails("mnist", "unknown dataset")
    fails("digits:foo", "unknown dataset")
    fails("cifar10:", "missing folder")
    fails("cifar10", "missing folder")
    fails(f"cifar10:{tmp_path / 'nope'}", "not found")
    fails(f"cifar10:{tmp_path}", "no known layout")
    fails("digits", "val_size", val_size=2000)
    with pytest.raises(CisError):
        augment_options("svhn")

    folder = write_cifar10_pickles(tmp_path / "pk")
    fails(f"cifar10:{tmp_path / 'pk'}", "val_size", val_size=-1)
    fails(f"cifar100:{tmp_path / 'pk'}", "no known layout")
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    fails(f"cifar10:{folder}", "data_batch_3.*cannot be read")
    write_pickle(folder / "data_batch_3", {b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]})
    fails(f"cifar10:{folder}", "'data'")
    write_pickle(folder / "data_batch_3", {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]})
    fails(f"cifar10:{folder}", "'labels'")
    write_pickle(folder / "data_batch_3", [1, 2])
    fails(f"cifar10:{folder}", "expected a dict")
    write_pickle(folder / "data_batch_3", {b"data": os.system, b"labels": []})  # any other global is refused
    fails(f"cifar10:{folder}", "cannot be read")
    (folder / "data_batch_3").unlink()
    fails(f"cifar10:{folder}", "data_batch_3: file not found")


def test_image_folder_errors(tmp_path):
    classes = [f"k{i}" for i in range(10)]
    write_image_folder(tmp_path / "few", classes[:3])
    with pytest.raises(CisError, match="found 3 classes"):
        load_dataset(f"cifar10:{tmp_path / 'few'}")

    root = tmp_path / "ok"
    write_image_folder(root, classes)
    (root / "train" / "k0" / "0.png").write_bytes(b"garbage")
    with pytest.raises(CisError, match="0.png: cannot be decoded"):
        load_dataset(f"cifar10:{root}")
    for f in (root / "train" / "k0").iterdir():
        f.unlink()
    with pytest.raises(CisError, match="k0: no images"):
        load_dataset(f"cifar10:{root}")

    root = tmp_path / "extra"
    write_image_folder(root, classes)
    (root / "test" / "unknown").mkdir()
    with pytest.raises(CisError, match="not in train"):
        load_dataset(f"cifar10:{root}")
    (root / "test" / "unknown").rmdir()
    for f in (root / "test" / "k4").iterdir():
        f.unlink()
    (root / "test" / "k4").rmdir()
    with pytest.raises(CisError, match="'k4' not found"):
        load_dataset(f"cifar10:{root}")
