"""Your model: the public contract, model references, starting weights, and every model-side bad input.

Model files are written to pytest's tmp dir (outside the repo) and import nothing from cis.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from cis.core.errors import CisError  # noqa: E402
from cis.training.models.contract import EarlyExitNet, ExitHead, TokenHead, check_chain, default_head  # noqa: E402
from cis.training.models.model_ref import build_model, is_own, parse_model_args, parse_reference, user_model  # noqa: E402
from cis.training.weights_file import load_weights  # noqa: E402

CNN = '''
import torch
from torch import nn


def block(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.BatchNorm2d(o), nn.ReLU())


def head(c, num_classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def make(num_classes, input_shape, width=8):
    c, w = input_shape[0], width
    return [(block(c, w, 1), head(w, num_classes)), (block(w, 2 * w, 2), head(2 * w, num_classes)),
            (block(2 * w, 4 * w, 2), head(4 * w, num_classes))]
'''

TOKENS = '''
import torch
from torch import nn


class Embed(nn.Module):
    def __init__(self, vocab, length, dim):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, length, dim))

    def forward(self, ids):
        return self.tok(ids) + self.pos


class MeanHead(nn.Module):
    def __init__(self, dim, num_classes):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, h):
        return self.fc(self.norm(h.mean(dim=1)))


def layer(dim):
    return nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True)


def make(num_classes, input_shape, vocab=16, dim=16):
    length = input_shape[0]
    first = nn.Sequential(Embed(vocab, length, dim), layer(dim))
    return [(first, MeanHead(dim, num_classes)), (layer(dim), MeanHead(dim, num_classes)),
            (layer(dim), MeanHead(dim, num_classes))]
'''


def write(tmp_path, text, name="model.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def cnn_model(tmp_path, **args):
    ref = f"{write(tmp_path, CNN)}:make"
    return user_model(ref, args, {"num_classes": 10, "num_exits": 3, "input_shape": (1, 8, 8)}, torch.float32)


def test_a_list_of_body_head_pairs_is_an_early_exit_model():
    pairs = [(nn.Linear(4, 8), nn.Linear(8, 3)), (nn.Linear(8, 8), nn.Linear(8, 3))]
    model = EarlyExitNet(pairs, input_shape=(4,))
    x = torch.randn(5, 4)
    assert [tuple(t.shape) for t in model(x)] == [(5, 3), (5, 3)]
    assert len(model(x, upto=1)) == 1 and model.num_exits == 2 and model.input_shape == (4,)
    assert set(model.exit_state_keys(1)) == {"stage_list.0.body.weight", "stage_list.0.body.bias",
                                             "stage_list.0.head.weight", "stage_list.0.head.bias"}
    with pytest.raises(CisError, match="expected an exit in 1..2"):
        model(x, upto=3)


def test_default_heads_follow_the_carry_rank():
    assert isinstance(default_head(torch.zeros(2, 8, 4, 4), 5), ExitHead)
    tokens = default_head(torch.zeros(2, 6, 16), 5, tokens="cls")
    assert isinstance(tokens, TokenHead) and tokens(torch.randn(2, 6, 16)).shape == (2, 5)
    seq = default_head(torch.zeros(2, 12, 30), 5, tokens="channels")  # (N, C, L) of a 1-D CNN
    assert seq.fc.in_features == 12 and seq(torch.randn(2, 12, 30)).shape == (2, 5)
    assert isinstance(default_head(torch.zeros(2, 16), 5), nn.Linear)
    with pytest.raises(CisError, match="expected 2-D"):
        default_head(torch.zeros(2), 5)


def test_a_factory_gets_the_data_arguments_and_its_record_rebuilds_it(tmp_path):
    model = cnn_model(tmp_path, width=4)
    record = json.loads(json.dumps(model.config()))
    assert record["reference"] == f"{tmp_path / 'model.py'}:make"
    assert record["args"] == {"width": 4, "num_classes": 10, "input_shape": [1, 8, 8]}
    assert record["input_shape"] == [1, 8, 8] and record["input_dtype"] == "float32" and len(record["sha256"]) == 64
    clone = build_model(record)
    clone.load_state_dict(model.state_dict())
    x = torch.randn(3, 1, 8, 8)
    model.eval(), clone.eval()
    for a, b in zip(model(x), clone(x)):
        torch.testing.assert_close(a, b)


def test_model_args_read_json_lists_and_text():
    got = parse_model_args(["depth=4", "rate=0.5", "norm=true", "exits=1,4,8", "name=small", "sizes=[2, 3]"])
    assert got == {"depth": 4, "rate": 0.5, "norm": True, "exits": [1, 4, 8], "name": "small", "sizes": [2, 3]}
    with pytest.raises(CisError, match="expected KEY=VALUE"):
        parse_model_args(["depth"])


def test_a_module_reference_imports_from_the_working_directory(tmp_path, monkeypatch):
    pkg = tmp_path / "mymodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cnn.py").write_text(CNN)
    monkeypatch.chdir(tmp_path)
    model = user_model("mymodels.cnn:make", {}, {"num_classes": 10, "input_shape": (1, 8, 8)}, torch.float32)
    assert model.num_exits == 3 and model.config()["reference"] == "mymodels.cnn:make"
    import hashlib

    assert model.config()["sha256"] == hashlib.sha256((pkg / "cnn.py").read_bytes()).hexdigest()
    assert is_own(parse_reference("cis.training.architectures:resnet18"))  # cis's own factories record no hash


BAD_FILES = {
    "syntax": ("def make(:\n", "make", "importing .* failed \\(SyntaxError"),
    "import": ("import not_a_module_here\n", "make", "importing .* failed \\(ModuleNotFoundError"),
    "no-name": ("def other():\n    pass\n", "make", "has no 'make'; expected a callable of that name"),
    "not-callable": ("make = 3\n", "make", ":make is a int; expected a callable"),
    "raises": ("def make(num_classes):\n    raise ValueError('too small')\n", "make", "raised ValueError: too small"),
    "one-module": ("import torch\ndef make():\n    return torch.nn.Linear(2, 2)\n", "make",
                   "returned a Linear \\(one torch module\\); expected a list of \\(body, head\\) pairs"),
    "number": ("def make():\n    return 3\n", "make", "returned a int; expected a list of \\(body, head\\) pairs"),
    "empty": ("def make():\n    return []\n", "make", "returned an empty list"),
    "not-pairs": ("import torch\ndef make():\n    return [(torch.nn.Linear(2, 2),)]\n", "make",
                  "stage 1 is \\(Linear\\); expected a list of \\(body, head\\) pairs"),
    "unknown-arg": ("def make(num_classes):\n    return []\n", "make", "no argument 'depth'; it takes num_classes"),
    "missing-arg": ("def make(depth):\n    return []\n", "make", "needs 'depth'; pass --model-arg depth=VALUE"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_reference_and_factory_mistakes_are_one_line(tmp_path, case):
    text, factory, message = BAD_FILES[case]
    ref = f"{write(tmp_path, text, f'bad_{case}.py')}:{factory}"
    args = {"depth": 2} if case == "unknown-arg" else {}
    with pytest.raises(CisError, match=message) as err:
        user_model(ref, args, {"num_classes": 10, "input_shape": (1, 8, 8)}, torch.float32)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ref, message", [
    ("model.py", "--model 'model.py': expected PATH.py:NAME or pkg.module:NAME"),
    ("nowhere/model.py:make", "file .* not found"),
    ("model.py:1make", "expected PATH.py:NAME or pkg.module:NAME"),
    ("not_a_package_anywhere.models:make", "module 'not_a_package_anywhere.models' not found"),
])
def test_references_that_name_nothing_are_one_line(ref, message):
    with pytest.raises(CisError, match=message):
        user_model(ref, {}, {"input_shape": (1,)}, torch.float32)


def test_a_body_that_cannot_take_the_previous_output_names_both_stages_and_shapes():
    pairs = [(nn.Conv2d(1, 4, 3, padding=1), default_head(torch.zeros(1, 4, 8, 8), 10)),
             (nn.Conv2d(8, 8, 3), default_head(torch.zeros(1, 8, 6, 6), 10))]
    with pytest.raises(CisError, match=r"stage 2's body cannot take stage 1's body output of shape \(2, 4, 8, 8\)"):
        check_chain(EarlyExitNet(pairs), torch.zeros(2, 1, 8, 8), 10)
    pairs = [(nn.Conv2d(1, 4, 3, padding=1), nn.Sequential(nn.Flatten(), nn.Linear(256, 7)))]
    with pytest.raises(CisError, match=r"stage 1's head returned \(2, 7\) float32; expected logits \(2, 10\)"):
        check_chain(EarlyExitNet(pairs), torch.zeros(2, 1, 8, 8), 10)
    with pytest.raises(CisError, match=r"stage 1's body cannot take the input of shape \(2, 3, 8, 8\)"):
        check_chain(EarlyExitNet(pairs), torch.zeros(2, 3, 8, 8), 10)


def test_a_model_file_changed_since_the_run_stops_unless_allowed(tmp_path, caplog):
    record = cnn_model(tmp_path).config()
    (tmp_path / "model.py").write_text(CNN + "\n# edited\n")
    with pytest.raises(CisError, match="changed since the run .*--allow-model-change"):
        build_model(record)
    with caplog.at_level(logging.WARNING, logger="cis.training.models.model_ref"):
        model = build_model(record, allow_changed=True)
    assert "changed since the run" in caplog.text and model.config()["sha256"] == record["sha256"]


def test_weights_load_in_part_and_say_what_is_missing_and_unexpected(tmp_path):
    model = cnn_model(tmp_path)
    donor = cnn_model(tmp_path)
    state = {k: v for k, v in donor.state_dict().items() if not k.startswith("stage_list.2.head.")}
    state["fc.weight"] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "w.pt")
    lines: list[str] = []
    report = load_weights(model, tmp_path / "w.pt", lines.append)
    assert len(lines) == 3 and "missing 2" in lines[1] and "stage_list.2.head.2.weight" in lines[1]
    assert "unexpected 1" in lines[2] and "fc.weight" in lines[2]
    torch.testing.assert_close(model.state_dict()["stage_list.0.body.0.weight"], donor.state_dict()[
        "stage_list.0.body.0.weight"])
    assert report["missing"] == ["stage_list.2.head.2.weight", "stage_list.2.head.2.bias"]
    # a backbone's own names load into the stage bodies cut from it (names one body has alone)
    from collections import OrderedDict

    cut = EarlyExitNet([(nn.Sequential(OrderedDict(stem=nn.Linear(4, 4))), nn.Linear(4, 2)),
                        (nn.Sequential(OrderedDict(block=nn.Linear(4, 4))), nn.Linear(4, 2))])
    torch.save({"state_dict": {"stem.weight": torch.ones(4, 4), "block.bias": torch.ones(4)}}, tmp_path / "b.pt")
    load_weights(cut, tmp_path / "b.pt", lines.append)
    assert torch.all(cut.state_dict()["stage_list.0.body.stem.weight"] == 1)
    assert torch.all(cut.state_dict()["stage_list.1.body.block.bias"] == 1)


@pytest.mark.parametrize("blob, message", [
    ({"stage_list.0.body.0.weight": torch.zeros(2, 2)}, r"has shape \(2, 2\); the model's .* has \(8, 1, 3, 3\)"),
    ({"conv.weight": torch.zeros(1)}, "none of its 1 tensors has a name of the model's"),
    ([1, 2], "not a state dict"),
])
def test_weights_that_do_not_fit_are_one_line(tmp_path, blob, message):
    torch.save(blob, tmp_path / "w.pt")
    with pytest.raises(CisError, match=message):
        load_weights(cnn_model(tmp_path), tmp_path / "w.pt", lambda s: None)
    with pytest.raises(CisError, match="file not found"):
        load_weights(cnn_model(tmp_path), tmp_path / "missing.pt", lambda s: None)


@pytest.mark.parametrize("method", ["reefl", "inclusivefl", "scalefl", "nefl", "heterofl"])
def test_a_method_with_its_own_architecture_refuses_a_user_model(method):
    from cis.training.config import make_config

    with pytest.raises(CisError, match=f"--model: method '{method}' .*; a model of your own trains with --method cis"):
        make_config({}, {"method": method, "model": "model.py:make"})
    for ok in ("cis", "depthfl", "exclusivefl", "flame"):
        assert make_config({}, {"method": ok, "model": "model.py:make"}).model == "model.py:make"
    with pytest.raises(CisError, match="--weights and --init"):
        make_config({}, {"weights_file": "w.pt", "init": "run"})


def _token_splits(n=240, length=6, vocab=16, seed=0):
    from cis.training.data.loading import Dataset, DataSplits

    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, (n, length)).astype(np.int64)
    y = (x[:, 0] % 4).astype(np.int64)  # the first token decides the class
    part = [Dataset(x[a:b], y[a:b], ["a", "b", "c", "d"], [], [], "tokens") for a, b in ((0, 160), (160, 200),
                                                                                       (200, 240))]
    return DataSplits(*part)


def test_a_token_id_model_trains_exports_with_int64_inputs_and_takes_an_int_npz(tmp_path, one_torch_thread):
    from cis.core.input_files import load_npz
    from cis.core.stages.runner import run_chain
    from cis.exporter.bundle_writer import export_bundle
    from cis.training.checkpoint import save_checkpoint
    from cis.training.config import make_config
    from cis.training.run import build_setup, checkpoint_meta

    ref = f"{write(tmp_path, TOKENS, 'tokens.py')}:make"
    splits = _token_splits()
    config = make_config({}, {"model": ref, "rounds": 2, "batch_size": 16, "local_steps": 2, "serving": "60-30-10"})
    s = build_setup(config, splits=splits)
    assert s.model.input_dtype == torch.int64 and s.model.input_shape == (6,)
    for _ in range(2):
        s.engine.run_round()
    run = tmp_path / "run"
    save_checkpoint(run, s.engine.model, checkpoint_meta(s))
    report = export_bundle(run, tmp_path / "bundle", val=splits.val, latency_repeats=1, latency_batches=(1,))
    assert report["verification"]["passed"]
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["stages"][0]["inputs"] == [{"name": "input", "shape": [None, 6], "dtype": "int64"}]
    assert manifest["inputs"] == [{"name": "input", "dtype": "int64", "shape": [None, 6],
                                   "preprocessing": {"kind": "none"}, "index_range": [0, 16]}]  # the embedding's
    assert manifest["model"]["reference"] == ref and manifest["model"]["input_dtype"] == "int64"
    from cis.core.bundle import load_bundle

    bundle = load_bundle(tmp_path / "bundle")
    np.savez(tmp_path / "ids.npz", x=splits.test.x.astype(np.int32), y=splits.test.y)
    got = load_npz(tmp_path / "ids.npz", bundle)
    assert got.x.dtype == np.int64
    logits = run_chain(bundle, got.x)
    with torch.no_grad():
        want = s.engine.model.eval()(torch.from_numpy(got.x))
    np.testing.assert_allclose(logits[3], want[2].numpy(), atol=1e-4)
    np.savez(tmp_path / "oov.npz", x=np.full((2, 6), 16, np.int64), y=np.zeros(2, np.int64))
    with pytest.raises(CisError, match=r"holds 16 at position 0 of x; the bundle.s model takes token ids 0\.\.15"):
        load_npz(tmp_path / "oov.npz", bundle)
    np.savez(tmp_path / "floats.npz", x=splits.test.x.astype(np.float32))
    with pytest.raises(CisError, match="has dtype float32; the bundle's model takes int64"):
        load_npz(tmp_path / "floats.npz", bundle)


def test_a_stage_that_cannot_be_exported_names_the_stage_and_the_operator(capfd):
    """One line, and nothing else: the torchscript exporter's C++ log (the graph it failed in) stays off fd 1."""
    import ctypes

    from cis.exporter.onnx_export import ExportError, export_stage
    from cis.training.models.stage_plan import describe_stages

    class Cummax(nn.Module):
        def forward(self, x):
            return torch.cummax(x, dim=1).values

    model = EarlyExitNet([(nn.Linear(4, 4), nn.Linear(4, 3)), (Cummax(), nn.Linear(4, 3))], input_shape=(4,))
    plan = describe_stages(model)
    with pytest.raises(ExportError, match="stage 2: cannot be exported to ONNX: operator aten::cummax") as err:
        export_stage(plan.stages[1], (torch.randn(2, 4),))
    assert "\n" not in str(err.value)
    ctypes.CDLL(None).fflush(None)  # what C stdio still buffers reaches fd 1 now
    assert "Torch IR graph" not in capfd.readouterr().out
