import pytest
import torch

from cis.training.families.nested import build_subset_method, subset_model
from cis.training.federated import FederatedEngine
from cis.training.local import Client
from cis.training.methods import widthfl
from cis.training.methods.registry import NESTED_METHODS
from cis.training.methods.resnet import LAYOUTS
from cis.training.methods.slicing import rolling
from cis.training.selection import gather

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_fedrolex_window_wraps_eq3():
    assert rolling(8, 4, 2).tolist() == [2, 3, 4, 5]
    assert rolling(8, 4, 6).tolist() == [6, 7, 0, 1]
    assert rolling(8, 4, 11).tolist() == [3, 4, 5, 6]


def test_group_rules():
    layout = LAYOUTS["digits"]
    ordered = widthfl.ordered_groups(layout, 0.5)
    assert ordered["stream.2"].tolist() == list(range(16))
    fd = widthfl.fd_groups(layout, 0.5, torch.Generator().manual_seed(1))
    assert all(len(fd[g]) == len(ordered[g]) and fd[g].unique().numel() == len(fd[g]) for g in fd)
    assert any(not torch.equal(fd[g], ordered[g]) for g in fd)
    widths = [0.25, 0.5, 1.0]
    picks = {widthfl.fjord_width(widths, torch.Generator().manual_seed(s)) for s in range(20)}
    assert picks == set(widths)
    assert widthfl.heterogeneous_widths([0.25, 0.125], 4) == [0.125, 0.125, 0.25, 0.25]


def test_group_selection_builds_a_consistent_subnetwork():
    layout = LAYOUTS["digits"]
    model = subset_model("fedrolex", layout, 3)
    groups = widthfl.fedrolex_groups(layout, 0.5, 5)
    sel = widthfl.group_selection(layout, groups)
    from cis.training.methods.resnet import CompactResNet

    net = CompactResNet(layout, widthfl.group_widths(layout, groups))
    net.load_state_dict(gather(model.state_dict(), sel))
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def _clients(n=4):
    gen = torch.Generator().manual_seed(0)
    return [
        Client(
            f"n{i}", i, 1 + i % 3, torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        )
        for i in range(n)
    ]


def test_fedrolex_updates_only_its_window():
    layout = LAYOUTS["digits"]
    model = subset_model("fedrolex", layout, 3)
    clients = [Client(c.id, c.index, 1, c.x, c.y) for c in _clients(2)]
    sgd = dict(lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=8, steps=1, total_rounds=3)
    engine = FederatedEngine(
        model, clients, *build_subset_method("fedrolex", model, clients, sgd, budgets=[0.5, 0.5, 1.0]), seed=0
    )
    before = engine.global_state["shared.stem.weight"].clone()
    engine.run_round()  # round 1: window of 4 of 8 stem channels starting at 1
    after = engine.global_state["shared.stem.weight"]
    touched = (before != after).flatten(1).any(1).nonzero().flatten().tolist()
    assert touched == [1, 2, 3, 4]


@pytest.mark.parametrize("method", NESTED_METHODS)
def test_every_method_runs_a_round(method):
    layout = LAYOUTS["digits"]
    model = subset_model(method, layout, 3)
    clients = _clients()
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=8, steps=2, total_rounds=2)
    budgets = [0.5, 0.75, 1.0] if method == "slt" else None
    engine = FederatedEngine(model, clients, *build_subset_method(method, model, clients, sgd, budgets=budgets), seed=0)
    before = {k: v.clone() for k, v in engine.global_state.items()}
    r = engine.run_round()
    assert len(r["pairs"]) == 4 and all(p["loss"] > 0 for p in r["pairs"])
    assert any(not torch.equal(before[k], v) for k, v in engine.global_state.items())
    assert [o.shape for o in model(torch.randn(2, 1, 8, 8))] == [(2, 10)] * 3
