import numpy as np
import pytest
import torch

from cis.core.errors import CisError
from cis.core.policy import patience as pt
from cis.training.aggregation import averages as aggregate
from cis.training.local import Client
from cis.training.methods import flame
from cis.training.methods.vit import ViTEE


def onehot(labels, c=3):
    return np.eye(c)[np.asarray(labels)] * 5.0


def seq(*per_exit):
    """Logits of each exit from the labels each sample predicts there."""
    return [onehot(labels) for labels in per_exit]


def test_patience_one_exits_at_the_first_exit():
    assert pt.exit_points(seq([0, 1], [0, 1], [2, 2]), 1).tolist() == [1, 1]


def test_patience_counts_consecutive_agreement():
    # per sample over exits 1..4: s0 0,0,1,1 | s1 0,1,1,1 | s2 0,1,0,1 (never two in a row) | s3 2,2,2,2
    logits = seq([0, 0, 0, 2], [0, 1, 1, 2], [1, 1, 0, 2], [1, 1, 1, 2])
    assert pt.exit_points(logits, 2).tolist() == [2, 3, 4, 2]
    assert pt.exit_points(logits, 3).tolist() == [4, 4, 4, 3]
    assert pt.exit_points(logits, 10).tolist() == [4, 4, 4, 4]


def test_patience_step_state_travels_between_calls():
    s = pt.initial_state(2)
    s, done = pt.step(s, onehot([1, 2]), 2)
    assert s.label.tolist() == [1, 2] and s.count.tolist() == [1, 1] and not done.any()
    carry = pt.to_carry(s)  # e.g. across a tier boundary
    s2, done = pt.step(pt.from_carry(carry, 2), onehot([1, 0]), 2)
    assert s2.count.tolist() == [2, 1] and done.tolist() == [True, False]
    _, done = pt.step(s2, onehot([0, 1]), 2, last=True)
    assert done.all()
    assert pt.from_carry({}, 3).count.tolist() == [0, 0, 0]
    with pytest.raises(CisError):
        pt.step(s, onehot([0, 0]), 0)


def tiny_flame():
    torch.manual_seed(0)
    return ViTEE(dim=16, depth=3, heads=2, exits=(1, 2, 3))


def test_patience_forward_matches_the_rule_and_skips_deeper_stages():
    model = tiny_flame().eval()
    x = torch.randn(6, 3, 32, 32)
    full = model(x)
    logits, exits = flame.patience_forward(model, x, 2)
    expected = pt.exit_points([z.detach().numpy() for z in full], 2)
    assert exits.tolist() == expected.tolist()
    for i, e in enumerate(exits):
        assert torch.allclose(logits[i], full[e - 1][i], atol=1e-5)
    _, exits1 = flame.patience_forward(model, x, 1)
    assert (exits1 == 1).all()


def test_flame_loss_touches_only_layers_up_to_the_exit():
    model = tiny_flame()
    x, y = torch.randn(4, 3, 32, 32), torch.randint(10, (4,))
    logits, exits = flame.patience_forward(model, x, 1)  # everyone exits at exit 1
    flame.group_losses(logits, y, flame.group_samples(exits, "exit", 3))[0].backward()
    first = {id(p) for p in model.exit_params(1)}
    for p in model.parameters():
        if id(p) in first:
            assert p.grad is not None and p.grad.abs().sum() > 0
        else:
            assert p.grad is None or not p.grad.any()


def test_grouping_strategies():
    exits = np.array([1, 2, 6, 6, 3, 4, 1])

    def groups(s):
        return [g.tolist() for g in flame.group_samples(exits, s, 6, torch.Generator().manual_seed(0))]

    assert groups("exit") == [[0, 6], [1], [4], [5], [2, 3]]
    assert groups("full") == [list(range(7))]
    assert groups("binary") == [[0, 1, 4, 6], [2, 3, 5]]
    assert groups("distant") == [[0, 5, 6], [1], [2, 3, 4]]  # (1,4), (2,5), (3,6)
    assert groups("close") == [[0, 1, 6], [4, 5], [2, 3]]  # (1,2), (3,4), (5,6)
    rnd = groups("random")
    assert sorted(i for g in rnd for i in g) == list(range(7))
    with pytest.raises(ValueError):
        flame.group_samples(exits, "nope", 6)


def test_group_gradients_are_taken_per_group_at_the_same_weights():
    model = tiny_flame()
    x, y = torch.randn(6, 3, 32, 32), torch.randint(10, (6,))
    logits, exits = flame.patience_forward(model, x, 2)
    groups = flame.group_samples(exits, "exit", 3)
    params = list(model.parameters())
    grads = flame.group_gradients(flame.group_losses(logits, y, groups), params)
    assert len(grads) == len(groups)
    deep = {id(p) for p in model.stage_list[2].parameters()}
    for g, members in zip(grads, groups):
        top = int(exits[members[0]])
        assert all(exits[members] == top)
        for p, gp in zip(params, g):
            if id(p) in deep and top < 3:
                assert gp is None


