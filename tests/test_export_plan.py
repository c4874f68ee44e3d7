"""The stage description protocol: a model that is not an EarlyExitNet exports
through the same code when it describes its own stages.

The toy model forwards two carry tensors (a hidden state and a running count,
like a token state with a CLS history or FLAME's patience state) and passes the
raw input along (like a nested model).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from torch import nn  # noqa: E402

from cis.core.bundle import StageInfo  # noqa: E402
from cis.core.errors import CisError  # noqa: E402
from cis.core.stages.runner import StageRunner, run_stages  # noqa: E402
from cis.exporter.onnx_export import export_stage, tensor_infos  # noqa: E402
from cis.exporter.quantize import apply_feature_dtype, calibrate_int8, dequantize_np, quantize_np  # noqa: E402
from cis.exporter.verify import VerificationError, verify_stages  # noqa: E402
from cis.training.models.stage_plan import ExportStage, StagePlan, describe_stages, run_plan  # noqa: E402

D, C = 12, 4


class _First(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.head = nn.Linear(D, D), nn.Linear(D, C)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        return self.head(h), h, torch.ones_like(x[:, :1]), x


class _Next(nn.Module):
    def __init__(self, last):
        super().__init__()
        self.mix, self.head, self.last = nn.Linear(2 * D, D), nn.Linear(D, C), last

    def forward(self, h, count, x):
        h = torch.relu(self.mix(torch.cat([h, x], dim=1)))
        logits = self.head(h) / count
        return (logits,) if self.last else (logits, h, count + 1, x)


class Toy(nn.Module):
    """Three exits; stage k reads the hidden state, a counter and the raw input of stage k-1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.s = nn.ModuleList([_First(), _Next(False), _Next(True)])

    def forward(self, x):
        out, (l1, h, c, xx) = [], self.s[0](x)
        out.append(l1)
        l2, h, c, xx = self.s[1](h, c, xx)
        out.append(l2)
        out.append(self.s[2](h, c, xx)[0])
        return out

    def export_stages(self) -> StagePlan:
        def names(k):
            return (f"hidden_{k}", f"count_{k}", f"raw_{k}")

        stages = [ExportStage(1, 1, self.s[0], ("input",), names(1))]
        stages.append(ExportStage(2, 2, self.s[1], names(1), names(2)))
        stages.append(ExportStage(3, 3, self.s[2], names(2), ()))
        return StagePlan(stages, {"input": (D,)}, lambda feeds: self(feeds["input"]))


def _export_all(plan, exporter="torchscript"):
    models, infos, carry = [], [], plan.example_inputs(3)
    outs = run_plan(plan, carry)
    for st, o in zip(plan.stages, outs):
        m = export_stage(st, tuple(carry[n] for n in st.inputs), 17, exporter)
        models.append(m)
        infos.append(
            StageInfo(
                st.index,
                st.exit,
                f"stage{st.index}.onnx",
                tensor_infos(m.graph.input),
                tensor_infos(m.graph.output),
                0,
                0,
            )
        )
        carry = {n: o[n] for n in st.carry}
    return models, infos


def test_toy_plan_exports_and_verifies():
    plan = describe_stages(Toy())
    models, infos = _export_all(plan)
    assert [i.name for i in infos[1].inputs] == ["hidden_1", "count_1", "raw_1"]
    assert [o.name for o in infos[1].outputs] == ["logits", "hidden_2", "count_2", "raw_2"]
    runners = [StageRunner.from_model(m.SerializeToString(), i) for m, i in zip(models, infos)]
    batches = {"batch1": plan.example_inputs(1), "batch17": plan.example_inputs(17)}
    report = verify_stages(plan, runners, batches)
    assert report["passed"] and report["max_abs_diff"] <= 1e-4


def test_verification_failure_reports_numbers():
    plan = describe_stages(Toy())
    models, infos = _export_all(plan)
    other = Toy()
    with torch.no_grad():
        other.s[2].head.bias.add_(1.0)  # the torch side no longer matches stage 3's graph
    runners = [StageRunner.from_model(m.SerializeToString(), i) for m, i in zip(models, infos)]
    with pytest.raises(
        VerificationError, match=r"stage 3 vs torch at batch1 \(batch 1\): max abs diff [0-9.e+-]+ > 0.0001"
    ):
        verify_stages(describe_stages(other), runners, {"batch1": plan.example_inputs(1)})


