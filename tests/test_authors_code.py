"""``--algorithm authors-code``: each difference from the printed Algorithm 1, pinned at the coefficient level.

The reference is arodio/FedCIS, trainingtopologies/custom_training_topology.py (``aggregate``,
``sample``, the end of ``load_nodes_states``) and utils/utils.py (the p argument); the
expressions below are theirs, written out independently of cis/training/.
"""

import numpy as np
import pytest
import torch

from cis.core.errors import CisError
from cis.core.rates import compute_rates
from cis.core.topologies import make_spec
from cis.training.aggregation.aggregators import AuthorsCodeAggregator, CisAggregator
from cis.training.aggregation.line12 import aliased_totals, aliased_update, pair_coefficient
from cis.training.aggregation.weights import APPENDIX_C_SIGMA, authors_balanced_weights, make_weights
from cis.training.config import make_config
from cis.training.families.algorithm1 import root_index
from cis.training.local import Client
from cis.training.models.cnns import CIFAR10_EXITS, CIFAR100_EXITS, ResNet18EE
from cis.training.run import appendix_c_sigma
from cis.training.sampling import exit_data_sizes, sampling_matrix

PAPER7_EXITS = [3, 2, 2, 1, 1, 1, 1]  # cloud, edge0, edge1, device0..3 (cis.core.topologies order)
SIZES = [770, 100, 99, 8, 8, 8, 7]  # highly biased: the root holds 77 %


def authors_p_rows(per_layer: str, node_exits: list[int]) -> np.ndarray:
    """Their ``--sampled-probability-per-layer a-b``: node with E exits keeps p_E = [0, a, b][E-1];
    ``sample`` trains its own exit with 1 - p_E, else a uniform lower exit (p_E / (E - 1) each)."""
    per_exit = [0.0] + [float(x) for x in per_layer.split("-")]
    rows = np.zeros((len(node_exits), max(node_exits)))
    for i, e in enumerate(node_exits):
        p = per_exit[e - 1]
        rows[i, e - 1] = 1 - p
        if e > 1:
            rows[i, : e - 1] = p / (e - 1)
    return rows


def authors_coefficient(lam: np.ndarray, node_exits, sizes, p_per_node, c: int, e: int) -> float:
    """Their ``lambda_tilde_e * c_ds_scale_factor * p_ce`` (e 1-based here)."""
    e_ds_size = sum(
        s for s, own, p in zip(sizes, node_exits, p_per_node) if e == own or (e < own and p > 0.0)
    )
    own, p = node_exits[c], p_per_node[c]
    p_ce = 1.0 if own == 1 else (1 - p if e == own else p / (own - 1))
    return lam[e - 1] * sizes[c] / e_ds_size * p_ce


@pytest.mark.parametrize("per_layer,p", [("0.4-0.8", 0.4), ("0.2-0.4", 0.2), ("0.0-0.0", 0.0)])
def test_their_p_argument_is_the_papers_rule_at_half_the_roots_number(per_layer, p):
    # "0.4-0.8": the root trains exits 1/2/3 with 0.4/0.4/0.2 -- the paper's rule at p = 0.4, not 0.2
    assert np.allclose(authors_p_rows(per_layer, PAPER7_EXITS), sampling_matrix(PAPER7_EXITS, 3, p, "paper"))


