"""The server update of Algorithm 1 (line 12) and the exit sampling matrix, on hand-made tensors."""

import itertools

import numpy as np
import pytest
import torch

from cis.errors import CisError
from training.aggregation import accumulate, aggregate, apply_update, pair_coefficient, zeros_like_state
from training.sampling import exit_data_sizes, sample_exits, sampling_matrix


def state(w, rv, nbt=0):
    return {"w": torch.tensor(w, dtype=torch.float64), "bn.running_var": torch.tensor(rv, dtype=torch.float64),
            "bn.num_batches_tracked": torch.tensor(nbt)}


def test_pair_coefficient_paper_and_code():
    assert pair_coefficient(0.5, 100, 400, 0.25) == pytest.approx(0.5 * 100 / 400 / 0.25)
    assert pair_coefficient(0.5, 100, 400, 0.25, "multiply") == pytest.approx(0.5 * 100 / 400 * 0.25)
    with pytest.raises(ValueError):
        pair_coefficient(0.5, 100, 400, 0.0)


def test_aggregate_is_line_12_exactly_not_renormalised():
    g = state([1.0, 2.0], [1.0, 1.0], 5)
    a = state([3.0, 2.0], [2.0, 1.0], 9)  # changed only w[0] and rv[0]
    b = state([1.0, 6.0], [1.0, 0.5], 7)
    out = aggregate(g, [(a, 0.2), (b, 0.3)])
    # w[0] moves only through a: 1 + 0.2 * 2 (no division by the 0.2 that touched it)
    assert torch.allclose(out["w"], torch.tensor([1.0 + 0.2 * 2, 2.0 + 0.3 * 4], dtype=torch.float64))
    # BN running statistics get the same update
    assert torch.allclose(out["bn.running_var"], torch.tensor([1.0 + 0.2 * 1, 1.0 - 0.3 * 0.5], dtype=torch.float64))
    # counts: the largest contributing count
    assert int(out["bn.num_batches_tracked"]) == 9
    # the inputs are untouched (pure function)
    assert torch.equal(g["w"], torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_server_lr_and_projection_of_running_var():
    g = state([0.0], [1.0])
    local = state([1.0], [0.0])
    out = aggregate(g, [(local, 3.0)], server_lr=0.5)
    assert out["w"].item() == pytest.approx(1.5)
    assert out["bn.running_var"].item() == 0.0  # 1 + 0.5*3*(-1) < 0 -> projected to 0


def test_in_place_accumulation_matches_pure_function():
    g = state([1.0, -1.0], [1.0, 2.0], 3)
    locals_ = [(state([2.0, 0.0], [1.5, 2.0], 4), 0.7), (state([0.0, 0.0], [1.0, 3.0], 3), 0.1)]
    expected = aggregate(g, locals_, server_lr=1.0)
    acc = zeros_like_state(g)
    live = {k: v.clone() for k, v in g.items()}
    for local, c in locals_:
        accumulate(acc, local, live, c)
    apply_update(live, acc)
    for k in g:
        assert torch.allclose(live[k].double(), expected[k].double())


def test_sampling_matrix_rules():
    exits = [3, 2, 1]
    m = sampling_matrix(exits, 3)
    assert m.tolist() == [[0, 0, 1], [0, 1, 0], [1, 0, 0]]
    paper = sampling_matrix(exits, 3, p=0.2)
    assert np.allclose(paper, [[0.2, 0.2, 0.6], [0.2, 0.8, 0], [1, 0, 0]])
    code = sampling_matrix(exits, 3, p=0.2, rule="code")
    assert np.allclose(code, [[0.1, 0.1, 0.8], [0.2, 0.8, 0], [1, 0, 0]])
    assert np.allclose(exit_data_sizes(paper, [100, 10, 1]), [111, 110, 100])
    assert np.allclose(exit_data_sizes(m, [100, 10, 1]), [1, 10, 100])
    with pytest.raises(CisError, match="1/2"):
        sampling_matrix(exits, 3, p=0.5)
    with pytest.raises(CisError, match="beyond"):
        sampling_matrix([1], 2, matrix=[[0.5, 0.5]])
    with pytest.raises(CisError, match="shape"):
        sampling_matrix([1, 2], 2, matrix=[[1.0, 0.0]])


def test_sample_exits_follows_rows_of_p():
    m = sampling_matrix([3, 1], 3, p=0.2)
    gen = torch.Generator().manual_seed(0)
    draws = [sample_exits(m, [0, 1], gen) for _ in range(3000)]
    assert all(d[1] == (1, 1) for d in draws)
    freq = np.bincount([d[0][1] for d in draws], minlength=4)[1:] / 3000
    assert np.allclose(freq, [0.2, 0.2, 0.6], atol=0.03)


def test_expected_update_is_unbiased_over_the_sampling():
    """E over the draw of sum c_ie delta_ie equals sum_e Lambda_e sum_{i in C_e} |S_i|/|S_e,p| delta_ie."""
    sizes = [30, 10]
    m = sampling_matrix([3, 2], 3, p=0.25)
    lam = np.array([0.5, 0.3, 0.2])
    se = exit_data_sizes(m, sizes)
    rng = np.random.default_rng(0)
    delta = {(i, e): rng.normal(size=4) for i in range(2) for e in (1, 2, 3)}
    target = sum(
        lam[e - 1] * sizes[i] / se[e - 1] * delta[i, e] for i in range(2) for e in (1, 2, 3) if m[i, e - 1] > 0
    )
    expected = np.zeros(4)
    choices = [[e for e in (1, 2, 3) if m[i, e - 1] > 0] for i in range(2)]
    for combo in itertools.product(*choices):
        prob = np.prod([m[i, e - 1] for i, e in enumerate(combo)])
        upd = sum(
            pair_coefficient(lam[e - 1], sizes[i], se[e - 1], m[i, e - 1]) * delta[i, e] for i, e in enumerate(combo)
        )
        expected += prob * upd
    assert np.allclose(expected, target)
