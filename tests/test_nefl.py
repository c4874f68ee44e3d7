import pytest
import torch

from cis.training.aggregation.averages import average_selections
from cis.training.families.nested import build_subset_method, subset_model, tier_matrix
from cis.training.federated import FederatedEngine
from cis.training.local import Client
from cis.training.methods.nested import NestedNet, build_nested, depthfl_specs, init_steps, nefl_specs
from cis.training.methods.resnet import LAYOUTS, CompactResNet
from cis.training.methods.slicing import kept_channels, prefix, width_ratio
from cis.training.selection import gather, put_, scatter_, take

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_width_ratio_is_a_parameter_ratio_and_channels_floor():
    assert width_ratio(0.25) == pytest.approx(0.5)
    assert kept_channels(16, 0.5) == 8 and kept_channels(16, 0.125) == 2 and kept_channels(3, 0.1) == 1


def test_take_and_put_slice_and_write_back():
    t = torch.arange(24.0).view(4, 3, 2)
    part = take(t, (prefix(2), torch.tensor([0, 2]), None))
    assert part.shape == (2, 2, 2) and part[1, 1, 0] == t[1, 2, 0]
    put_(t, (prefix(2), torch.tensor([0, 2]), None), torch.zeros(2, 2, 2))
    assert t[:2, [0, 2]].abs().sum() == 0 and t[:2, 1].abs().sum() > 0 and t[2:].abs().sum() > 0


def test_submodel_gather_scatter_round_trip_touches_only_its_slice():
    layout = LAYOUTS["digits"]
    model = NestedNet(layout, nefl_specs(layout, [0.25, 1.0], "W"))
    state = model.state_dict()
    before = {k: v.clone() for k, v in state.items()}
    sel = model.selection(1)
    compact = gather(state, sel)
    assert compact["stem.weight"].shape == (4, 1, 3, 3)  # 8 channels * sqrt(0.25)
    net = CompactResNet(layout, model.widths(1), steps=[1.0] * 3)
    net.load_state_dict(compact)  # shapes agree
    scatter_(state, {k: v + 1 for k, v in compact.items()}, sel)
    w = state["shared.stem.weight"]
    assert torch.allclose(w[:4], before["shared.stem.weight"][:4] + 1)
    assert torch.equal(w[4:], before["shared.stem.weight"][4:])
    assert torch.equal(state["sub_bns.1.bns.stem_bn.weight"], before["sub_bns.1.bns.stem_bn.weight"])
    assert torch.allclose(state["steps"][0], before["steps"][0] + 1) and torch.equal(
        state["steps"][1], before["steps"][1]
    )


def test_nefedavg_rings_paper_example():
    """A block in sub-models 1, 3, 5 trained by 2, 3, 2 clients: its rings average over 2, 5 and 7 clients."""
    g = {"w": torch.full((8,), -1.0)}
    widths = {1: 2, 3: 4, 5: 6}  # elements 6, 7 belong to no sub-model this round
    values = {1: [1.0, 2.0], 3: [3.0, 4.0, 5.0], 5: [6.0, 7.0]}
    updates = [
        ({"w": torch.full((widths[k],), v)}, {"w": ("w", (prefix(widths[k]),))}, 1.0)
        for k, vs in values.items()
        for v in vs
    ]
    out = average_selections(g, updates)["w"]
    all7 = sum(sum(v) for v in values.values()) / 7
    five = (sum(values[3]) + sum(values[5])) / 5
    two = sum(values[5]) / 2
    assert torch.allclose(out, torch.tensor([all7, all7, five, five, two, two, -1.0, -1.0]))


def test_per_submodel_batchnorm_and_steps_kept_apart_in_training():
    layout = LAYOUTS["digits"]
    model = subset_model("nefl", layout, 3)
    gen = torch.Generator().manual_seed(0)
    clients = [
        Client(f"n{i}", i, 1, torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen))
        for i in range(2)
    ]
    sgd = dict(lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=8, steps=2, total_rounds=1)
    chooser, trainer, agg = build_subset_method("nefl", model, clients, sgd)
    engine = FederatedEngine(model, clients, chooser, trainer, agg, seed=0)
    before = {k: v.clone() for k, v in engine.global_state.items()}
    engine.run_round()
    after = engine.global_state
    changed = lambda k: not torch.equal(before[k], after[k])  # noqa: E731
    assert changed("sub_bns.0.bns.stem_bn.weight") and changed("sub_bns.0.bns.stem_bn.running_mean")
    assert not changed("sub_bns.1.bns.stem_bn.weight") and not changed("sub_bns.2.bns.stem_bn.running_mean")
    assert not torch.equal(before["steps"][0], after["steps"][0]) and torch.equal(
        before["steps"][1:], after["steps"][1:]
    )
    w = model.widths(1)[0]
    assert changed("shared.stem.weight") and torch.equal(
        before["shared.stem.weight"][w:], after["shared.stem.weight"][w:]
    )


