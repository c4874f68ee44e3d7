"""cis train --engine flower: the strategy's line 12 is cis.training.aggregation's; Flower's simulation
and deployment engines train the digits model to the built-in engine's accuracy (bit-identical here)."""

import json
import re

import pytest

flwr = pytest.importorskip("flwr")

from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from cis.core.errors import CisError  # noqa: E402
from cis.training.aggregation.line12 import aggregate, pair_coefficient  # noqa: E402
from cis.training.config import make_config  # noqa: E402
from cis.training.flower.launch import run_flower  # noqa: E402
from cis.training.flower.records import (  # noqa: E402
    ARRAYS_KEY,
    STATS_RECORD,
    record_to_state,
    state_to_record,
)
from cis.training.flower.strategy import CisStrategy  # noqa: E402
from cis.training.run import build_setup, train_run  # noqa: E402
from cis.training.sampling import exit_data_sizes  # noqa: E402

ROUNDS = 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def digits_config(**kw):
    return make_config(overrides={"rounds": ROUNDS, "seed": 0, **kw})


class Reply:
    """A reply as aggregate_train reads it (flwr's Message needs a running Flower task to be built)."""

    def __init__(self, content, src):
        self.content, self.metadata = content, SimpleNamespace(src_node_id=src)

    def has_error(self):
        return False


def reply(node_index, exit, state):
    content = RecordDict(
        {
            ARRAYS_KEY: state_to_record(state),
            STATS_RECORD: ConfigRecord(
                {
                    "node-index": node_index,
                    "exit": exit,
                    "json": json.dumps({"loss": 1.0, "steps": 1, "samples": 1, "lr": 0.1}),
                }
            ),
        }
    )
    return Reply(content, 100 + node_index)


def test_aggregate_train_equals_training_aggregation():
    config = digits_config(p=0.2, server_lr=0.7, strategy="explicit", weights=[0.5, 0.3, 0.2])
    s = build_setup(config)
    strategy = CisStrategy(s.engine, "{}")
    strategy.nodes = {i: 100 + i for i in range(len(s.clients))}  # Flower node ids, as discover() maps them
    g0 = {k: v.clone() for k, v in s.engine.global_state.items()}
    pairs = strategy.begin_round(1, state_to_record(g0))
    gen = torch.Generator().manual_seed(5)
    locals_ = {}
    for i, _ in pairs:  # hand-made local states: the global one plus noise (counts moved too)
        locals_[i] = {
            k: (v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v + i)
            for k, v in g0.items()
        }
    replies = [reply(i, e, locals_[i]) for i, e in reversed(pairs)]  # any arrival order
    arrays, metrics = strategy.aggregate_train(1, replies)
    got = record_to_state(arrays)

    sizes = [c.size for c in s.clients]
    se = exit_data_sizes(s.matrix, sizes)
    lam = s.weights.at(1)
    coefs = [
        pair_coefficient(float(lam[e - 1]), sizes[i], float(se[e - 1]), float(s.matrix[i, e - 1]), config.p_mode)
        for i, e in pairs
    ]
    want = aggregate(g0, [(locals_[i], c) for (i, _), c in zip(pairs, coefs)], config.server_lr)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype
        assert torch.equal(got[k], want[k]), k
    assert s.engine.round == 1 and metrics["pairs"] == len(pairs)


class SilentGrid:
    """Flower's Grid as discover() uses it, where no SuperNode answers."""

    def __init__(self, n: int):
        self.ids, self.sent = [100 + k for k in range(n)], []

    def get_node_ids(self):
        return list(self.ids)

    def send_and_receive(self, messages, timeout):
        self.sent.append([m.metadata.dst_node_id for m in messages])
        return []


@pytest.fixture
def flower_task(monkeypatch):
    """The identity a ServerApp's process has in a Flower run (a Message is built only inside one)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


def test_discover_names_the_nodes_still_silent_at_the_timeout(flower_task):
    s = build_setup(digits_config(p=0.2))
    grid = SilentGrid(len(s.clients))
    with pytest.raises(CisError, match=r"no SuperNode answered for CIS node\(s\) .* within 1 s"):
        CisStrategy(s.engine, "{}", connect_timeout=1.0).discover(grid)
    assert grid.sent == [grid.ids]  # asked once: a second query could overwrite a node's context (its momentum)


def chain_config(tmp_path_factory):
    """A 3-node chain (device -> edge -> cloud, one node per exit): the engines' processes and tasks scale with
    the nodes (in deployment a SuperNode each, and a ClientApp process per node and message), so their tests
    run on 3 nodes, not paper-7's 7."""
    from cis.core.spec import CisSpec, Node, validate, write_spec

    spec = validate(CisSpec((
        Node("cloud", 3), Node("edge", 2, parent="cloud", max_transfer_rate=4.0),
        Node("device", 1, parent="edge", arrival_rate=10.0, max_transfer_rate=6.0),
    ), 3, name="chain"))  # fmt: skip
    path = tmp_path_factory.mktemp("chain") / "chain.toml"
    write_spec(spec, path)
    return digits_config(spec=str(path))