def test_coefficients_are_theirs_multiply_by_p_ce():
    lam = np.array([0.8, 0.15, 0.05])
    matrix = sampling_matrix(PAPER7_EXITS, 3, 0.4, "paper")
    weights = make_weights("explicit", 3, vector=lam)
    agg = AuthorsCodeAggregator(weights, matrix, SIZES, root=0, exit_keys=lambda e: [])
    pairs = [(0, 1), (1, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
    p_per_node = [0.8, 0.4, 0.4, 0.0, 0.0, 0.0, 0.0]  # their "0.4-0.8"
    want = [authors_coefficient(lam, PAPER7_EXITS, SIZES, p_per_node, c, e) for c, e in pairs]
    assert agg.coefficients(1, pairs) == pytest.approx(want)
    # the printed rule divides by p_ie: the root drawing exit 1 gets 1/p^2 = 6.25 times the authors' coefficient
    printed = CisAggregator(weights, matrix, SIZES).coefficients(1, pairs)
    assert printed[0] / want[0] == pytest.approx(1 / 0.4**2)
    assert printed[0] == pytest.approx(0.8 * 770 / exit_data_sizes(matrix, SIZES)[0] / 0.4)


def state(**tensors):
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in tensors.items()} | {"nbt": torch.tensor(0)}


def test_the_roots_trained_model_is_the_reference_and_enters_with_weight_1():
    w0 = state(a=[0.0, 0.0], b=[1.0], rv=[1.0])
    root = state(a=[1.0, 2.0], b=[1.0], rv=[2.0]) | {"nbt": torch.tensor(7)}  # trained a and rv, not b
    leaf = state(a=[3.0, 0.0], b=[5.0], rv=[4.0]) | {"nbt": torch.tensor(9)}  # trained all three
    edge = state(a=[9.0, 9.0], b=[1.0], rv=[1.0])  # trained only a
    out = aliased_update(root, [(leaf, 0.2, ["a", "b", "rv"]), (edge, 0.5, ["a"])])
    # a: w_root + 0.2 (leaf - w_root) + 0.5 (edge - w_root), against the ROOT's trained weights
    want_a = torch.tensor([1.0, 2.0]) + 0.2 * (torch.tensor([3.0, 0.0]) - torch.tensor([1.0, 2.0]))
    want_a += 0.5 * (torch.tensor([9.0, 9.0]) - torch.tensor([1.0, 2.0]))
    assert torch.allclose(out["a"], want_a.double())
    # b: only the leaf trained it; the root's (untrained) b is the reference
    assert out["b"].item() == pytest.approx(1.0 + 0.2 * (5.0 - 1.0))
    # BatchNorm statistics: the same update, literal
    assert out["rv"].item() == pytest.approx(2.0 + 0.2 * (4.0 - 2.0))
    assert int(out["nbt"]) == 7  # the root's count
    # the printed rule would take differences against the round's start w0 instead
    assert not torch.allclose(out["a"], w0["a"] + 0.2 * (leaf["a"] - w0["a"]) + 0.5 * (edge["a"] - w0["a"]))


def test_a_pair_does_not_pull_back_what_it_did_not_train():
    root = state(a=[4.0], b=[6.0], rv=[1.0])
    leaf = state(a=[0.0], b=[0.0], rv=[1.0])  # b and rv still at the round's start (0): it trained only a
    out = aliased_update(root, [(leaf, 0.25, ["a"])])
    assert out["b"].item() == 6.0 and out["a"].item() == pytest.approx(4.0 + 0.25 * (0.0 - 4.0))


def clients(sizes, exits):
    return [Client(f"n{k}", k, e, torch.zeros(s, 1), torch.zeros(s)) for k, (s, e) in enumerate(zip(sizes, exits))]


@pytest.mark.parametrize("root_position", ["first", "last"])
def test_aggregator_streams_the_aliased_update_in_any_order(root_position):
    keys = {1: ["a"], 2: ["a", "b"]}
    exits = [2, 1, 1]
    cl = clients([10, 5, 5], exits)
    matrix = sampling_matrix(exits, 2, 0.0)
    weights = make_weights("explicit", 2, vector=[0.5, 0.5])
    agg = AuthorsCodeAggregator(weights, matrix, [10, 5, 5], root=0, exit_keys=keys.get)
    g = state(a=[0.0], b=[0.0])
    locals_ = {0: state(a=[2.0], b=[3.0]), 1: state(a=[4.0], b=[0.0]), 2: state(a=[8.0], b=[0.0])}
    pairs = [(0, 2), (1, 1), (2, 1)]
    order = pairs if root_position == "first" else pairs[1:] + pairs[:1]
    agg.begin(g, 1, pairs)
    for i, e in order:
        agg.add(cl[i], e, locals_[i])
    agg.finish(g)
    c = 0.5 * 5 / 10  # lambda~_1 |S_c| / |S_1| with p_ce = 1
    assert g["a"].item() == pytest.approx(2.0 + c * (4.0 - 2.0) + c * (8.0 - 2.0))
    assert g["b"].item() == pytest.approx(3.0)
    assert agg.last_stats["coefficients"] == aliased_totals(pairs, agg.coefficients(1, pairs), 2, 0)
    assert agg.last_stats["coefficients"]["head"] == [pytest.approx(2 * c), 1.0]


def test_without_the_root_the_reference_is_the_rounds_start():
    cl = clients([10, 5], [2, 1])
    agg = AuthorsCodeAggregator(
        make_weights("equal", 2), sampling_matrix([2, 1], 2, 0.0), [10, 5], root=0, exit_keys=lambda e: ["a"]
    )
    g = state(a=[1.0])
    agg.begin(g, 1, [(1, 1)])
    agg.add(cl[1], 1, state(a=[3.0]))
    agg.finish(g)
    assert g["a"].item() == pytest.approx(1.0 + 0.5 * 1.0 * (3.0 - 1.0))


def test_balanced_is_their_err_min_bias_opt_mean_with_appendix_c_constants():
    spec = make_spec("paper-7", "80-15-5")
    rates = compute_rates(spec)
    lam = np.array([rates.exit_serving_rate[e] for e in (1, 2, 3)])
    sigma = APPENDIX_C_SIGMA[CIFAR10_EXITS]
    got = authors_balanced_weights(lam, sigma, [n.exit for n in spec.nodes], [100, 50, 50, 25, 25, 25, 25])
    opt = np.array([1 / (0.00374**2 * 0.25**2 * 4), 1 / (0.00224**2 * 0.5**2 * 2), 1 / 0.00101**2])
    want = (lam / lam.sum() + opt / opt.sum()) / 2
    assert got == pytest.approx(want / want.sum())
    assert APPENDIX_C_SIGMA[CIFAR100_EXITS] == (0.00216, 0.00126, 0.00101)


def test_appendix_c_constants_only_where_the_exits_sit_after_layers_3_9_17():
    assert appendix_c_sigma(ResNet18EE(exits=CIFAR10_EXITS, width=0.125)) == list(APPENDIX_C_SIGMA[CIFAR10_EXITS])
    assert appendix_c_sigma(ResNet18EE(exits=(2, 4, 8), width=0.125)) is None


def test_exit_state_keys_are_the_parts_an_exit_trains():
    model = ResNet18EE(exits=CIFAR10_EXITS, width=0.0625)
    keys = set(model.exit_state_keys(2))
    assert {k for k in model.state_dict() if k.startswith(("stage_list.0.body", "stage_list.1."))} == keys
    assert not any(k.startswith(("stage_list.0.head", "stage_list.2")) for k in keys)


def test_config_resolves_the_authors_rules_and_refuses_others():
    c = make_config(overrides={"algorithm": "authors-code"})
    assert (c.p_mode, c.bn_rule, c.coefficient_rule) == ("multiply", "literal", "literal")
    printed = make_config()
    assert (printed.algorithm, printed.p_mode, printed.bn_rule) == ("printed", "divide", "convex")
    for bad in ({"p_mode": "divide"}, {"bn_rule": "convex"}, {"coefficient_rule": "capped"}):
        with pytest.raises(CisError, match="authors-code"):
            make_config(overrides={"algorithm": "authors-code", **bad})
    with pytest.raises(CisError, match="algorithm"):
        make_config(overrides={"algorithm": "nonsense"})


def test_root_index_is_the_node_without_a_parent():
    spec = make_spec("paper-7", "80-15-5")
    assert spec.nodes[root_index(spec)].parent is None
    assert pair_coefficient(1.0, 1, 1, 0.5, "multiply") == 0.5


def test_a_real_round_is_the_aliased_update_of_its_local_models():
    from cis.training.run import build_setup

    s = build_setup(make_config(overrides={"algorithm": "authors-code", "p": 0.2, "rounds": 2, "seed": 3}))
    agg = s.engine.aggregator
    assert isinstance(agg, AuthorsCodeAggregator)
    seen, add = {}, agg.add
    agg.add = lambda client, e, local: (seen.__setitem__(client.index, (e, clone(local))), add(client, e, local))[1]
    start = clone(s.engine.global_state)
    s.engine.run_round()
    root = root_index(s.spec)
    order = sorted(seen)
    coefs = dict(zip(order, agg.coefficients(1, [(i, seen[i][0]) for i in order])))
    want = aliased_update(
        seen[root][1], [(local, coefs[i], s.model.exit_state_keys(e)) for i, (e, local) in seen.items() if i != root]
    )
    for k, v in s.engine.global_state.items():
        assert torch.allclose(v.double(), want[k].double(), atol=1e-6), k
    assert any(not torch.equal(start[k], v) for k, v in s.engine.global_state.items())


def clone(st):
    return {k: v.detach().clone() for k, v in st.items()}


# ---------------------------------------------------------------- head_update: the released code's exit-head rule


def split_keys(e, head=True):
    """A toy model: one shared body, one head per exit."""
    return ["body"] + ([f"head{e}"] if head else [])


@pytest.mark.parametrize("rule", ["applied", "released-code"])
def test_released_rule_drops_every_non_root_head_update(rule):
    # their aggregate(): `for block in range(e_block)` leaves block = e_block - 1, so head e's difference goes to
    # w_diff.classifiers[L_e - 1] (2, 8, 16 for layers 3, 9, 17), but it is applied only where
    # `block in layers_per_classifier` (3 and 9): no non-root head difference ever reaches the model
    exits = [3, 2, 1]
    cl = clients([10, 5, 5], exits)
    weights = make_weights("explicit", 3, vector=[0.4, 0.3, 0.3])
    agg = AuthorsCodeAggregator(weights, sampling_matrix(exits, 3, 0.0), [10, 5, 5], 0, split_keys, head_update=rule)
    g = state(body=[0.0], head1=[0.0], head2=[0.0], head3=[0.0])
    root = state(body=[1.0], head1=[0.0], head2=[0.0], head3=[2.0])  # the root trains exit 3 in place
    edge = state(body=[3.0], head1=[0.0], head2=[5.0], head3=[0.0])
    leaf = state(body=[4.0], head1=[7.0], head2=[0.0], head3=[0.0])
    pairs = [(0, 3), (1, 2), (2, 1)]
    agg.begin(g, 1, pairs)
    for (i, e), local in zip(pairs, (root, edge, leaf)):
        agg.add(cl[i], e, local)
    agg.finish(g)
    c = dict(zip(pairs, agg.coefficients(1, pairs)))
    # bodies move by every pair under both rules, against the root's trained weights
    assert g["body"].item() == pytest.approx(1.0 + c[1, 2] * (3.0 - 1.0) + c[2, 1] * (4.0 - 1.0))
    assert g["head3"].item() == 2.0  # the root's own head: trained in place, kept under both rules
    heads = agg.last_stats["coefficients"]["head"]
    if rule == "applied":
        assert g["head2"].item() == pytest.approx(c[1, 2] * 5.0) and g["head1"].item() == pytest.approx(c[2, 1] * 7.0)
        assert heads == [pytest.approx(c[2, 1]), pytest.approx(c[1, 2]), 1.0]
        assert "head_update" not in agg.last_stats
    else:
        assert g["head2"].item() == 0.0 and g["head1"].item() == 0.0  # the start's heads: the updates are lost
        assert heads == [0.0, 0.0, 1.0] and agg.last_stats["head_update"] == "released-code"


@pytest.mark.parametrize("rule", ["applied", "released-code"])
def test_a_real_round_at_p0_moves_the_lower_heads_only_when_applied(rule):
    from cis.training.run import build_setup

    s = build_setup(make_config(overrides={"algorithm": "authors-code", "head_update": rule, "rounds": 2, "seed": 3}))
    start = clone(s.engine.global_state)
    for _ in range(2):
        s.engine.run_round()
    moved = {k for k, v in s.engine.global_state.items() if not torch.equal(start[k], v)}
    heads = {e: set(s.model.exit_state_keys(e)) - set(s.model.exit_state_keys(e, head=False)) for e in (1, 2, 3)}
    assert heads[3] <= moved  # the root (exit 3 at p = 0) trains its head in place under both rules
    assert any(k.startswith("stage_list.0.body") for k in moved)
    lower = heads[1] | heads[2]  # at p = 0 only the edges and devices train these
    assert (lower <= moved) if rule == "applied" else not (lower & moved)


def test_head_update_is_authors_codes_diagnostic():
    assert make_config().head_update == "applied"
    assert make_config(overrides={"algorithm": "authors-code"}).head_update == "applied"
    with pytest.raises(CisError, match="head_update"):
        make_config(overrides={"head_update": "released-code"})
    with pytest.raises(CisError, match="head_update"):
        make_config(overrides={"algorithm": "authors-code", "head_update": "nonsense"})
    model = ResNet18EE(exits=CIFAR10_EXITS, width=0.0625)
    assert set(model.exit_state_keys(2)) - set(model.exit_state_keys(2, head=False)) == {
        k for k in model.state_dict() if k.startswith("stage_list.1.head.")
    }
