"""The server update of Algorithm 1 (line 12) and the exit sampling matrix, on hand-made tensors."""

import itertools

import numpy as np
import pytest
import torch

from cis.core.errors import CisError
from cis.training.aggregation.line12 import (
    accumulate,
    aggregate,
    apply_update,
    coefficient_totals,
    pair_coefficient,
    round_coefficients,
    zeros_like_state,
)
from cis.training.local import exit_steps
from cis.training.sampling import exit_data_sizes, sample_exits, sampling_matrix


def state(w, rv, nbt=0):
    return {
        "w": torch.tensor(w, dtype=torch.float64),
        "bn.running_var": torch.tensor(rv, dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(nbt),
    }


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
    out = aggregate(g, [(local, 3.0)], server_lr=0.5, bn_rule="literal")
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


def test_authors_multiply_rule_matches_their_aggregate_on_paper7_highly_biased():
    """The authors' `aggregate` (FedCIS custom_training_topology.py): c = lambda~_e |S_c| / |S_e,p| * p_ce with
    |S_e,p| the data of nodes whose own exit is e or a later one with p > 0, p_ce = 1 - p at the node's own
    exit, p / (E_c - 1) at a lower exit, 1 for single-exit nodes. Our multiply mode with the code's p rule
    must give exactly those numbers."""
    exits = [3, 2, 2, 1, 1, 1, 1]
    sizes = [767, 100, 99, 9, 8, 8, 9]
    lam, p = np.array([0.8, 0.15, 0.05]), 0.2
    m = sampling_matrix(exits, 3, p=p, rule="code")
    se = exit_data_sizes(m, sizes)
    pairs = [(i, e) for i, top in enumerate(exits) for e in range(1, top + 1)]
    ours = round_coefficients(pairs, lam, sizes, se, [m[i, e - 1] for i, e in pairs], "multiply")
    for (i, e), c in zip(pairs, ours):
        s_e = sum(s for s, top in zip(sizes, exits) if top == e or (top > e and p > 0))
        p_ce = 1.0 if exits[i] == 1 else (1 - p if e == exits[i] else p / (exits[i] - 1))
        assert c == pytest.approx(lam[e - 1] * sizes[i] / s_e * p_ce)
    # what makes it barely train stage 1: the expected total coefficient of head 1 is ~0.04 per round, 0.8 at p = 0
    head1 = sum(m[i, 0] * c for (i, e), c in zip(pairs, ours) if e == 1)
    assert head1 < 0.05


def test_capped_and_self_normalised_coefficients():
    sizes, lam = [70, 20, 10], [0.8, 0.15, 0.05]
    pairs = [(0, 1), (1, 1), (2, 2)]
    se, p_pair = [100, 30, 10], [0.2, 0.5, 1.0]
    literal = round_coefficients(pairs, lam, sizes, se, p_pair)
    assert literal == pytest.approx([0.8 * 70 / 100 / 0.2, 0.8 * 20 / 100 / 0.5, 0.15 * 10 / 30])
    assert literal[0] > 1
    capped = round_coefficients(pairs, lam, sizes, se, p_pair, rule="capped")
    assert capped == pytest.approx([1.0, literal[1], literal[2]])
    selfn = round_coefficients(pairs, lam, sizes, se, p_pair, rule="self-normalised")
    assert selfn == pytest.approx([0.8 * 70 / 90, 0.8 * 20 / 90, 0.15])  # per exit: sums to Lambda~_e
    totals = coefficient_totals(pairs, selfn, 3)
    assert totals["head"] == pytest.approx([0.8, 0.15, 0.0])
    assert totals["stage"] == pytest.approx([0.95, 0.15, 0.0])
    with pytest.raises(ValueError, match="rule"):
        round_coefficients(pairs, lam, sizes, se, p_pair, rule="nope")


def test_convex_bn_rule_shortens_only_the_overshooting_steps_of_running_statistics():
    g = state([0.0, 0.0], [1.0, 1.0])
    a = state([1.0, 0.0], [0.2, 1.0])  # ran the layer: its running_var moved
    b = state([0.0, 1.0], [0.4, 1.0])
    literal = aggregate(g, [(a, 3.0), (b, 1.0)], bn_rule="literal")
    assert literal["bn.running_var"][0].item() == 0.0  # 1 + 3 (-0.8) + 1 (-0.6) < 0: clamped
    convex = aggregate(g, [(a, 3.0), (b, 1.0)])  # the default
    assert convex["bn.running_var"][0].item() == pytest.approx((3 * 0.2 + 1 * 0.4) / 4)  # weighted mean of the copies
    assert torch.equal(convex["w"], literal["w"])  # weights keep line 12
    # total coefficient <= 1 (always at p = 0): exactly line 12
    small = [(a, 0.5), (b, 0.3)]
    assert torch.equal(aggregate(g, small)["bn.running_var"], aggregate(g, small, bn_rule="literal")["bn.running_var"])
    # a server learning rate counts: eta_s * C > 1 is shortened too
    assert aggregate(g, small, server_lr=2.0)["bn.running_var"][0].item() == pytest.approx(
        (0.5 * 0.2 + 0.3 * 0.4) / 0.8
    )
    # a statistic no pair moved stays as it was
    c = state([1.0, 1.0], [1.0, 1.0])
    assert aggregate(g, [(c, 2.0)])["bn.running_var"].tolist() == [1.0, 1.0]
    acc, live = zeros_like_state(g), {k: v.clone() for k, v in g.items()}
    accumulate(acc, a, live, 3.0)
    assert apply_update(live, acc) == 1  # literal (no statistics weights): one running_var entry clamped


def test_lower_exit_steps_by_flops():
    flops = [10.0, 30.0, 100.0]
    assert exit_steps(5, None, 3, 1) == 5
    assert exit_steps(5, flops, 3, 3) == 5
    assert exit_steps(5, flops, 3, 1) == 50
    assert exit_steps(4, flops, 2, 1) == 12
