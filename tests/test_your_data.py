"""Any data (issue 32, item 3): npz, image folders, saved Hugging Face datasets and Python factories, each
read into train/val/test splits; every bad input one line (CisError)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

from cis.core.errors import CisError
from cis.core.user_code import is_reference, parse_reference, resolve, sha256_file
from cis.training.data.data_ref import absolute_ref, check_unchanged, data_kind, data_sha256, parse_data_ref
from cis.training.data.loading import load_dataset
from cis.training.data.partition import partition, partition_by_column


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))


class Node:
    def __init__(self, id, exit):
        self.id, self.exit = id, exit


NODES = [Node("root", 2), Node("a", 1), Node("b", 1)]


def npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def images(n=50, c=1, size=8, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, c, size, size)).astype(np.float32), np.arange(n) % classes


def load_fails(ref, match, **kw):
    with pytest.raises(CisError, match=match):
        load_dataset(str(ref), **kw)


# ------------------------------------------------------------------------------------------------ npz


def test_npz_float_images_split_70_10_20_with_class_names(tmp_path):
    x, y = images(100, c=3, size=4)
    ref = npz(tmp_path / "d.npz", x=x.astype(np.float64), y=y, classes=np.array(["cat", "dog", "eel"]))
    s = load_dataset(ref, seed=1)
    assert [len(s.train), len(s.val), len(s.test)] == [70, 10, 20]
    assert s.train.x.dtype == np.float32 and s.train.x.shape[1:] == (3, 4, 4) and s.train.y.dtype == np.int64
    assert s.train.classes == ["cat", "dog", "eel"] and s.train.name == "npz"
    assert s.train.mean is None and s.train.std is None  # arrays are used as given
    assert s.sha256 == sha256_file(tmp_path / "d.npz") == data_sha256(ref)
    again = load_dataset(ref, seed=1)
    assert np.array_equal(again.test.y, s.test.y) and np.array_equal(again.train.x, s.train.x)
    assert not np.array_equal(load_dataset(ref, seed=2).test.y, s.test.y)
    assert len(load_dataset(ref, val_size=0).val) == 0


def test_npz_sequences_and_token_ids_keep_their_shape_and_integer_dtype(tmp_path):
    seq = load_dataset(npz(tmp_path / "s.npz", x=np.ones((20, 2, 16), np.float16), y=np.arange(20) % 2))
    assert seq.train.x.dtype == np.float32 and seq.train.input_shape == (2, 16)
    tokens = np.random.default_rng(0).integers(0, 100, (20, 12)).astype(np.int32)
    tok = load_dataset(npz(tmp_path / "t.npz", x=tokens, y=np.arange(20) % 2))
    assert tok.train.x.dtype == np.int64 and tok.train.input_shape == (12,)
    assert set(tok.train.x.ravel()) <= set(tokens.ravel())


def test_npz_split_column_as_strings_or_ints_and_val_carved_from_train(tmp_path):
    x, y = images(30)
    split = np.array(["train"] * 20 + ["val"] * 4 + ["test"] * 6)
    s = load_dataset(npz(tmp_path / "a.npz", x=x, y=y, split=split))
    assert [len(s.train), len(s.val), len(s.test)] == [20, 4, 6]
    assert np.array_equal(s.val.x, x[20:24]) and np.array_equal(s.test.y, y[24:])
    codes = np.array([0] * 20 + [1] * 4 + [2] * 6)
    t = load_dataset(npz(tmp_path / "b.npz", x=x, y=y, split=codes))
    assert np.array_equal(t.val.x, s.val.x) and np.array_equal(t.train.x, s.train.x)
    no_val = load_dataset(npz(tmp_path / "c.npz", x=x, y=y, split=np.where(codes == 1, 0, codes)))
    assert [len(no_val.train), len(no_val.val), len(no_val.test)] == [22, 2, 6]  # 10 % of train held out
    assert len(load_dataset(str(tmp_path / "c.npz"), val_size=5).val) == 5


def test_npz_node_column_travels_with_the_training_samples(tmp_path):
    x, y = images(40)
    node = np.arange(40) % 3
    s = load_dataset(npz(tmp_path / "n.npz", x=x, y=y, node=node))
    assert s.train.node is not None and len(s.train.node) == len(s.train)
    parts = partition_by_column(s.train.node, NODES, "n.npz")
    assert sum(len(v) for v in parts.values()) == len(s.train)
    assert all((s.train.node[idx] == k).all() for k, idx in enumerate(parts.values()))
    sub = s.train.subset(np.arange(5))
    assert np.array_equal(sub.node, s.train.node[:5])


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"x": np.zeros((10, 1, 2, 2)), "y": np.array([0, 1] * 4 + [0, -1])},
         "sample 9 has label -1; expected class labels"),
        ({"x": np.zeros((10, 1, 2, 2)), "y": np.arange(10) % 3, "classes": np.array(["a", "b"])},
         r"sample 2 has label 2; expected labels 0\.\.1 \(the data's 2 class names\)"),
        ({"x": np.zeros((10, 1, 2, 2)), "y": np.zeros(10, int)}, "1 class; expected at least 2"),
        ({"x": np.zeros((10, 1, 2, 2)), "y": np.arange(9) % 2}, "y has shape .9,. and x 10 samples"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) % 2, "node": np.zeros(9, int)}, "node has 9 entries, x 10"),
        ({"x": np.where(np.arange(40).reshape(10, 4) == 17, np.nan, 0.0), "y": np.arange(10) % 2},
         "NaN or inf .first at sample 4"),
        ({"x": np.where(np.arange(40).reshape(10, 4) == 3, np.inf, 0.0), "y": np.arange(10) % 2}, "NaN or inf"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) % 2, "split": np.array(["train"] * 8 + ["dev"] * 2)},
         "split value 'dev'; expected train, val or test"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) % 2, "split": np.arange(10) % 4}, "split value 3"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) % 2, "split": np.zeros(10, int)}, "names no test sample"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) / 3},
         "dtype float64 .sample 0's label is 0.0.; expected integer class labels"),
        ({"x": np.array(["a"] * 10)[:, None], "y": np.arange(10) % 2}, "dtype <U1; expected numbers"),
        ({"x": np.zeros(10), "y": np.arange(10) % 2}, r"x has shape \(10,\); expected one row per sample"),
        ({"x": np.zeros((10, 3))}, "no array 'y'"),
        ({"x": np.zeros((10, 3)), "y": np.arange(10) % 2, "extra": np.zeros(3)}, "unknown array 'extra'"),
    ],
)
def test_npz_bad_inputs_are_one_line(tmp_path, arrays, match):
    load_fails(npz(tmp_path / "bad.npz", **arrays), match)


def test_npz_that_is_not_an_archive_or_missing(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    load_fails(tmp_path / "junk.npz", "not an npz archive")
    load_fails(tmp_path / "gone.npz", "not found")


# --------------------------------------------------------------------------------------------- images


def write_folder(root, classes, per_class=3, size=6, mode="L", odd=None):
    for k, cls in enumerate(classes):
        d = root / cls
        d.mkdir(parents=True)
        for j in range(per_class):
            side = odd if odd and j == 0 else size
            shape = (side, side) if mode == "L" else (side, side, 3)
            Image.fromarray(np.full(shape, 30 * k + j, np.uint8), mode).save(d / f"{j}.png")


def test_image_folder_of_class_folders_greyscale_normalised_per_channel(tmp_path):
    write_folder(tmp_path / "imgs", ["ant", "bee", "cow"], per_class=10, odd=9)
    s = load_dataset(str(tmp_path / "imgs"))
    assert s.train.classes == ["ant", "bee", "cow"] and s.train.name == "images"
    assert s.train.x.shape[1:] == (1, 6, 6)  # the most common size; the 9x9 image resized to it
    assert len(s.train) + len(s.val) + len(s.test) == 30 and len(s.test) == 6
    assert len(s.train.mean) == 1 and abs(float(s.train.x.mean())) < 1e-4  # the training split's mean and std
    assert s.sha256 == data_sha256(str(tmp_path / "imgs"))


def test_image_folder_with_train_val_test_folders_rgb(tmp_path):
    for split, n in (("train", 4), ("val", 1), ("test", 2)):
        write_folder(tmp_path / "f" / split, ["x", "y"], per_class=n, mode="RGB")
    s = load_dataset(str(tmp_path / "f"))
    assert [len(s.train), len(s.val), len(s.test)] == [8, 2, 4]
    assert s.train.x.shape[1:] == (3, 6, 6) and len(s.train.mean) == 3


def test_image_folder_with_one_class_or_none_is_one_line(tmp_path):
    write_folder(tmp_path / "one", ["only"])
    load_fails(tmp_path / "one", r"1 class folder \(only/\); expected at least 2 classes")
    (tmp_path / "empty").mkdir()
    load_fails(tmp_path / "empty", "no class folders; expected at least 2 classes")
    write_folder(tmp_path / "noimg", ["a", "b"])
    for f in (tmp_path / "noimg" / "b").iterdir():
        f.unlink()
    load_fails(tmp_path / "noimg", "b: no images")


# ---------------------------------------------------------------------------------------- Hugging Face


def test_saved_hugging_face_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    x, y = images(30, c=1, size=3)
    features = datasets.Features({
        "pixels": datasets.Array3D((1, 3, 3), "float32"),
        "label": datasets.ClassLabel(names=["no", "yes", "maybe"]),
        "node": datasets.Value("int64"),
    })
    ds = datasets.Dataset.from_dict({"pixels": x, "label": y, "node": np.arange(30) % 3}, features=features)
    ds.save_to_disk(str(tmp_path / "hf"))
    s = load_dataset(f"hf:{tmp_path / 'hf'}")
    assert s.train.classes == ["no", "yes", "maybe"] and s.train.x.shape[1:] == (1, 3, 3) and s.train.name == "hf"
    assert s.train.node is not None and [len(s.train), len(s.val), len(s.test)] == [21, 3, 6]
    assert s.sha256 == data_sha256(f"hf:{tmp_path / 'hf'}")

    tokens = datasets.Dataset.from_dict({"ids": np.arange(40).reshape(10, 4), "target": np.arange(10) % 2})
    datasets.DatasetDict({"train": tokens, "test": tokens.select(range(4))}).save_to_disk(str(tmp_path / "dd"))
    d = load_dataset(f"hf:{tmp_path / 'dd'}?x=ids,y=target")
    assert d.train.x.dtype == np.int64 and d.train.input_shape == (4,) and len(d.test) == 4
    assert len(d.train) + len(d.val) == 10
    load_fails(f"hf:{tmp_path / 'dd'}", "no label column")
    load_fails(f"hf:{tmp_path / 'nope'}", "not found")
    (tmp_path / "plain").mkdir()
    load_fails(f"hf:{tmp_path / 'plain'}", "not a saved dataset")


def test_hugging_face_image_column_is_decoded_and_normalised(tmp_path):
    datasets = pytest.importorskip("datasets")
    pics = [Image.fromarray(np.full((5, 5, 3), 10 * k, np.uint8)) for k in range(12)]
    features = datasets.Features({"image": datasets.Image(), "labels": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": pics, "labels": np.arange(12) % 2}, features=features).save_to_disk(
        str(tmp_path / "im")
    )
    s = load_dataset(f"hf:{tmp_path / 'im'}")
    assert s.train.x.shape[1:] == (3, 5, 5) and s.train.x.dtype == np.float32 and len(s.train.mean) == 3


# -------------------------------------------------------------------------------------------- factory


FACTORY = """
import torch
from torch.utils.data import Dataset, TensorDataset