def test_int8_and_fp16_boundaries_on_several_carries():
    plan = describe_stages(Toy())
    models, _ = _export_all(plan)
    feeds = plan.example_inputs(17)
    outs = run_plan(plan, feeds)
    samples = {n: [o[n].numpy()] for st, o in zip(plan.stages, outs) for n in st.carry}
    qp = calibrate_int8(samples)
    assert set(qp) == {f"{a}_{k}" for a in ("hidden", "count", "raw") for k in (1, 2)}
    for dtype, np_dtype in (("fp16", np.float16), ("int8", np.int8)):
        runners = []
        for st, m in zip(plan.stages, models):
            vm = apply_feature_dtype(m, () if st.index == 1 else st.inputs, st.carry, dtype, qp)
            info = StageInfo(st.index, st.exit, "x", tensor_infos(vm.graph.input), tensor_infos(vm.graph.output), 0, 0)
            assert all(t.dtype == np.dtype(np_dtype).name for t in info.carry_outputs)
            runners.append(StageRunner.from_model(vm.SerializeToString(), info))
        logits, _ = run_stages(runners, {"input": feeds["input"].numpy()})
        ref = plan.reference(feeds)
        for e in (1, 2, 3):
            assert np.abs(logits[e] - ref[e - 1].detach().numpy()).max() < (1e-2 if dtype == "fp16" else 0.15)
    # the graph's quantiser is ONNX QuantizeLinear: same as the numpy reference
    scale, zp = qp["hidden_1"]
    h = outs[0]["hidden_1"].numpy()
    vm = apply_feature_dtype(models[0], (), plan.stages[0].carry, "int8", qp)
    info = StageInfo(1, 1, "x", tensor_infos(vm.graph.input), tensor_infos(vm.graph.output), 0, 0)
    q = StageRunner.from_model(vm.SerializeToString(), info).run({"input": feeds["input"].numpy()})["hidden_1"]
    assert np.abs(q.astype(int) - quantize_np(h, scale, zp).astype(int)).max() <= 1
    assert np.abs(dequantize_np(q, scale, zp) - h).max() <= scale


def test_bad_plans_refused():
    toy = Toy()
    plan = toy.export_stages()
    plan.stages[1] = ExportStage(2, 2, toy.s[1], ("hidden_9", "count_1", "raw_1"), ("hidden_2", "count_2", "raw_2"))
    with pytest.raises(CisError, match="stage 2 reads 'hidden_9'"):
        plan.validate()
    plan = toy.export_stages()
    plan.stages[1] = ExportStage(2, 2, toy.s[1], ("hidden_1", "count_1", "raw_1"), ("hidden_1", "count_2", "raw_2"))
    with pytest.raises(CisError, match="reads and returns 'hidden_1'"):
        plan.validate()
    with pytest.raises(CisError, match="cannot cut it into stages"):
        describe_stages(nn.Linear(2, 2))


def test_dynamo_exporter_gives_a_static_graph():
    """The torch.export-based exporter (opset 18) works through the same code."""
    from cis.training.architectures import build_model
    from cis.training.models.cnns import default_model_config

    plan = describe_stages(build_model(default_model_config("digits", width=0.25)))
    st = plan.stages[0]
    m = export_stage(st, (plan.example_inputs(2)["input"],), 17, "dynamo")
    assert next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 18
    assert not {n.op_type for n in m.graph.node} & {"If", "Loop"}
    info = StageInfo(1, 1, "x", tensor_infos(m.graph.input), tensor_infos(m.graph.output), 0, 0)
    x = plan.example_inputs(17)
    got = StageRunner.from_model(m.SerializeToString(), info).run({"input": x["input"].numpy()})
    ref = run_plan(plan, x)[0]
    assert np.abs(got["features_1"] - ref["features_1"].numpy()).max() <= 1e-4
