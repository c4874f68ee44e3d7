"""HeteroFL's static BatchNorm (cis/training/methods/static_bn.py) on digits: no running statistics while
training; afterwards each sub-model's own, a cumulative average over the nodes' training data; the same
statistics in summary.json, the checkpoint, ``cis evaluate`` and the exported stages; ``static_bn=false``
is the old behaviour, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from cis.training.aggregation.aggregators import SubsetAggregator
from cis.training.data.loading import load_dataset
from cis.training.families.nested import build_subset_method, default_gammas, subset_model, tier_matrix
from cis.training.federated import ExitSampler, FederatedEngine
from cis.training.local import Client
from cis.training.methods.nested import BN_STATISTICS, NestedNet, nefl_specs
from cis.training.methods.resnet import LAYOUTS
from cis.training.methods.static_bn import is_stale, recompute_statistics_, refresh_statistics
from cis.training.methods.subfl import NestedDevice, SubsetTrainer
from cis.training.selection import gather

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCH = 16
SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4, batch_size=BATCH, steps=3, total_rounds=3)


@pytest.fixture(scope="module")
def clients() -> list[Client]:
    """Three digits nodes of tiers 1, 2, 3 with 150, 200, 250 images (batches of 16 leave partial ones)."""
    train = load_dataset("digits", seed=0).train
    x, y = torch.from_numpy(train.x), torch.from_numpy(train.y)
    bounds = [0, 150, 350, 600]
    return [Client(f"n{i}", i, i + 1, x[bounds[i] : bounds[i + 1]], y[bounds[i] : bounds[i + 1]]) for i in range(3)]


def heterofl(clients: list[Client], static_bn: bool) -> FederatedEngine:
    torch.manual_seed(0)
    model = subset_model("heterofl", LAYOUTS["digits"], 3, static_bn=static_bn)
    return FederatedEngine(model, clients, *build_subset_method("heterofl", model, clients, SGD), seed=0)


def run(engine: FederatedEngine, rounds: int) -> FederatedEngine:
    for _ in range(rounds):
        engine.run_round()
    return engine


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_no_running_statistics_while_training(clients):
    engine = heterofl(clients, static_bn=True)
    model = engine.model
    assert not any(k.startswith("shared.") and k.endswith(BN_STATISTICS) for k in model.state_dict())
    net, sel = model.trainee(2)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(not m.track_running_stats and m.running_mean is None for m in bns)
    assert sel and not any(ck.endswith(BN_STATISTICS) for ck in sel)
    refresh_statistics(engine, [c.x for c in clients], BATCH)
    before = {k: v.clone() for k, v in engine.global_state.items()}
    assert not is_stale(model)
    engine.run_round()
    uploaded = {gk for upload in engine.trainer.uploads.values() for gk, _ in upload.values()}
    assert uploaded and not any(gk.startswith("sub_stats.") for gk in uploaded)
    for k, v in engine.global_state.items():
        if k.startswith("sub_stats.") and k.endswith("num_batches_tracked"):
            assert int(v) == 0, k  # the new weights made the statistics stale
        elif k.startswith("sub_stats."):
            assert torch.equal(v, before[k]), k  # training neither read nor wrote them
    assert not torch.equal(before["shared.stem.weight"], engine.global_state["shared.stem.weight"])
    assert is_stale(engine.sync_model())


def test_recomputing_statistics_between_rounds_changes_no_weight(clients):
    plain = run(heterofl(clients, static_bn=True), 2)
    evaluated = heterofl(clients, static_bn=True)
    run(evaluated, 1)
    refresh_statistics(evaluated, [c.x for c in clients], BATCH)
    run(evaluated, 1)
    a, b = params(plain.sync_model()), params(evaluated.sync_model())
    assert all(torch.equal(a[k], b[k]) for k in a)


def direct_statistics(model: NestedNet, k: int, node_data: list[torch.Tensor], batch: int) -> tuple[dict, int]:
    """Per BatchNorm of sub-model k: the mean over the nodes' batches of each batch's channel means and
    unbiased variances of that BatchNorm's input (captured by hooks, in float64); and the batch count."""
    net, _ = model.trainee(k)  # normalises with the batch's own statistics
    net.load_state_dict(gather(model.state_dict(), model.selection(k, statistics=False)))
    net.train()
    inputs: dict[str, torch.Tensor] = {}
    for name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_pre_hook(lambda mod, inp, name=name: inputs.__setitem__(name, inp[0].double()))
    sums: dict[str, list[torch.Tensor]] = {}
    n = 0
    with torch.no_grad():
        for x in node_data:
            for i in range(0, len(x), batch):
                net(x[i : i + batch])
                n += 1
                for name, z in inputs.items():
                    mean, var = z.mean((0, 2, 3)), z.var((0, 2, 3), unbiased=True)
                    if name not in sums:
                        sums[name] = [torch.zeros_like(mean), torch.zeros_like(var)]
                    sums[name][0] += mean
                    sums[name][1] += var
    return {name.replace(".", "_"): (m / n, v / n) for name, (m, v) in sums.items()}, n