class Pairs(Dataset):
    classes = ["even", "odd"]
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.full((2, 5), float(i)), i % 2

def single():
    return Pairs(40)

def triple():
    return Pairs(20), Pairs(5), Pairs(8)

class Holed(Pairs):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x * float("nan") if i == 3 else x), y

def holed():
    return Pairs(20), Pairs(5), Holed(8)

def named():
    x = torch.randint(0, 50, (12, 6))
    return {"train": TensorDataset(x, torch.arange(12) % 3), "test": TensorDataset(x[:4], torch.arange(4) % 3)}

def wrong():
    return 42

def broken():
    raise RuntimeError("no data today")

def ragged():
    return [(torch.zeros(i + 1), 0) for i in range(3)]

NOT_CALLABLE = 3
"""


def test_factory_returning_a_dataset_a_triple_or_a_dict(tmp_path):
    (tmp_path / "mydata.py").write_text(FACTORY)
    s = load_dataset(f"{tmp_path / 'mydata.py'}:single")
    assert s.train.classes == ["even", "odd"] and s.train.input_shape == (2, 5) and s.train.name == "factory"
    assert [len(s.train), len(s.val), len(s.test)] == [28, 4, 8]
    assert s.sha256 == sha256_file(tmp_path / "mydata.py")
    t = load_dataset(f"{tmp_path / 'mydata.py'}:triple")
    assert [len(t.train), len(t.val), len(t.test)] == [20, 5, 8] and np.array_equal(t.val.x[:, 0, 0], np.arange(5))
    d = load_dataset(f"{tmp_path / 'mydata.py'}:named")
    assert d.train.x.dtype == np.int64 and len(d.train) + len(d.val) == 12 and len(d.test) == 4


def test_factory_from_a_module_on_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "sets.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert data_kind("userpkg.sets:single") == "factory"
    s = load_dataset("userpkg.sets:single")
    assert len(s.train) == 28 and s.sha256 == sha256_file(tmp_path / "userpkg" / "sets.py")


def test_factory_mistakes_are_one_line(tmp_path):
    (tmp_path / "mydata.py").write_text(FACTORY)
    f = tmp_path / "mydata.py"
    load_fails(f"{f}:wrong", "returned a int; expected a map-style dataset")
    load_fails(f"{f}:broken", "raised RuntimeError: no data today")
    load_fails(f"{f}:ragged", r"sample 1's x is float32 \(2,\), sample 0's float32 \(1,\); expected one shape")
    load_fails(f"{f}:missing", "has no 'missing'; expected a callable")
    load_fails(f"{f}:NOT_CALLABLE", "is a int; expected a callable")
    load_fails(f"{f}:holed", r"x holds NaN or inf \(first at test sample 3\)")  # its row in its part, not the table's
    load_fails(f"{tmp_path / 'gone.py'}:single", "gone.py not found")
    (tmp_path / "bad.py").write_text("import not_a_module_anywhere\n")
    load_fails(f"{tmp_path / 'bad.py'}:single", "importing .*bad.py failed .ModuleNotFoundError")
    load_fails("no_such_pkg_xyz.mod:make", "module 'no_such_pkg_xyz.mod' not found")


# ------------------------------------------------------------------------------------ references, kinds


def test_reference_parsing_and_resolving(tmp_path):
    assert is_reference("a/b.py:make") and is_reference("pkg.mod:make") and not is_reference("/data/x.npz")
    assert not is_reference("a.py:1bad") and not is_reference("digits")
    ref = parse_reference("dir/m.py:make", "--model")
    assert ref.path is not None and ref.path.name == "m.py" and ref.name == "make" and ref.module is None
    assert parse_reference("pkg.mod:Make", "--model").module == "pkg.mod"
    for bad in ("nocolon", "x.py:", "a b:c", ":name"):
        with pytest.raises(CisError, match="--model .*expected PATH.py:NAME or pkg.module:NAME"):
            parse_reference(bad, "--model")
    (tmp_path / "m.py").write_text("def make(k=1):\n    return k * 2\n")
    assert resolve(parse_reference(f"{tmp_path / 'm.py'}:make", "--model"))(k=4) == 8


def test_data_kinds_absolute_refs_and_unknown_references(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.savez("d.npz", x=np.zeros((4, 2)), y=np.arange(4) % 2)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "f.py").write_text("def make():\n    return []\n")
    assert [data_kind(r) for r in ("digits", "cifar10:/c", "d.npz", "imgs", "hf:imgs", "f.py:make")] == [
        "digits", "cifar10", "npz", "images", "hf", "factory"]
    assert absolute_ref("d.npz") == str(tmp_path / "d.npz")
    assert absolute_ref("f.py:make") == f"{tmp_path / 'f.py'}:make"
    assert absolute_ref("hf:imgs?y=lab") == f"hf:{tmp_path / 'imgs'}?y=lab"
    assert absolute_ref("cifar10:imgs") == f"cifar10:{tmp_path / 'imgs'}" and absolute_ref("digits") == "digits"
    assert parse_data_ref("hf:imgs?x=a,y=b").options == {"x": "a", "y": "b"}
    for bad, match in (("mnist", "unknown dataset"), ("digits:foo", "unknown dataset"), ("cifar10", "missing folder"),
                       ("hf:", "missing folder"), ("hf:imgs?z=1", "option 'z=1'"), ("f.txt", "unknown dataset")):
        with pytest.raises(CisError, match=match):
            parse_data_ref(bad)
    (tmp_path / "f.txt").write_text("")
    with pytest.raises(CisError, match="a .txt file; expected"):
        parse_data_ref("f.txt")


def test_a_changed_data_file_is_one_line(tmp_path):
    ref = npz(tmp_path / "d.npz", x=np.zeros((6, 2)), y=np.arange(6) % 2)
    digest = data_sha256(ref)
    check_unchanged(ref, digest, "RUN")
    check_unchanged(ref, None, "RUN")  # runs from before the digest was recorded
    npz(tmp_path / "d.npz", x=np.ones((6, 2)), y=np.arange(6) % 2)
    with pytest.raises(CisError, match="changed since the run in RUN"):
        check_unchanged(ref, digest, "RUN")
    assert data_sha256("digits") is None


# ------------------------------------------------------------------------------------------ partition


def test_partition_by_the_node_column_indices_or_ids():
    parts = partition_by_column(np.array([0, 1, 2, 2, 1, 0]), NODES, "d")
    assert [p.tolist() for p in parts.values()] == [[0, 5], [1, 4], [2, 3]]
    by_id = partition_by_column(np.array(["a", "root", "b", "b"]), NODES, "d")
    assert by_id["root"].tolist() == [1] and by_id["b"].tolist() == [2, 3]


@pytest.mark.parametrize(
    "column, match",
    [
        (None, "has no node column"),
        (np.array([0, 1, 2, 3]), r"node index 3; the spec has 3 nodes, expected 0\.\.2"),
        (np.array([0, 1, -1, 2]), "node index -1"),
        (np.array(["a", "root", "c"]), "names node 'c'; the spec's nodes are root, a, b"),
        (np.array([0, 0, 1, 1]), "gives node 'b' no training sample"),
        (np.array([0.5, 1.0, 2.0]), "dtype float64"),
    ],
)
def test_partition_by_a_bad_node_column_is_one_line(column, match):
    with pytest.raises(CisError, match=match):
        partition_by_column(column, NODES, "d")


def test_fewer_samples_than_nodes_is_one_line():
    with pytest.raises(CisError, match=r"2 training samples \(what the validation split leaves\) for 3 nodes"):
        partition(np.array([0, 1]), NODES)
