import json

import numpy as np
import pytest
import torch

from cis.core.errors import CisError
from cis.training.architectures import build_model
from cis.training.models.cnns import DigitsCNN, ResNet18EE, default_model_config
from cis.training.models.flops import exit_costs


def small_resnet(**kw):
    return ResNet18EE(width=0.125, **kw)


@pytest.mark.parametrize("make", [small_resnet, DigitsCNN])
def test_forward_returns_one_logit_tensor_per_exit(make):
    model = make()
    x = torch.randn(3, *model.input_shape)
    for e in range(1, model.num_exits + 1):
        out = model(x, upto=e)
        assert len(out) == e
        assert len(model(x, upto=np.int64(e))) == e  # exits sampled with numpy work too
        assert all(o.shape == (3, 10) for o in out)
    assert len(model(x)) == model.num_exits == 3


def test_forward_is_the_stages_chained():
    model = DigitsCNN().eval()
    x = torch.randn(2, 1, 8, 8)
    carry, expected = x, []
    for stage in model.stages():
        logits, carry = stage(carry)
        expected.append(logits)
    for a, b in zip(model(x), expected):
        torch.testing.assert_close(a, b)


def test_exit_positions_follow_the_authors_code():
    cifar100 = ResNet18EE(num_classes=100, exits=(4, 6, 8), width=0.125)
    assert [len(s.body) for s in cifar100.stages()] == [4, 2, 2]
    assert [len(s.body) for s in small_resnet().stages()] == [1, 3, 4]
    assert cifar100(torch.randn(1, 3, 32, 32))[0].shape == (1, 100)


def test_training_exit_1_leaves_deeper_blocks_without_grad():
    model = small_resnet()
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    torch.nn.functional.cross_entropy(model(x, upto=1)[0], y).backward()
    touched = {id(p) for p in model.exit_params(1)}
    for p in model.parameters():
        assert (p.grad is not None) == (id(p) in touched)


def test_exit_params_are_the_prefix_bodies_plus_own_head():
    model = DigitsCNN()
    stages = model.stages()
    expected = list(stages[0].body.parameters()) + list(stages[1].body.parameters()) + list(stages[1].head.parameters())
    assert [id(p) for p in model.exit_params(2)] == [id(p) for p in expected]


@pytest.mark.parametrize("make", [small_resnet, DigitsCNN])
def test_exit_costs_grow_with_depth(make):
    costs = exit_costs(make())
    assert [c["exit"] for c in costs] == [1, 2, 3]
    assert costs[0]["flops"] < costs[1]["flops"] < costs[2]["flops"]
    assert costs[0]["params"] < costs[2]["params"]
    assert all(c["exit_params"] <= c["params"] for c in costs)


def test_full_width_resnet18_flops_match_the_known_figure():
    # ResNet-18 on 32x32 CIFAR: about 0.56 GMACs = 1.11 GFLOPs, 11.2 M parameters.
    costs = exit_costs(ResNet18EE())
    assert 1.05e9 < costs[-1]["flops"] < 1.2e9
    assert 11.0e6 < costs[-1]["params"] < 11.3e6


def test_width_changes_parameter_count():
    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(DigitsCNN(width=0.5)) < count(DigitsCNN()) < count(DigitsCNN(width=2.0))
    assert count(ResNet18EE(width=0.125)) < count(ResNet18EE(width=0.25))
    assert DigitsCNN(width=0.01).stages()[0].head.fc.in_features == 4  # channel floor


@pytest.mark.parametrize("make", [small_resnet, DigitsCNN])
def test_build_model_round_trips_config_and_state(make):
    model = make().eval()
    config = json.loads(json.dumps(model.config()))
    clone = build_model(config).eval()
    clone.load_state_dict(model.state_dict())
    x = torch.randn(2, *model.input_shape)
    for a, b in zip(model(x), clone(x)):
        torch.testing.assert_close(a, b)
    assert clone.config() == model.config()


def test_default_model_configs():
    assert default_model_config("cifar10")["exits"] == [1, 4, 8]
    assert default_model_config("cifar100") == ResNet18EE(num_classes=100, exits=(4, 6, 8)).config()
    assert build_model(default_model_config("digits", width=0.5)).config()["width"] == 0.5


@pytest.mark.parametrize(
    "config",
    [
        "resnet18",
        {"exits": [1, 4, 8]},
        {"arch": "vgg"},
        {"arch": "resnet18", "depth": 18},
        {"arch": "resnet18", "exits": [4, 1, 8]},
        {"arch": "resnet18", "exits": [1, 4]},
        {"arch": "resnet18", "exits": [0, 8]},
        {"arch": "resnet18", "exits": 8},
        {"arch": "digits-cnn", "exits": [1.0, 3]},
        {"arch": "digits-cnn", "width": 0},
        {"arch": "digits-cnn", "width": "wide"},
        {"arch": "digits-cnn", "num_classes": 1},
        {"arch": "digits-cnn", "in_channels": True},
        {"arch": "digits-cnn", "input_size": -8},
    ],
)
def test_bad_configs_raise_cis_error(config):
    with pytest.raises(CisError):
        build_model(config)


def test_bad_exit_indices_raise_cis_error():
    model = DigitsCNN()
    x = torch.randn(1, 1, 8, 8)
    for bad in (0, 4, "2", True, 2.0):
        with pytest.raises(CisError):
            model(x, upto=bad)
        with pytest.raises(CisError):
            model.exit_params(bad)
    with pytest.raises(CisError):
        default_model_config("mnist")
    with pytest.raises(CisError):
        exit_costs(model, (8, 8))
