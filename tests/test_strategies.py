"""Aggregation weights Lambda~ and the gradient-variance measurement."""

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.rates import compute_rates
from cis.core.topologies import make_spec
from cis.training.aggregation.weights import balanced_adj_weights, flops_weights, make_weights
from cis.training.architectures import build_model
from cis.training.grad_variance import gradient_variance
from cis.training.models.cnns import default_model_config
from cis.training.sampling import sampling_matrix

pytestmark = pytest.mark.usefixtures("one_torch_thread")



def test_equal_and_explicit():
    assert np.allclose(make_weights("equal", 3).at(1), [1 / 3] * 3)
    assert np.allclose(make_weights("explicit", 3, vector=[2, 1, 1]).at(5), [0.5, 0.25, 0.25])
    with pytest.raises(CisError):
        make_weights("explicit", 3, vector=[1, 1])
    with pytest.raises(CisError, match="unknown"):
        make_weights("nope", 3)


def test_flops_ramp_from_equal_to_flops_proportions():
    flops = [10.0, 40.0, 100.0]
    assert np.allclose(flops_weights(flops, 1, 100), [1 / 3] * 3)  # min(0.01, .) = 0.01 for all
    assert np.allclose(flops_weights(flops, 100, 100), np.array(flops) / 150)
    mid = flops_weights(flops, 30, 100)  # min(0.3, [0.1, 0.4, 1]) = [0.1, 0.3, 0.3]
    assert np.allclose(mid, np.array([0.1, 0.3, 0.3]) / 0.7)
    w = make_weights("flops", 3, flops=flops, total_rounds=10)
    assert np.allclose(w.at(10), np.array(flops) / 150) and np.allclose(w.at(1), [1 / 3] * 3)


def test_serving_rate_is_lambda_of_the_spec():
    spec = make_spec("paper-7", "80-15-5")
    lam = [compute_rates(spec).exit_serving_rate[e] for e in (1, 2, 3)]
    assert np.allclose(make_weights("serving-rate", 3, exit_serving_rate=lam).at(1), [0.8, 0.15, 0.05])


def test_balanced_adj_formula_by_hand():
    lam = [80, 15, 5]
    sigma = [0.06, 0.05, 0.03]
    sizes = [10, 10, 20, 60]  # nodes: two with exit 1, one with exit 2, one with exit 3
    m = sampling_matrix([1, 1, 2, 3], 3)
    opt = np.array([1 / (0.06 * np.sqrt(0.5**2 + 0.5**2)), 1 / (0.05 * 1.0), 1 / (0.03 * 1.0)])
    expected = (np.array(lam) / 100 + opt / opt.sum()) / 2
    got = balanced_adj_weights(lam, sigma, m, sizes)
    assert np.allclose(got, expected) and got.sum() == pytest.approx(1.0)
    with pytest.raises(CisError):
        balanced_adj_weights(lam, [0.1, 0.0, 0.1], m, sizes)


def test_gradient_variance_per_exit_is_positive_and_leaves_model_untouched():
    import torch

    torch.manual_seed(0)
    model = build_model(default_model_config("digits", 0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 96)
    var = gradient_variance(model, x, y, batch_size=16, max_batches=6)
    assert len(var) == 3 and all(v > 0 for v in var)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_ramps_start_equal_and_end_at_their_target():
    from cis.training.aggregation.weights import ramp_weights

    lam = [5.0, 15.0, 80.0]
    w = make_weights("serving-ramp", 3, total_rounds=20, exit_serving_rate=lam)
    assert np.allclose(w.at(1), [1 / 3] * 3)  # t/T = 0.05 caps every exit: equal
    assert np.allclose(w.at(20), np.array(lam) / 100)  # the serving-rate weights at the last round
    mid = w.at(10)  # min(0.5, [0.0625, 0.1875, 1]) normalised
    assert np.allclose(mid, np.array([0.0625, 0.1875, 0.5]) / 0.75)
    # flops is the same schedule with the FLOPs as its target
    assert np.allclose(flops_weights([1, 4, 8], 3, 10), ramp_weights([1, 4, 8], 3, 10))
    # at 33-33-33 the serving ramp IS equal weight in every round
    flat = make_weights("serving-ramp", 3, total_rounds=10, exit_serving_rate=[1, 1, 1])
    assert all(np.allclose(flat.at(t), [1 / 3] * 3) for t in range(1, 11))


def test_balanced_ramp_ends_at_balanced_adj():
    matrix = np.eye(3)[[2, 1, 0]]
    kw = dict(exit_serving_rate=[80, 15, 5], sigma=[0.01, 0.005, 0.006], matrix=matrix, sizes=[10, 10, 10])
    target = make_weights("balanced-adj", 3, **kw).constant
    w = make_weights("balanced-ramp", 3, total_rounds=4, **kw)
    assert np.allclose(w.at(4), target) and np.allclose(w.at(1), [1 / 3] * 3)


@pytest.mark.parametrize(
    "strategy, given, missing",
    [
        ("serving-rate", {}, "exit_serving_rate"),
        ("auto", {}, "exit_serving_rate"),
        ("balanced-adj", {"exit_serving_rate": [0.5, 0.3, 0.2]}, "sigma"),
        ("balanced-adj", {"exit_serving_rate": [0.5, 0.3, 0.2], "sigma": [1.0, 1.0, 1.0], "sizes": [1, 1]}, "matrix"),
        ("serving-ramp", {}, "exit_serving_rate"),
    ],
)
def test_a_strategy_called_without_its_input_names_it(strategy, given, missing):
    """make_weights called directly (the Python API) without what the strategy needs: one clear error, not a
    NaN weight or a TypeError deep in the formula."""
    ramp = r"( \(a ramp to [a-z-]+\): strategy [a-z-]+)?"  # a ramp names itself, then its target
    with pytest.raises(CisError, match=f"strategy {strategy}{ramp}: needs {missing}"):
        make_weights(strategy, 3, **given)