def test_share_steps_add_up_to_one_step_on_the_batch_mean_loss():
    """group_step=share: the group gradients of a batch sum to the gradient of the batch's mean loss;
    mean: every group's loss is its own mean cross-entropy (the paper's Algorithm 2 literally)."""
    torch.manual_seed(0)
    model = tiny_flame()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(10, (8,))
    logits, exits = flame.patience_forward(model, x, 2)
    groups = flame.group_samples(exits, "random", 3, torch.Generator().manual_seed(1))
    assert len(groups) > 1 and len({len(g) for g in groups}) > 1  # unequal groups: share and mean differ
    params = list(model.parameters())
    whole = torch.autograd.grad(
        torch.nn.functional.cross_entropy(logits, y), params, retain_graph=True, allow_unused=True
    )
    summed = [torch.zeros_like(p) for p in params]
    for grads in flame.group_gradients(flame.group_losses(logits, y, groups, "share"), params):
        for acc, g in zip(summed, grads):
            if g is not None:
                acc += g
    for acc, g in zip(summed, whole):
        assert torch.allclose(acc, torch.zeros_like(acc) if g is None else g, atol=1e-6)
    means = flame.group_losses(logits, y, groups, "mean")
    for loss, g in zip(means, groups):
        idx = torch.from_numpy(g)
        assert torch.isclose(loss, torch.nn.functional.cross_entropy(logits[idx], y[idx]))
    with pytest.raises(ValueError):
        flame.group_losses(logits, y, groups, "sum")


def test_training_flops_are_three_forwards_of_the_layers_run():
    assert flame.training_flops(np.array([1, 1, 3]), [10, 20, 30]) == 3 * (10 + 10 + 30)
    assert flame.fixed_exit_flops(3, 3, [10, 20, 30]) == 3 * 90


def test_aggregation_rules_on_small_tensors():
    g = {"stage_list.0.w": torch.zeros(1), "stage_list.1.w": torch.zeros(1), "stage_list.2.w": torch.full((1,), 7.0)}
    a = {k: torch.full((1,), 1.0) for k in g}
    b = {k: torch.full((1,), 4.0) for k in g}

    def v(s):
        return [float(s[k]) for k in sorted(g)]

    assert v(aggregate.fedavg(g, [a, b], [1, 2])) == [3.0, 3.0, 3.0]
    assert v(aggregate.patience_conscious(g, [a, b], [2, 6])) == [3.25, 3.25, 3.25]
    assert v(aggregate.exit_conscious(g, [a, b], [1.0, 2.0])) == [3.0, 3.0, 3.0]
    # exit-based: layer 1 by both, layer 2 only by b (avg exit 2.5), layer 3 by nobody -> global kept
    assert v(aggregate.exit_based(g, [a, b], [1.5, 2.5])) == [2.5, 4.0, 7.0]


def _flame_trainer(optimizer: str, clients):
    from cis.training.methods.baselines import FlameTrainer

    sgd = dict(lr=1e-3, momentum=0.9, weight_decay=0.0, batch_size=4, steps=2, total_rounds=3)
    return FlameTrainer(patience={c.id: 2 for c in clients}, forward_flops=[1, 2, 3], optimizer=optimizer, **sgd)


@pytest.mark.parametrize("optimizer,keys", [("sgd", {"momentum_buffer"}), ("adamw", {"exp_avg", "exp_avg_sq", "step"})])
def test_flame_optimizer_state_saves_and_resumes_exactly(optimizer, keys):
    """A node's optimizer state (AdamW's moments, SGD's momentum) survives state_dict/load_state_dict:
    a trainer rebuilt from it takes the same next step as the one that kept running."""
    clients = [Client("n0", 0, 3, torch.randn(8, 3, 32, 32), torch.randint(10, (8,)))]
    model = tiny_flame()
    trainer = _flame_trainer(optimizer, clients)
    trainer.setup(model, clients)
    assert type(trainer.optimizers["n0"]).__name__ == {"sgd": "SGD", "adamw": "AdamW"}[optimizer]
    trainer.train(model, clients[0], 3, 1, torch.Generator().manual_seed(0))
    state = trainer.state_dict()
    assert {key.split(".", 1)[1] for key in state["optimizer"]["n0"]} == keys
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    trainer.train(model, clients[0], 3, 2, torch.Generator().manual_seed(1))
    twin_model = tiny_flame()
    twin_model.load_state_dict(weights)
    twin = _flame_trainer(optimizer, clients)
    twin.setup(twin_model, clients)
    twin.load_state_dict(state)
    twin.train(twin_model, clients[0], 3, 2, torch.Generator().manual_seed(1))
    for k, v in model.state_dict().items():
        assert torch.equal(v, twin_model.state_dict()[k]), k


def test_optimizer_state_loads_from_the_older_momentum_format():
    clients = [Client("n0", 0, 3, torch.randn(8, 3, 32, 32), torch.randint(10, (8,)))]
    model = tiny_flame()
    trainer = _flame_trainer("sgd", clients)
    trainer.setup(model, clients)
    buf = torch.ones_like(next(model.parameters()))
    trainer.load_state_dict({"momentum": {"n0": {"0": buf}}})
    assert torch.equal(trainer.state_dict()["optimizer"]["n0"]["0.momentum_buffer"], buf)


def test_flame_refuses_an_unknown_optimizer():
    with pytest.raises(ValueError, match="optimizer"):
        _flame_trainer("adam", [Client("n0", 0, 3, torch.randn(2, 3, 32, 32), torch.randint(10, (2,)))])


def test_the_trainer_refuses_what_the_option_registry_does_not_offer():
    """cis/training/methods/registry.py names FLAME's choices once; the trainer checks against them."""
    from cis.training.methods import registry

    assert registry.OPTIONS["group_step"].default == registry.FLAME_GROUP_STEPS[0]
    exits = np.array([1, 2, 3, 3])
    for grouping in registry.FLAME_GROUPINGS:
        groups = flame.group_samples(exits, grouping, 3, torch.Generator().manual_seed(0))
        assert sorted(np.concatenate(groups).tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="grouping"):
        flame.group_samples(exits, "nearest", 3, torch.Generator().manual_seed(0))
