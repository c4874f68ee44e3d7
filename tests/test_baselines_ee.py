import pytest
import torch

from cis.training.aggregation.averages import block_deltas_distilled, masked_average
from cis.training.architectures import build_model
from cis.training.families.early_exit import build_method, method_model_config
from cis.training.federated import FederatedEngine
from cis.training.local import Client
from cis.training.methods import distill
from cis.training.methods.baselines import BudgetChooser, round_robin_budgets, scalefl_widths, width_holds
from cis.training.methods.registry import EARLY_EXIT_METHODS, method_options
from cis.training.methods.vit import ViTEE


def test_round_robin_budgets_and_exclusive_chooser():
    assert round_robin_budgets(7, 3) == [1, 2, 3, 1, 2, 3, 1]
    gen = torch.Generator().manual_seed(0)
    assert BudgetChooser([1, 2, 3, 3]).choose(1, gen) == [(0, 1), (1, 2), (2, 3), (3, 3)]
    assert BudgetChooser([1, 2, 3, 3], only_exit=3).choose(1, gen) == [(2, 3), (3, 3)]
    with pytest.raises(ValueError):
        BudgetChooser([1, 2], only_exit=3)


def test_depthfl_mutual_kd_is_zero_for_equal_exits_and_detaches_teachers():
    a = torch.randn(4, 5, requires_grad=True)
    assert float(distill.mutual_kd([a, a.clone()]).detach()) == pytest.approx(0.0, abs=1e-6)
    b = torch.randn(4, 5, requires_grad=True)
    loss = distill.mutual_kd([a, b])
    expected = distill.kl_to_teacher(a, b) + distill.kl_to_teacher(b, a)
    assert torch.allclose(loss, expected)


def test_scalefl_kd_teacher_is_the_deepest_exit():
    a, b = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    distill.deepest_exit_kd([a, b]).backward()
    assert a.grad is not None and b.grad is None


def test_inclusivefl_momentum_distillation_moves_the_top_block_of_small_models():
    prefixes = ["b0.", "b1.", "b2."]
    delta = {"b0.w": torch.tensor([1.0]), "b1.w": torch.tensor([2.0]), "b2.w": torch.tensor([4.0])}
    out = block_deltas_distilled(delta, prefixes, boundaries=[0, 1], beta=0.5)
    assert float(out["b0.w"]) == 1.0 + 0.5 * 3.0  # mean of deeper blocks 2 and 4
    assert float(out["b1.w"]) == 2.0 + 0.5 * 4.0
    assert float(out["b2.w"]) == 4.0


def test_scalefl_width_masks_match_the_entries_a_sliced_sub_model_trains():
    torch.manual_seed(0)
    model = ViTEE(dim=16, depth=2, heads=4, exits=(1, 2))
    model.set_width(0.5)
    model(torch.randn(2, 3, 32, 32), upto=1)[0].sum().backward()
    model.set_width(1.0)
    holds = width_holds(model, 1, 0.5)
    for key, p in model.named_parameters():
        held = holds(key, p.detach())
        if held is False:
            assert p.grad is None
        elif isinstance(held, torch.Tensor):
            assert not p.grad[~held].any() and p.grad[held].abs().sum() > 0
    assert scalefl_widths(4) == [0.4, 0.55, 0.75, 1.0]


def test_masked_average_is_entrywise():
    g = {"w": torch.zeros(3)}
    out = masked_average(
        g,
        [{"w": torch.ones(3)}, {"w": torch.full((3,), 3.0)}],
        [1.0, 1.0],
        [lambda k, v: torch.tensor([True, True, False]), lambda k, v: torch.tensor([True, False, False])],
    )
    assert out["w"].tolist() == [2.0, 1.0, 0.0]


@pytest.mark.parametrize("method", EARLY_EXIT_METHODS)
def test_every_method_runs_a_round_in_the_engine(method):
    torch.manual_seed(0)
    model = build_model(
        method_model_config(method, {"arch": "vit", "dim": 16, "depth": 3, "heads": 2, "exits": [1, 2, 3]})
    )
    budgets = round_robin_budgets(3, 3)
    clients = [Client(f"n{k}", k, e, torch.randn(8, 3, 32, 32), torch.randint(10, (8,))) for k, e in enumerate(budgets)]
    sgd = dict(lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=4, steps=1, total_rounds=2)
    opts = method_options(
        method, **({"patience": [1, 2, 6], "flame_aggregation": "exit-based"} if method == "flame" else {})
    )
    engine = FederatedEngine(model, clients, *build_method(method, model, clients, sgd, opts), seed=0)
    before = {k: v.clone() for k, v in engine.global_state.items()}
    record = engine.run_round()
    assert any(not torch.equal(before[k], v) for k, v in engine.global_state.items())
    if method == "flame":
        assert all("avg_exit" in r and r["train_flops"] > 0 for r in record["pairs"])
        assert record["pairs"][0]["avg_exit"] == 1.0  # p = 1 exits at the first exit
    if method == "exclusivefl":
        assert [r["node"] for r in record["pairs"]] == ["n2"]


@pytest.mark.parametrize("method", ["reefl", "depthfl", "exclusivefl"])
def test_clip_value_bounds_every_step_of_the_multi_exit_methods(method):
    """The ReeFL paper clips gradients by value at 1 for every method it compares: with momentum 0
    and no weight decay, one step moves no entry further than lr x clip."""
    torch.manual_seed(0)
    model = build_model(
        method_model_config(method, {"arch": "vit", "dim": 16, "depth": 3, "heads": 2, "exits": [1, 2, 3]})
    )
    clients = [Client("n0", 0, 3, torch.randn(8, 3, 32, 32) * 50, torch.randint(10, (8,)))]
    lr, clip = 0.5, 1e-4
    sgd = dict(lr=lr, momentum=0.0, weight_decay=0.0, batch_size=8, steps=1, total_rounds=1)
    _, trainer, _ = build_method(method, model, clients, sgd, method_options(method, clip_value=clip))
    trainer.setup(model, clients)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train(model, clients[0], 3, 1, torch.Generator().manual_seed(0))
    moved = max(float((v - before[k]).abs().max()) for k, v in model.state_dict().items() if v.is_floating_point())
    assert 0 < moved <= lr * clip * 1.01  # float32 rounding of the update; unclipped steps are far larger