@pytest.fixture(scope="module")
def chain_builtin(tmp_path_factory):
    config = chain_config(tmp_path_factory)
    out = tmp_path_factory.mktemp("chain-builtin")
    return config, (train_run(config, out, progress=False, log=lambda s: None), out)


def same_run(flower_out, flower_summary, builtin):
    summary, out = builtin
    assert abs(flower_summary["cis_accuracy"] - summary["cis_accuracy"]) <= 0.02
    assert abs(flower_summary["final_exit_accuracy"] - summary["final_exit_accuracy"]) <= 0.02
    for name in (
        "config.json",
        "spec.toml",
        "weights.json",
        "metrics.jsonl",
        "checkpoint.pt",
        "checkpoint.json",
        "summary.json",
    ):
        assert (flower_out / name).is_file(), name
    lines = [json.loads(x) for x in (flower_out / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [ln["round"] for ln in lines] == list(range(1, ROUNDS + 1))
    # same seed, same pairs, same trainer and momentum, same aggregation order: the same numbers
    assert [ln["loss"] for ln in lines] == [ln["loss"] for ln in want]
    assert [ln["val_cis_accuracy"] for ln in lines] == [ln["val_cis_accuracy"] for ln in want]
    from cis.training.checkpoint import load_checkpoint

    a, meta, _ = load_checkpoint(flower_out)
    b, _, _ = load_checkpoint(out)
    assert meta["round"] == ROUNDS and meta["engine"] == "flower"
    for k, v in b.state_dict().items():
        assert torch.equal(a.state_dict()[k], v), k


def test_simulation_engine_matches_builtin(tmp_path, chain_builtin):
    """Given as docs/flower.md's snippet may give it: an unresolved RunConfig (run_flower resolves it)."""
    from cis.training.config import RunConfig

    config, builtin = chain_builtin
    out = tmp_path / "run"
    unresolved = RunConfig(rounds=ROUNDS, seed=0, spec=config.spec)
    assert unresolved.batch_size is None and unresolved.resolved() == config
    summary = run_flower(unresolved, out, "simulation", num_cpus=2, log=lambda s: None)
    assert summary["engine"] == "flower"
    same_run(out, summary, builtin)


@pytest.mark.slow
def test_deployment_engine_on_loopback_matches_builtin(tmp_path, chain_builtin):
    """SuperLink + a SuperNode per node as subprocesses on 127.0.0.1 (free ports), always stopped."""
    from cis.training.flower.deploy import LoopbackFederation

    config, builtin = chain_builtin
    out = tmp_path / "run"
    fed = LoopbackFederation(3, workdir=tmp_path / "fed")
    with fed:
        sub = fed.run(config, out, round_timeout=200, connect_timeout=120, timeout=420)
        # the same federation, a run for the default 7-node spec: its ServerApp stops at the connect timeout;
        # `flwr run` still exits 0, the SuperLink's status (`flwr ls`) says failed, and run_end's one line is the
        # ServerApp's own, from OUT/flower.log (a loopback SuperLink: this machine)
        from cis.training.flower.deploy import submit_run

        wide = make_config(overrides={"rounds": 1, "seed": 0})
        failed = submit_run(wide, tmp_path / "wide", fed.address, connect_timeout=3, status=True)
    assert all(p.poll() is not None for p in fed.procs) and not fed.procs
    summary = json.loads((out / "summary.json").read_text())
    same_run(out, summary, builtin)
    from cis.training.flower.launch import run_end

    # a loopback SuperLink is this machine: run_flower's result is the run dir's summary
    assert isinstance(sub.run_id, int) and run_end(out, sub) == summary and (out / "flower.log").is_file()
    said = "flower: 3 SuperNodes connected after 3 s; the spec has 7 nodes"
    assert failed.status == "finished:failed" and said in failed.details
    with pytest.raises(CisError, match=re.escape(said) + r".*the ServerApp's log: .*flower\.log"):
        run_end(tmp_path / "wide", failed)
