import math

import pytest
import torch

from cis.core.errors import CisError
from cis.training.aggregation.averages import held_average, key_exit
from cis.training.architectures import build_model
from cis.training.methods import distill
from cis.training.methods.ree import Ree, ree_step
from cis.training.methods.vit import HISTORY, TOKENS, ViTEE


def tiny(**kw):
    return ViTEE(dim=16, depth=4, heads=2, exits=(1, 3, 4), **kw)


def test_ree_maps_history_to_one_more_token():
    ree = Ree(dim=16, depth=4)
    m = ree(torch.randn(5, 3, 16))
    assert m.shape == (5, 4, 16)
    assert ree.attn.qkv.out_features == 3 * 16 and ree.mlp[0].out_features == round(1.35 * 16)


def test_modulation_replaces_cls_by_last_ree_token_and_can_be_switched_off():
    ree = Ree(dim=8, depth=2)
    tokens, history = torch.randn(2, 5, 8), torch.randn(2, 1, 8)
    on, hist, feature = ree_step(ree, tokens, history, modulation=True)
    m = ree(hist)
    assert hist.shape == (2, 2, 8) and torch.equal(hist[:, -1], tokens[:, 0])
    assert torch.allclose(on[:, 0], m[:, -1]) and torch.equal(on[:, 1:], tokens[:, 1:])
    assert torch.allclose(feature, m[:, 0] + tokens[:, 0])
    off, _, _ = ree_step(ree, tokens, history, modulation=False)
    assert torch.equal(off, tokens)


def test_reefl_carry_holds_tokens_and_cls_history_and_stages_chain():
    torch.manual_seed(0)
    model = tiny(head="ree").eval()
    x = torch.randn(3, 3, 32, 32)
    carry, logits = x, []
    for k, stage in enumerate(model.stages()):
        out, carry = stage(carry)
        logits.append(out)
        assert carry[TOKENS].shape == (3, 65, 16)
        assert carry[HISTORY].shape == (3, model.config()["exits"][k], 16)
    full = model(x)
    assert all(torch.allclose(a, b) for a, b in zip(full, logits))
    assert [o.shape for o in model(x, upto=2)] == [(3, 10), (3, 10)]


def test_modulation_switch_changes_deeper_exits_only():
    torch.manual_seed(0)
    on = tiny(head="ree", modulation=True).eval()
    off = tiny(head="ree", modulation=False).eval()
    off.load_state_dict(on.state_dict())
    x = torch.randn(2, 3, 32, 32)
    a, b = on(x), off(x)
    assert torch.allclose(a[0], b[0])  # exit 1 sits after block 1: its prediction precedes any modulation
    assert not torch.allclose(a[2], b[2])


def test_reefl_state_holds_ree_and_classifier_once_and_rebuilds():
    model = tiny(head="ree")
    keys = model.state_dict().keys()
    assert sum(k.startswith("ree.") for k in keys) > 0 and not any(".ree." in k for k in keys)
    rebuilt = build_model(model.config())
    rebuilt.load_state_dict(model.state_dict())
    with pytest.raises(CisError, match="head"):
        build_model({**model.config(), "head": "mlp"})
    with pytest.raises(CisError, match="exits"):
        build_model({**model.config(), "exits": [1, 2]})


def test_exit_params_cover_what_the_exit_loss_touches():
    torch.manual_seed(0)
    model = tiny(head="exit")
    model(torch.randn(2, 3, 32, 32), upto=2)[1].sum().backward()
    touched = {id(p) for p in model.parameters() if p.grad is not None}
    assert touched == {id(p) for p in model.exit_params(2)}


def test_teacher_is_the_exit_with_the_lowest_running_loss():
    run = distill.RunningLoss(zeta=0.2)
    run.update([1.0, 0.5, 2.0])
    assert run.teacher() == 1
    run.update([0.0, 1.0, 2.0])  # one noisy batch does not flip it: 0.8 vs 0.6
    assert run.teacher() == 1
    assert torch.allclose(run.value, torch.tensor([0.8, 0.6, 2.0], dtype=torch.float64))
    for _ in range(5):
        run.update([0.0, 1.0, 2.0])
    assert run.teacher() == 0


def test_best_exit_kd_skips_teacher_and_detaches_it():
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(4, 3, requires_grad=True)
    loss = distill.best_exit_kd([a, b], teacher=1, tau=2.0)
    loss.backward()
    assert b.grad is None and a.grad is not None
    p_t, log_p_s = torch.softmax(b / 2, -1), torch.log_softmax(a / 2, -1)
    expected = (p_t * (p_t.log() - log_p_s)).sum(-1).mean() * 4
    assert torch.allclose(loss, expected)
    assert float(distill.best_exit_kd([a, a.detach().clone()], 0).detach()) == pytest.approx(0.0, abs=1e-6)


def test_distillation_weight_ramp():
    assert distill.ramp_weight(0) == pytest.approx(math.exp(-5))
    assert distill.ramp_weight(150) == pytest.approx(math.exp(-1.25))
    assert distill.ramp_weight(300) == distill.ramp_weight(1000) == 1.0


def test_held_average_weights_samples_over_holders_only():
    g = {"stage_list.0.w": torch.zeros(2), "stage_list.1.w": torch.zeros(2), "ree.w": torch.zeros(1)}
    a = {"stage_list.0.w": torch.ones(2), "stage_list.1.w": torch.full((2,), 9.0), "ree.w": torch.ones(1)}
    b = {
        "stage_list.0.w": torch.full((2,), 4.0),
        "stage_list.1.w": torch.full((2,), 5.0),
        "ree.w": torch.full((1,), 4.0),
    }
    out = held_average(g, [a, b], sizes=[1, 3], max_exits=[1, 2])
    assert torch.allclose(out["stage_list.0.w"], torch.full((2,), 3.25))
    assert torch.allclose(out["stage_list.1.w"], torch.full((2,), 5.0))  # only b holds stage 2
    assert torch.allclose(out["ree.w"], torch.full((1,), 3.25))
    assert key_exit("stage_list.1.blocks.0.fc1.weight") == 2 and key_exit("ree.pos") is None
