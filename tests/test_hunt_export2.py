"""Export of models whose carries are not float32 tensors in the usual layout, and its mistakes.

- a bool or int64 carry is verified exactly, a float one with the tolerance (docs/your-model.md: inputs and
  carries may be any tensors); the fp16 and int8 variants leave carries that are not float32 as they are;
- a body that changes its input in place (``nn.ReLU(inplace=True)`` first, ``x.mul_(2)``) still verifies;
- ``--exporter dynamo --opset 17`` is refused, not silently raised to 18;
- a carry with the batch off axis 0, or a size the exporter cannot prove, names the tensor, the cause and the fix;
- a run whose model file is gone names the recorded path and what to do (not a --model flag).

Stages are exported with the real torch exporter and run with the real onnxruntime; the runs are untrained
user models on the digits data (1 x 8 x 8 images, 10 classes), saved without training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
nn = torch.nn

from cis.core.errors import CisError  # noqa: E402
from cis.exporter.onnx_export import ExportError, export_stage, resolve_exporter  # noqa: E402
from cis.exporter.verify import VerificationError, verify_stages  # noqa: E402
from cis.training.models.contract import EarlyExitNet  # noqa: E402
from cis.training.models.stage_plan import describe_stages  # noqa: E402

MODELS = '''
import torch
from torch import nn


def head(c, num_classes):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


class Ids(nn.Module):  # stage 1's carry: int64 ids (the channel argmax), (N, 8, 8)
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, 16, 3, 1, 1)

    def forward(self, x):
        return self.conv(x).argmax(1)


class IdsHead(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.emb, self.fc = nn.Embedding(16, 8), nn.Linear(8, num_classes)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean((1, 2)))


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, ids):
        return self.emb(ids).permute(0, 3, 1, 2)


class Double(nn.Module):  # stage 1's carry: float64
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, 8, 3, 1, 1)

    def forward(self, x):
        return self.conv(x).double()


class Float(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.m = module

    def forward(self, f):
        return self.m(f.float())


def int_carry(num_classes, input_shape):
    c = input_shape[0]
    return [(Ids(c), IdsHead(num_classes)), (Embed(), head(8, num_classes)),
            (nn.Conv2d(8, 8, 3, 2, 1), head(8, num_classes))]


def double_carry(num_classes, input_shape):
    c = input_shape[0]
    return [(Double(c), Float(head(8, num_classes))), (Float(nn.Conv2d(8, 8, 3, 2, 1)), head(8, num_classes)),
            (nn.Conv2d(8, 8, 3, 2, 1), head(8, num_classes))]


def plain(num_classes, input_shape):
    c = input_shape[0]
    return [(nn.Conv2d(c, 8, 3, 1, 1), head(8, num_classes)), (nn.Conv2d(8, 8, 3, 2, 1), head(8, num_classes)),
            (nn.Conv2d(8, 8, 3, 2, 1), head(8, num_classes))]
'''


def saved_run(tmp_path: Path, factory: str) -> Path:
    """An untrained user model from ``MODELS`` saved as a run on the digits data (paper-7, 60-30-10)."""
    from cis.core.spec import spec_to_dict
    from cis.core.topologies import make_spec
    from cis.training.checkpoint import save_checkpoint
    from cis.training.models.model_ref import user_model

    path = tmp_path / "models.py"
    path.write_text(MODELS)
    torch.manual_seed(0)
    model = user_model(f"{path}:{factory}", {}, {"num_classes": 10, "input_shape": (1, 8, 8)}, torch.float32)
    meta = {"classes": [str(i) for i in range(10)], "normalisation": {"mean": None, "std": None},
            "dataset": "digits", "seed": 0, "method": "cis", "spec": spec_to_dict(make_spec("paper-7", "60-30-10"))}
    run = tmp_path / f"run-{factory}"
    save_checkpoint(run, model.eval(), meta)
    return run


def head(c: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 3))


def exported(model: EarlyExitNet):
    """(plan, onnxruntime runners of the fp32 stage graphs) of ``model`` (input 1 x 8 x 8)."""
    from cis.exporter.bundle_writer import _runners, _variant

    plan = describe_stages(model.eval())
    carry = plan.example_inputs(2, torch.Generator().manual_seed(0))
    models = []
    for st in plan.stages:
        args = tuple(carry[n].clone() for n in st.inputs)
        models.append(export_stage(st, args))
        with torch.no_grad():
            outs = st.module(*(a.clone() for a in args))
        carry = dict(zip(st.outputs, outs))
    _, infos = _variant(plan, models, "fp32", {})
    return plan, _runners(models, infos, 1)


def batches(plan):
    gen = torch.Generator().manual_seed(1)
    return {"batch1": plan.example_inputs(1, gen), "batch17": plan.example_inputs(17, gen)}


class Mask(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, 1, 1)

    def forward(self, x):
        return self.conv(x) > 0.0


class FromMask(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.m = module

    def forward(self, f):
        return self.m(f.float())


def test_a_bool_carry_is_verified_exactly():
    model = EarlyExitNet([(Mask(), FromMask(head(8))), (FromMask(nn.Conv2d(8, 8, 3, 2, 1)), head(8))],
                         input_shape=(1, 8, 8))
    plan, runners = exported(model)
    report = verify_stages(plan, runners, batches(plan))
    assert report["passed"] and report["max_abs_diff"] <= 1e-4
    with torch.no_grad():  # the torch model changes after the export: the graph's mask no longer matches
        model.stage_list[0].body.conv.bias += 0.5
    with pytest.raises(VerificationError, match=r"stage 1 vs torch at batch1 \(batch 1\): output 'features_1' "
                                                r"\(bool\) differs in \d+ of 512 values; expected an exact match"):
        verify_stages(plan, runners, batches(plan))


class InPlaceRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, 2, 1))

    def forward(self, x):
        return self.body(x)


class Doubles(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, 2, 1)

    def forward(self, x):
        x.mul_(2)
        return self.conv(x)


@pytest.mark.parametrize("body", [InPlaceRelu, Doubles])
def test_a_body_that_changes_its_input_in_place_still_verifies(body):
    """Pre-activation style (stage 2 starts with ReLU(inplace=True)) and x.mul_(2): a correct model."""
    model = EarlyExitNet([(nn.Conv2d(1, 8, 3, 1, 1), head(8)), (body(), head(8)), (body(), head(8))],
                         input_shape=(1, 8, 8))
    plan, runners = exported(model)
    feeds = batches(plan)
    before = {k: {n: t.clone() for n, t in f.items()} for k, f in feeds.items()}
    report = verify_stages(plan, runners, feeds)
    assert report["passed"] and report["max_abs_diff"] <= 1e-4
    for k, f in feeds.items():  # the caller's batches are left as they were
        for n, t in f.items():
            assert torch.equal(t, before[k][n])


@pytest.mark.parametrize("factory, dtype, carry", [("int_carry", "int8", "int64"), ("double_carry", "fp16",
                                                                                     "float64")])
def test_a_carry_that_is_not_float32_exports_and_stays_as_it_is_in_the_variants(tmp_path, one_torch_thread,
                                                                                 factory, dtype, carry):
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import run_chain
    from cis.exporter.bundle_writer import export_bundle
    from cis.training.data.loading import load_dataset

    report = export_bundle(saved_run(tmp_path, factory), tmp_path / "bundle", feature_dtype=dtype,
                           latency_repeats=1, latency_batches=(1,))
    assert report["verification"]["passed"]
    dtypes = report["feature_dtypes"]
    assert "carries_as_is" not in dtypes["fp32"]
    assert dtypes["fp16"]["carries_as_is"] == dtypes["int8"]["carries_as_is"] == {"features_1": carry}
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    stages = manifest["stages"]
    out1 = {t["name"]: t["dtype"] for t in stages[0]["outputs"]}
    out2 = {t["name"]: t["dtype"] for t in stages[1]["outputs"]}
    assert out1["features_1"] == carry and stages[1]["inputs"][0]["dtype"] == carry
    assert out2["features_2"] == {"fp16": "float16", "int8": "int8"}[dtype]  # a float32 carry is converted
    val = load_dataset("digits", seed=0).val
    logits = run_chain(load_bundle(tmp_path / "bundle"), val.x)
    assert logits[3].shape == (len(val), 10) and np.isfinite(logits[3]).all()


def test_apply_feature_dtype_converts_only_float32_carries():
    from cis.exporter.quantize import apply_feature_dtype

    class Ids(nn.Module):
        def forward(self, x):
            return x.argmax(1)

    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8, 4)

        def forward(self, ids):
            return self.emb(ids).flatten(1)

    model = EarlyExitNet([(Ids(), nn.Sequential(nn.Flatten(), nn.Linear(8, 3))), (Emb(), nn.Linear(32, 3))],
                         input_shape=(8, 8))
    plan = describe_stages(model.eval())
    st = plan.stages[1]
    graph = export_stage(st, (torch.zeros(2, 8, dtype=torch.int64),))
    for dtype in ("fp16", "int8"):
        assert apply_feature_dtype(graph, st.inputs, st.carry, dtype, {}) is graph  # nothing to convert


def test_dynamo_with_an_opset_below_18_is_refused(run_cli, tmp_path):
    r = run_cli("export", tmp_path / "run", "--out", tmp_path / "b", "--exporter", "dynamo", "--opset", "17")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "--opset 17: the dynamo exporter writes opset 18 or newer; expected --opset >= 18" in r.err
    assert not (tmp_path / "b").exists()
    assert resolve_exporter("dynamo", None, strict=True) == ("dynamo", 18)
    assert resolve_exporter("dynamo", 19, strict=True) == ("dynamo", 19)
    assert resolve_exporter("torchscript", None, strict=True) == ("torchscript", 17)
    assert resolve_exporter("dynamo", 17) == ("dynamo", 18)  # export_stage alone still raises it


class SeqFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        return self.fc(x).transpose(0, 1)  # (8, N, 16): the batch on axis 1


class Sort(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=2)[0]


class MeanHead(nn.Module):
    def __init__(self, axis: int, width: int):
        super().__init__()
        self.axis, self.fc = axis, nn.Linear(width, 3)

    def forward(self, f):
        return self.fc(f.mean(self.axis).flatten(1))


@pytest.mark.parametrize("body, shape, head_of, message", [
    (SeqFirst, (8, 8), (0, 16), r"stage 1: tensor 'features_1' has shape \(.*\) in the exported graph: the batch is on "
                       r"axis 1; expected the batch on axis 0 of every input, output and carry and every other "
                       r"dimension fixed: return it batch-first"),
    (Sort, (1, 8, 8), (1, 64), r"stage 1: tensor 'features_1' has shape \(batch, .*\) in the exported graph: "
                               r"dimension \d is not fixed; expected the batch on axis 0 .*torch.sort.*--exporter "
                               r"dynamo"),
])
def test_a_carry_off_the_usual_layout_names_the_tensor_the_cause_and_the_fix(body, shape, head_of, message):
    model = EarlyExitNet([(body(), MeanHead(*head_of)), (nn.Identity(), MeanHead(*head_of))], input_shape=shape)
    plan = describe_stages(model.eval())
    with pytest.raises(ExportError, match=message) as err:
        export_stage(plan.stages[0], (plan.example_inputs(2)["input"],))
    assert "\n" not in str(err.value)


def test_a_run_whose_model_file_is_gone_names_the_recorded_path(run_cli, tmp_path):
    run = saved_run(tmp_path, "plain")
    (tmp_path / "models.py").unlink()
    r = run_cli("export", run, "--out", tmp_path / "b")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    assert "--model '" not in r.err
    assert f"the run's model file {tmp_path / 'models.py'} (model {tmp_path / 'models.py'}:plain) is not there" in r.err
    assert "restore it there, or train again with --model" in r.err
    assert not (tmp_path / "b").exists()
    with pytest.raises(CisError, match="is not there"):
        from cis.exporter.bundle_writer import export_bundle

        export_bundle(run, tmp_path / "b")


def test_evaluate_of_a_run_whose_model_file_is_gone_names_the_run_not_a_flag(run_cli, tmp_path):
    """evaluate, --resume and --init rebuild the recorded model the same way (model_ref.user_model)."""
    run = saved_run(tmp_path, "plain")
    (tmp_path / "models.py").unlink()
    r = run_cli("evaluate", run)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    assert "--model '" not in r.err and f"the run's model '{tmp_path / 'models.py'}:plain'" in r.err
    assert "restore it there, or train again with --model" in r.err
