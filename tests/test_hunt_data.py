"""A hunt of docs/your-model.md and docs/training.md's data rules: each mistake in the user's data is one line
(what, where, what was expected), found before anything trains, and names what the user wrote."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import cis
from cis.core.errors import CisError
from cis.training.data.loading import load_dataset


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))


def load_fails(ref, match, **kw):
    with pytest.raises(CisError, match=match) as info:
        load_dataset(str(ref), **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def write_folder(root, classes, per_class=3, size=6):
    for k, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.fromarray(np.full((size, size), 30 * k + j, np.uint8), "L").save(root / cls / f"{j}.png")


FACTORIES = '''
class Samples:
    def __init__(self, n, bad=None, bad_len=False):
        self.n, self.bad, self.bad_len = n, bad, bad_len

    def __len__(self):
        if self.bad_len:
            raise OSError("the index file is gone")
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"missing file {i}")
        return [float(i % 3)] * 4, i % 2


def raises():
    return Samples(100, bad=7)


def raises_in_train():
    return {"train": Samples(50, bad=5), "test": Samples(10)}


def no_length():
    return Samples(100, bad_len=True)
'''


# ---------------------------------------------------------------- 1: a factory dataset whose ds[i] / len raises


def test_a_factory_dataset_that_raises_is_one_line_naming_the_sample(tmp_path, run_cli, monkeypatch):
    (tmp_path / "mydata.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    load_fails("mydata.py:raises", r"reading sample 7 \(ds\[7\]\) raised KeyError: 'missing file 7'; expected a pair")
    load_fails("mydata.py:raises_in_train", r"reading train sample 5 \(ds\[5\]\) raised KeyError")
    load_fails("mydata.py:no_length", r"len\(\) of the dataset raised OSError: the index file is gone")
    r = run_cli("train", "--serving", "60-30-10", "--data", "mydata.py:raises", "--out", tmp_path / "r")
    assert r.code == 2 and "reading sample 7" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "r").exists()
    r = run_cli("spec", "new", "--serving", "60-30-10", "--data", "mydata.py:raises", "-o", tmp_path / "s.toml")
    assert r.code == 2 and "reading sample 7" in r.err and "Traceback" not in r.err


# ------------------------------------------------------------------- 2, 21: Hugging Face columns


def test_a_hugging_face_column_of_ragged_sequences_is_one_line(tmp_path):
    datasets = pytest.importorskip("datasets")
    ids = [[1] * (1 + i % 4) for i in range(20)]
    datasets.Dataset.from_dict({"ids": ids, "label": [i % 2 for i in range(20)]}).save_to_disk(str(tmp_path / "hf"))
    load_fails(f"hf:{tmp_path / 'hf'}", r"column 'ids' holds rows of different lengths \(sample 0 has length 1, "
               r"sample 1 has length 2\); expected rows of one length \(pad")  # fmt: skip
    part = datasets.Dataset.from_dict({"ids": ids, "label": [i % 2 for i in range(20)]})
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(tmp_path / "dd"))
    load_fails(f"hf:{tmp_path / 'dd'}", r"\(train sample 0 has length 1, train sample 1 has length 2\)")


def test_a_hugging_face_column_named_but_missing_is_named_with_the_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    x = np.zeros((10, 4), np.float32)
    datasets.Dataset.from_dict({"feat": x, "label": np.arange(10) % 2}).save_to_disk(str(tmp_path / "hf"))
    load_fails(f"hf:{tmp_path / 'hf'}?x=nope", r"no column 'nope' for x \(columns \['feat', 'label'\]\); expected \?x=")
    load_fails(f"hf:{tmp_path / 'hf'}?y=kind", r"no column 'kind' for y \(columns \['feat', 'label'\]\)")


# ------------------------------------------------------------------- 6, 17: image folders


def test_hidden_folders_and_files_of_an_image_folder_are_skipped(tmp_path):
    write_folder(tmp_path / "img", ["cat", "dog"])
    hidden = tmp_path / "img" / ".ipynb_checkpoints"
    hidden.mkdir()
    Image.fromarray(np.zeros((6, 6), np.uint8), "L").save(hidden / "0.png")
    (tmp_path / "img" / ".empty").mkdir()
    (tmp_path / "img" / "cat" / "._0.png").write_bytes(b"macOS resource fork, not an image")
    s = load_dataset(str(tmp_path / "img"), cache=False)
    assert s.train.classes == ["cat", "dog"] and len(s.train) + len(s.val) + len(s.test) == 6
    write_folder(tmp_path / "split" / "train", ["a", "b"])
    write_folder(tmp_path / "split" / "test", ["a", "b"])
    (tmp_path / "split" / "test" / ".ipynb_checkpoints").mkdir()
    assert load_dataset(str(tmp_path / "split"), cache=False).test.classes == ["a", "b"]


def test_train_without_test_says_the_layout_rule(tmp_path):
    write_folder(tmp_path / "notest" / "train", ["cat", "dog"])
    load_fails(tmp_path / "notest", r"train/ without test/; expected train/ and test/ together .*or class folders")
    write_folder(tmp_path / "noval" / "train", ["cat", "dog"])
    write_folder(tmp_path / "noval" / "val", ["cat", "dog"])
    load_fails(tmp_path / "noval", r"train/, val/ without test/; expected train/ and test/ together")


# ------------------------------------------------------------------- 7, 14: classes present, no samples


def test_a_single_class_present_is_an_error_whatever_k_says(tmp_path):
    x = np.zeros((30, 4), np.float32)
    np.savez(tmp_path / "named.npz", x=x, y=np.zeros(30, np.int64), classes=np.array(["a", "b", "c"]))
    load_fails(tmp_path / "named.npz", r"every sample has label 0 \(1 class present of the data's 3 class names\); "
               "expected samples of at least 2 classes")  # fmt: skip
    np.savez(tmp_path / "plain.npz", x=x, y=np.ones(30, np.int64))
    load_fails(tmp_path / "plain.npz", r"every sample has label 1 \(1 class present of the spec's classes = 3\)",
               num_classes=3)  # fmt: skip
    np.savez(tmp_path / "two.npz", x=x, y=np.arange(30) % 2, classes=np.array(["a", "b", "c"]))
    assert load_dataset(str(tmp_path / "two.npz")).train.classes == ["a", "b", "c"]  # a class absent: a warning


def test_an_npz_without_samples_is_one_line(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 1, 8, 8), np.float32), y=np.zeros(0, np.int64))
    message = load_fails(tmp_path / "empty.npz", r"x has no samples \(shape \(0, 1, 8, 8\)\); expected one row per "
                         r"sample, \(N, \.\.\.\) with N >= 1")  # fmt: skip
    assert "val_size" not in message


# ------------------------------------------------------------------- 19: the Python API names its arguments


class Tokens:
    classes = ["a", "b", "c", "d"]

    def __init__(self, y):
        self.y = y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return np.zeros(4, np.float32), int(self.y[i])


def api_fails(tmp_path, match, data, **kw):
    with pytest.raises(CisError, match=match) as info:
        cis.train(None, data, serving="60-30-10", rounds=1, out=tmp_path / "run", **kw)
    assert "data.npz" not in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_python_api_data_mistakes_name_the_argument_and_the_accepted_forms(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 1, 8, 8)).astype(np.float32), np.arange(60) % 3
    api_fails(tmp_path, r"^cis.train train_data: y has dtype float64", (x, y.astype(float)))
    api_fails(tmp_path, r"^cis.train train_data: y has shape \(59,\) and x 60 samples", (x, y[:-1]))
    api_fails(tmp_path, r"^cis.train test_data: x has dtype <U\d+; expected numbers", (x, y), val_data=(x, y),
              test_data=(x.astype(str), y))  # fmt: skip
    api_fails(tmp_path, r"^cis.train train_data: a tuple of 2 \(list, ndarray\); expected a tuple \(x, y\) of two "
              r"arrays or tensors .* or a map-style dataset", (x.tolist(), y))  # fmt: skip
    api_fails(tmp_path, r"^cis.train train_data: a tuple of 3 \(ndarray, ndarray, ndarray\); expected a tuple \(x, y\)",
              (x, y, y))  # fmt: skip
    bad = np.arange(40) % 4
    bad[17] = 9
    api_fails(tmp_path, r"^cis.train train_data: sample 17 has label 9; expected labels 0..3", Tokens(bad))
    api_fails(tmp_path, r"^cis.train train_data: sample 2 has label 2; expected labels 0..1", (x, y),
              classes=["a", "b"])  # fmt: skip
    api_fails(tmp_path, r"^cis.train train_data: every sample has label 0", (x, np.zeros(60, np.int64)),
              classes=["a", "b"])  # fmt: skip


def test_python_api_unknown_setting_is_one_line_naming_the_known_ones(tmp_path):
    x, y = np.zeros((30, 4), np.float32), np.arange(30) % 2
    with pytest.raises(CisError, match=r"^cis.train: unknown setting 'roundz' \(did you mean 'rounds'\?\); "
                       r"expected a field of cis.training.config.RunConfig: .*\brounds\b") as info:  # fmt: skip
        cis.train(None, (x, y), roundz=3, out=tmp_path / "run")
    assert "__init__" not in str(info.value) and not (tmp_path / "run").exists()