def test_step_inits_D_D0_and_fixed():
    layout = LAYOUTS["resnet56"]
    mask = [1, 1] + [0] * 7
    assert init_steps(layout, mask * 3, "D")[:9] == (1.0, 1.0) + (0.0,) * 7
    assert init_steps(layout, mask * 3, "D0")[:9] == (1.0, 8.0) + (0.0,) * 7  # NeFL Table 12, gamma 0.2
    fixed = NestedNet(layout, nefl_specs(layout, [0.5, 1.0], "D", "D0"), learn_steps=False)
    assert "steps" not in dict(fixed.named_parameters()) and "steps" in fixed.state_dict()
    assert all(s.steps[b] for s in depthfl_specs(layout, [0.2]) for b in (9, 18))  # downsampling kept


def test_skipping_a_downsampling_block_is_refused():
    from cis.core.errors import CisError

    layout = LAYOUTS["digits"]
    with pytest.raises(CisError):
        CompactResNet(layout, [8] * layout.num_convs, kept=[0, 2])


def test_stages_fold_steps_carry_the_input_and_rebuild():
    layout = LAYOUTS["digits"]
    model = NestedNet(layout, nefl_specs(layout, [0.25, 0.5, 1.0], "WD"))
    with torch.no_grad():
        model.steps.mul_(1.5)
    model.eval()
    x = torch.randn(3, 1, 8, 8)
    ref = model(x)
    stages = model.stages()
    for k, st in enumerate(stages, start=1):
        out = st(x)
        assert torch.allclose(out[0], ref[k - 1], atol=1e-5)
        assert (len(out) == 1) if k == 3 else torch.equal(out[1], x)
    assert all(b.step is None for st in stages for b in st.net.blocks)
    clone = build_nested(model.config())
    clone.load_state_dict(model.state_dict())
    assert torch.allclose(clone.eval()(x)[2], ref[2])


def test_export_plan_reads_and_forwards_the_raw_input():
    stages_mod = pytest.importorskip("cis.training.models.stage_plan")
    layout = LAYOUTS["digits"]
    model = NestedNet(layout, nefl_specs(layout, [0.5, 1.0], "W"))
    plan = stages_mod.describe_stages(model)
    assert [st.inputs for st in plan.stages] == [("input",), ("input_1",)] and plan.stages[0].carry == ("input_1",)
    x = plan.example_inputs(2)
    outs = stages_mod.run_plan(plan, x)
    ref = plan.reference(x)
    assert all(torch.allclose(o["logits"], r, atol=1e-5) for o, r in zip(outs, ref))


def test_tier_matrix_rows():
    m = tier_matrix([[1], [1, 2], [2, 3]], 3)
    assert m.sum(1).tolist() == [1.0, 1.0, 1.0] and m[1, 0] == 0.5 and m[2, 0] == 0.0


def test_nested_stages_export_to_onnx_and_match():
    pytest.importorskip("onnxruntime")
    onnx_export = pytest.importorskip("cis.exporter.onnx_export")
    import onnxruntime as ort

    from cis.training.models.stage_plan import describe_stages

    layout = LAYOUTS["digits"]
    model = NestedNet(layout, nefl_specs(layout, [0.5, 1.0], "WD"))
    plan = describe_stages(model)
    x = torch.randn(2, 1, 8, 8)
    ref = model.eval()(x)
    feed = x.numpy()
    for st in plan.stages:
        graph = onnx_export.export_stage(st, (x,))
        sess = ort.InferenceSession(onnx_export.graph_bytes(graph), providers=["CPUExecutionProvider"])
        outs = sess.run(None, {st.inputs[0]: feed})
        assert abs(outs[0] - ref[st.index - 1].numpy()).max() < 1e-4
        if st.carry:
            assert (outs[1] == feed).all()
