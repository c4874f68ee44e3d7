"""The federated engine: one round equals Algorithm 1 computed by hand; resume replays exactly."""

import copy

import pytest
import torch

from cis.training.aggregation.aggregators import CisAggregator
from cis.training.aggregation.line12 import aggregate, pair_coefficient
from cis.training.aggregation.weights import make_weights
from cis.training.architectures import build_model
from cis.training.federated import ExitSampler, FederatedEngine, derived_generator
from cis.training.local import Client, ExitSGDTrainer, batch_indices, cosine_lr, local_steps
from cis.training.models.cnns import default_model_config
from cis.training.sampling import exit_data_sizes, sampling_matrix

pytestmark = pytest.mark.usefixtures("one_torch_thread")


EXITS = [3, 2, 2, 1, 1]
SIZES = [40, 20, 20, 12, 12]


def make_clients(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        Client(f"n{k}", k, e, torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
        for k, (e, n) in enumerate(zip(EXITS, SIZES))
    ]


def make_engine(weights_vec=(0.5, 0.3, 0.2), p=0.0, seed=0, rounds=4):
    torch.manual_seed(1)
    model = build_model(default_model_config("digits", 0.5))
    clients = make_clients()
    m = sampling_matrix(EXITS, 3, p=p)
    w = make_weights("explicit", 3, vector=list(weights_vec), total_rounds=rounds)
    trainer = ExitSGDTrainer(lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=8, steps=3, total_rounds=rounds)
    sampler = ExitSampler(m, 1.0)
    agg = CisAggregator(w, m, [c.size for c in clients])
    return FederatedEngine(model, clients, sampler, trainer, agg, seed=seed), m


def test_one_round_equals_algorithm_1_by_hand():
    engine, m = make_engine(p=0.2)
    start = copy.deepcopy(engine.model)
    g0 = {k: v.clone() for k, v in engine.global_state.items()}
    result = engine.run_round()
    pairs = [(int(r["node"][1:]), r["exit"]) for r in result["pairs"]]
    assert pairs == engine.chooser.choose(1, derived_generator(0, 1))
    se = exit_data_sizes(m, SIZES)
    lam = [0.5, 0.3, 0.2]
    updates = []
    for i, e in pairs:  # each node trains its own copy from w^(t): J steps of SGD on exit e's loss only
        local = copy.deepcopy(start).train()
        opt = torch.optim.SGD(local.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        gen = derived_generator(0, 1, i + 1)
        c = engine.clients[i]
        for idx in batch_indices(c.size, 8, 3, gen):
            loss = torch.nn.functional.cross_entropy(local(c.x[idx], upto=e)[e - 1], c.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        updates.append((local.state_dict(), pair_coefficient(lam[e - 1], SIZES[i], se[e - 1], m[i, e - 1])))
    expected = aggregate(g0, updates)
    for k, v in engine.global_state.items():
        assert torch.allclose(v.float(), expected[k].float(), atol=1e-6), k
    assert engine.aggregator.last_coefficients == pytest.approx([u[1] for u in updates])


def test_unweighted_exits_leave_their_layers_untouched():
    """Lambda~ = (1, 0, 0): nothing beyond stage 1 moves (no per-parameter renormalisation)."""
    engine, _ = make_engine(weights_vec=(1.0, 0.0, 0.0))
    g0 = {k: v.clone() for k, v in engine.global_state.items()}
    engine.run_round()
    for k, v in engine.global_state.items():
        if k.startswith("stage_list.0."):
            continue
        if v.is_floating_point():
            assert torch.equal(v, g0[k]), k
    assert any(
        not torch.equal(engine.global_state[k], g0[k])
        for k in g0
        if k.startswith("stage_list.0.") and g0[k].is_floating_point()
    )


def test_momentum_state_is_per_node_and_kept_across_rounds():
    engine, _ = make_engine()
    engine.run_round()
    state = engine.trainer.state_dict()["optimizer"]
    assert set(state) == {f"n{k}" for k in range(5)}
    assert all(key.endswith(".momentum_buffer") for node in state.values() for key in node)
    # a node with exit 1 only has momentum for the parameters its loss touches
    n_exit1 = len(state["n3"])
    n_exit3 = len(state["n0"])
    assert 0 < n_exit1 < n_exit3


def test_resume_replays_exactly():
    full, _ = make_engine(p=0.2)
    for _ in range(4):
        full.run_round()
    first, _ = make_engine(p=0.2)
    for _ in range(2):
        first.run_round()
    saved = {k: v.clone() for k, v in first.global_state.items()}
    engine_state = first.state_dict()
    resumed, _ = make_engine(p=0.2)
    resumed.load_state_dict(engine_state, saved)
    while resumed.round < 4:
        resumed.run_round()
    for k, v in full.global_state.items():
        assert torch.equal(v, resumed.global_state[k]), k


def test_schedule_and_local_steps():
    assert cosine_lr(0.1, 1, 10) == pytest.approx(0.1)
    assert cosine_lr(0.1, 6, 10) == pytest.approx(0.05)
    assert cosine_lr(0.1, 3, 10, "constant") == 0.1
    assert local_steps([100, 450, 30], 128) == 4  # ceil(450/128): every node does the largest node's epoch
    assert local_steps([100], 128, steps=7) == 7
    b = batch_indices(5, 8, 3, torch.Generator().manual_seed(0))
    assert len(b) == 3 and all(len(x) == 5 for x in b)


def test_partial_participation_scales_by_inclusion():
    clients = make_clients()
    m = sampling_matrix(EXITS, 3)
    sampler = ExitSampler(m, 0.4)
    assert sampler.inclusion == pytest.approx(2 / 5)
    pairs = sampler.choose(1, derived_generator(0, 1))
    assert len(pairs) == 2
    agg = CisAggregator(make_weights("equal", 3), m, [c.size for c in clients], sampler.inclusion)
    assert agg.coefficients(1, [(0, 3)]) == pytest.approx([(1 / 3) * 1.0 / 0.4])