def test_each_submodel_gets_the_cumulative_average_over_the_training_data(clients):
    engine = run(heterofl(clients, static_bn=True), 2)
    node_data = [c.x for c in clients]
    model = refresh_statistics(engine, node_data, BATCH)
    state = model.state_dict()
    batches = sum(-(-len(x) // BATCH) for x in node_data)
    for k in (1, 2, 3):
        direct, n = direct_statistics(model, k, node_data, BATCH)
        assert n == batches and len(direct) == 9  # stem, 2 in each of the 3 blocks, 2 shortcuts
        for name, (mean, var) in direct.items():
            key = f"sub_stats.{k - 1}.bns.{name}"
            assert int(state[key + ".num_batches_tracked"]) == batches
            torch.testing.assert_close(state[key + ".running_mean"].double(), mean, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(state[key + ".running_var"].double(), var, rtol=1e-4, atol=1e-5)
        assert torch.equal(engine.global_state[f"sub_stats.{k - 1}.bns.stem_bn.running_var"],
                           state[f"sub_stats.{k - 1}.bns.stem_bn.running_var"])
    # the sub-models share BN parameters but not statistics: deeper layers see other inputs
    w1 = len(state["sub_stats.0.bns.blocks_2_bn2.running_var"])
    assert not torch.allclose(state["sub_stats.0.bns.blocks_2_bn2.running_var"],
                              state["sub_stats.2.bns.blocks_2_bn2.running_var"][:w1], rtol=1e-2)


class PreviousNestedDevice(NestedDevice):
    """The device rule before static BN, verbatim: the sub-model's compact network and its selection."""

    def choose(self, model, client, k, round, gen):
        sel = model.selection(k)
        return model.compact(k), sel, sel


def test_static_bn_off_is_the_previous_heterofl_bit_for_bit(clients):
    off = run(heterofl(clients, static_bn=False), 3)
    torch.manual_seed(0)
    layout = LAYOUTS["digits"]
    model = NestedNet(layout, nefl_specs(layout, default_gammas(3), "W"), decoupled_bn=False, use_steps=False)
    trainer = SubsetTrainer(PreviousNestedDevice(), **SGD)
    sampler = ExitSampler(tier_matrix([[c.max_exit] for c in clients], 3))
    previous = run(FederatedEngine(model, clients, sampler, trainer, SubsetAggregator(trainer), seed=0), 3)
    a, b = off.sync_model().state_dict(), previous.sync_model().state_dict()
    assert list(a) == list(b) and not any(k.startswith("sub_stats.") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert int(a["shared.stem_bn.num_batches_tracked"]) > 0  # tracked while training, as before
    on = run(heterofl(clients, static_bn=True), 3)
    p_on, p_off = params(on.sync_model()), params(off.sync_model())
    assert list(p_on) == list(p_off) and all(torch.equal(p_on[k], p_off[k]) for k in p_on)  # only statistics differ


def test_static_bn_is_heterofl_s_option_only():
    from cis.core.errors import CisError
    from cis.training.methods.registry import OPTIONS, method_options

    assert OPTIONS["static_bn"].methods == ("heterofl",) and OPTIONS["static_bn"].default is True
    assert method_options("heterofl", static_bn="false")["static_bn"] is False
    with pytest.raises(CisError, match="not an option of method 'fjord'"):
        method_options("fjord", static_bn="true")
    assert not subset_model("fjord", LAYOUTS["digits"], 3).static_bn  # the schema default reaches heterofl only
    with pytest.raises(CisError, match="static BatchNorm"):
        NestedNet(LAYOUTS["digits"], nefl_specs(LAYOUTS["digits"], [0.5, 1.0]), decoupled_bn=True, static_bn=True)


@pytest.mark.slow
def test_a_trained_run_evaluates_checkpoints_and_exports_its_own_statistics(tmp_path, run_cli):
    from cis.core.bundle import load_bundle
    from cis.core.stages.runner import run_chain
    from cis.training.checkpoint import load_checkpoint
    from cis.training.config import make_config
    from cis.training.evaluate import predict_exits
    from cis.training.run import build_setup

    run_dir, bundle_dir = tmp_path / "run", tmp_path / "bundle"
    argv = ["--method", "heterofl", "--dataset", "digits", "--rounds", "2", "--local-steps", "3"]
    res = run_cli("train", *argv, "--out", run_dir, "--no-progress", "--json")
    assert res.code == 0, res.err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["options"]["static_bn"] is True
    model, meta, _ = load_checkpoint(run_dir)
    assert model.static_bn and not is_stale(model)
    # the checkpoint's statistics are those of its weights over the nodes' training data
    s = build_setup(make_config(json.loads((run_dir / "config.json").read_text())))
    fresh = load_checkpoint(run_dir)[0]
    stats = recompute_statistics_(fresh, [c.x for c in s.clients], s.config.batch_size)
    saved = model.state_dict()
    assert stats and all(torch.equal(v, saved[k]) for k, v in stats.items())
    ev = run_cli("evaluate", run_dir, "--json")
    assert ev.code == 0, ev.err
    assert ev.json()["exit_accuracy"] == summary["test"]["exit_accuracy"]
    assert ev.json()["cis_accuracy"] == summary["test"]["cis_accuracy"]
    res = run_cli("export", run_dir, "--out", bundle_dir, "--latency-repeats", "2", "--json")
    assert res.code == 0, res.err
    assert res.json()["verification"]["passed"]
    x = load_dataset("digits", seed=0).test.x[:200]
    offline, served = predict_exits(model, x), run_chain(load_bundle(bundle_dir), x)
    for e in (1, 2, 3):
        np.testing.assert_allclose(served[e], offline[e], atol=1e-4)
    # stage 1 serves sub-model 1's own statistics: with sub-model 3's (sliced) its logits would differ
    wrong = model.serving_module(1)
    with torch.no_grad():
        for name, m in wrong.named_modules():
            if isinstance(m, nn.BatchNorm2d):
                key = f"sub_stats.2.bns.{name.replace('.', '_')}"
                m.running_mean.copy_(saved[key + ".running_mean"][: m.num_features])
                m.running_var.copy_(saved[key + ".running_var"][: m.num_features])
        assert np.abs(wrong(torch.from_numpy(x)).numpy() - served[1]).max() > 1e-2
