"""The Python API (issue 43 item 7): ``cis.train`` on in-memory torch modules and data, ``cis.export``,
``cis.serve`` in-process and ``cis.infer``; AdamW and gradient clipping as options; ``cis train --help`` grouped,
everyday flags first, defaults shown; ``import cis`` stays light.

Real parts: the text example's transformer trained by the engine, exported to ONNX, served by the spec's seven
nodes (threads of this process, on loopback ZeroMQ sockets) and asked by a real client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from cli_process import cis_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "text"))
import model as text  # noqa: E402

import cis  # noqa: E402
from cis.core.errors import CisError  # noqa: E402


def test_import_cis_stays_light_and_names_the_api():
    code = ("import sys, cis; fns = [cis.train, cis.export, cis.serve, cis.infer]; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'zmq') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def ids(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).integers(30, 64, (n, 16))
    return x, x[:, 0] % 4  # the first token decides the class


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """In-memory stages and arrays (train, val, test given), AdamW with clipping; the run and its bundle."""
    folder = tmp_path_factory.mktemp("api") / "run"
    x, y = ids(400)
    stages = text.make(4, (16,))
    before = [p.detach().clone() for _, head in stages for p in head.parameters()]
    run = cis.train(stages, (torch.from_numpy(x[:300]), torch.from_numpy(y[:300])), val_data=(x[300:350], y[300:350]),
                    test_data=(x[350:], y[350:]), serving="60-30-10", rounds=2, local_steps=2, optimizer="adamw",
                    lr=1e-3, clip_grad_norm=1.0, out=folder)
    after = [p for _, head in stages for p in head.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before))  # the caller's modules are not trained in place
    return run, cis.export(run, latency_repeats=1)


def test_train_returns_the_run_with_its_folder_summary_and_accuracies(trained):
    run, _ = trained
    assert (run.folder / "summary.json").is_file() and (run.folder / "data.npz").is_file()
    assert set(run.exit_accuracy) == {1, 2, 3} and 0.0 <= run.cis_accuracy <= 1.0
    assert run.summary == json.loads((run.folder / "summary.json").read_text())
    config = json.loads((run.folder / "config.json").read_text())
    assert config["optimizer"] == "adamw" and config["clip_grad_norm"] == 1.0
    with np.load(run.folder / "data.npz") as data:
        assert data["split"].tolist() == [0] * 300 + [1] * 50 + [2] * 50
    assert run.model().num_exits == 3


def test_export_serve_and_infer_in_process(trained):
    run, bundle = trained
    assert bundle == run.folder.with_name("run-bundle") and (bundle / "manifest.json").is_file()
    x, y = ids(40, seed=5)
    with cis.serve(bundle) as served:
        assert set(served.addresses) == {"cloud", "edge0", "edge1", "device0", "device1", "device2", "device3"}
        answers = cis.infer(served, x, y, node="device2")
        bad = x[:2].copy()
        bad[1, 0] = 1000
        refused = cis.infer(served.addresses["device0"], bad)
    s = answers.summary
    assert s["samples_answered"] == 40 and s["errors"] == {} and s["degraded"] == 0 and "accuracy" in s
    assert set(s["served_share_per_node"]) <= {"device2", "edge1", "cloud"} and len(answers.results) == 40
    assert refused.summary["errors"] == {"bad_input": 1}
    assert "idx=1000" in refused.summary["error_messages"]["bad_input"]


def test_an_in_memory_run_says_in_another_process_where_it_can_be_rebuilt(trained, tmp_path):
    run, _ = trained
    done = subprocess.run(cis_argv("export", run.folder, "--out", tmp_path / "b", "--log-level", "warning"),
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "the run's model was made of in-memory modules (cis.train) in another process" in done.stderr


class Tokens(torch.utils.data.Dataset):
    classes = ["a", "b", "c", "d"]

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], int(self.y[i])


def test_a_dataset_and_a_factory_train_and_a_mistake_leaves_no_folder(tmp_path):
    x, y = ids(300)
    run = cis.train(lambda num_classes, input_shape: text.make(num_classes, input_shape), Tokens(x, y),
                    serving="60-30-10", rounds=1, local_steps=1, out=tmp_path / "ok")
    assert json.loads((run.folder / "checkpoint.json").read_text())["classes"] == ["a", "b", "c", "d"]
    y[17] = 9
    with pytest.raises(CisError, match="^cis.train train_data: sample 17 has label 9; expected labels 0..3"):
        cis.train(text.make(4, (16,)), Tokens(x, y), serving="60-30-10", rounds=1, out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(CisError, match="config: --optimizer / --clip-grad-norm go with method cis, depthfl"):
        cis.train(None, "digits", method="nefl", optimizer="adamw", out=tmp_path / "nefl")
    assert not (tmp_path / "nefl").exists()


def test_clipping_bounds_a_step_and_adamw_is_torchs():
    from cis.training.local import LocalSGD

    settings = dict(lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=4, steps=1, total_rounds=1)
    for clip, moved in ((1.0, 0.1), (None, 0.1 * 1e6 * 2)):
        layer = torch.nn.Linear(1, 1)
        sgd = LocalSGD(**settings, clip_grad_norm=clip)
        start = torch.cat([p.detach().flatten() for p in layer.parameters()])
        sgd.descend(sgd.make_optimizer(list(layer.parameters())), 1e6 * (layer.weight.sum() + layer.bias.sum()),
                    layer)
        step = torch.cat([p.detach().flatten() for p in layer.parameters()]) - start
        assert float(step.norm()) == pytest.approx(moved * (1 if clip else 2 ** -0.5), rel=1e-4)
    adamw = LocalSGD(**settings, optimizer="adamw").make_optimizer(list(torch.nn.Linear(1, 1).parameters()))
    assert type(adamw) is torch.optim.AdamW


def test_train_help_groups_everyday_flags_first_with_defaults(run_cli):
    r = run_cli("train", "--help")
    assert r.code == 0
    titles = [line[:-1] for line in r.out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["options", "everyday", "local steps", "methods and the papers' knobs", "closed loop", "Flower"]
    everyday = r.out.split("\neveryday:")[1].split("\nlocal steps:")[0]
    assert "--data REF" in everyday and "--model PATH.py:FACTORY" in everyday and "--method" not in everyday
    flat = " ".join(r.out.split())
    assert "--lr LR local SGD learning rate (cosine annealed over rounds) (default 0.05 for digits and your data, " \
           "0.1 for CIFAR)" in flat
    assert "--optimizer {sgd,adamw}" in flat and "(default sgd)" in flat
    assert "simulation engine on this machine, or deployment engine (SuperLink + SuperNodes) (default: deployment " \
        "with --flower-superlink" in flat and "else simulation)" in flat  # argparse may wrap at a flag's hyphen
