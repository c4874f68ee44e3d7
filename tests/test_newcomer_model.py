"""A newcomer's model without surprises (issue 43 item 6): a ``--model-arg`` of the wrong kind is one line that
shows the value, and a factory that raises shows its arguments; a ``pkg.module:FACTORY`` model rebuilds from
another working directory; ``--weights-prefix`` strips a wrapper's prefix (``model.backbone.``), and a file none
of whose names fit says which prefix stripped would make them fit; ``--centralised`` says how its SGD steps
compare with the federated run's at the same flags; ``scripts/install_torch.sh`` asks PyTorch's CPU index for
torchvision's CPU build beside a CPU torch only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cli_process import cis_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT_MODEL = f"{ROOT / 'examples' / 'text' / 'model.py'}:make"
TRAIN = ("--serving", "60-30-10", "--rounds", "1", "--local-steps", "1", "--no-progress", "--log-level", "warning")


@pytest.fixture()
def topics(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "topics.npz", x=rng.integers(30, 64, (300, 16)), y=rng.integers(0, 4, 300))
    return tmp_path / "topics.npz"


def error(r) -> str:
    assert r.code == 2 and r.err.count("\n") == 1, (r.code, r.err)
    return r.err.strip().removeprefix("cis train: error: ")


def test_a_model_arg_of_the_wrong_kind_is_one_line_with_its_value(tmp_path, run_cli, topics):
    r = run_cli("train", "--model", TEXT_MODEL, "--model-arg", "dim=abc", "--data", topics, *TRAIN,
                "--out", tmp_path / "run")
    assert error(r) == f"model {TEXT_MODEL}: --model-arg dim='abc': expected an integer (dim, default 32)"
    (tmp_path / "typed.py").write_text(
        "from __future__ import annotations\n\n\n"
        "def make(num_classes, input_shape, width: float = 1, deep: bool = False):\n"
        "    raise ValueError(f'width {width} is too small')\n"
    )
    typed = f"{tmp_path / 'typed.py'}:make"
    r = run_cli("train", "--model", typed, "--model-arg", "deep=yes", "--data", topics, *TRAIN, "--out", tmp_path / "r")
    assert error(r) == f"model {typed}: --model-arg deep='yes': expected true or false (deep, default False)"
    r = run_cli("train", "--model", typed, "--model-arg", "width=2", "--data", topics, *TRAIN, "--out", tmp_path / "r")
    assert error(r) == (f"model {typed}: make(width=2, num_classes=4, input_shape=(16,)) raised ValueError: width 2 "
                        "is too small")
    assert not (tmp_path / "run").exists() and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_module_reference_rebuilds_from_another_working_directory(tmp_path, topics):
    """Trained as ``mymodels.text:make`` from the folder that holds the package; exported and resumed from
    another folder (new processes: an imported module would hide a missing path)."""
    pkg = tmp_path / "work" / "mymodels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "text.py").write_text((ROOT / "examples" / "text" / "model.py").read_text())
    run = tmp_path / "run"
    trained = subprocess.run(cis_argv("train", "--model", "mymodels.text:make", "--data", topics, *TRAIN,
                                      "--rounds", "2", "--stop-after", "1", "--out", run),
                             cwd=tmp_path / "work", capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr
    assert json.loads((run / "config.json").read_text())["model_root"] == str(tmp_path / "work")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = subprocess.run(cis_argv("train", "--out", run, "--resume", "--no-progress", "--log-level", "warning"),
                             cwd=elsewhere, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run / "checkpoint.json").read_text())["model"]["root"] == str(tmp_path / "work")
    exported = subprocess.run(cis_argv("export", run, "--out", tmp_path / "bundle", "--latency-repeats", "1",
                                       "--log-level", "warning"), cwd=elsewhere, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "bundle" / "manifest.json").is_file()


def test_weights_prefix_strips_a_wrappers_prefix(tmp_path, run_cli, topics):
    from cis.training.models.model_ref import user_model

    model = user_model(TEXT_MODEL, {}, {"num_classes": 4, "input_shape": (16,)}, torch.int64)
    torch.save({f"model.backbone.{k}": v for k, v in model.state_dict().items()}, tmp_path / "wrapped.pt")
    r = run_cli("train", "--model", TEXT_MODEL, "--data", topics, *TRAIN, "--weights", tmp_path / "wrapped.pt",
                "--out", tmp_path / "a")
    assert error(r).endswith("; without the prefix 'model.backbone.' they fit: --weights-prefix model.backbone.")
    r = run_cli("train", "--model", TEXT_MODEL, "--data", topics, *TRAIN, "--weights", tmp_path / "wrapped.pt",
                "--weights-prefix", "model.", "--out", tmp_path / "b")
    assert error(r).startswith(f"--weights {tmp_path / 'wrapped.pt'}: none of its")  # backbone.* fits nothing
    r = run_cli("train", "--model", TEXT_MODEL, "--data", topics, *TRAIN, "--weights", tmp_path / "wrapped.pt",
                "--weights-prefix", "encoder.", "--out", tmp_path / "c")
    assert error(r) == (f"--weights-prefix 'encoder.': none of {tmp_path / 'wrapped.pt'}'s "
                        f"{len(model.state_dict())} tensors starts with it (first: 'model.backbone.stage_list.0."
                        "body.0.position')")
    r = run_cli("train", "--model", TEXT_MODEL, "--data", topics, *TRAIN, "--weights", tmp_path / "wrapped.pt",
                "--weights-prefix", "model.backbone.", "--out", tmp_path / "d", "--log-level", "info")
    assert r.code == 0, r.err
    n = len(model.state_dict())
    assert f"--weights {tmp_path / 'wrapped.pt'}: loaded {n} of the model's {n} tensors" in r.err
    tuned = run_cli("train", "--init", tmp_path / "d", "--rounds", "1", "--out", tmp_path / "e", "--no-progress")
    assert tuned.code == 0, tuned.err  # how d started (--weights, --weights-prefix) is not inherited
    assert json.loads((tmp_path / "d" / "config.json").read_text())["weights_prefix"] == "model.backbone."


def test_centralised_says_how_its_steps_compare_with_the_federated_run(tmp_path, run_cli, topics):
    r = run_cli("train", "--model", TEXT_MODEL, "--data", topics, "--centralised", *TRAIN, "--rounds", "2",
                "--local-steps", "3", "--out", tmp_path / "run")
    assert r.code == 0, r.err
    assert r.out.strip().splitlines()[-1] == (
        "SGD steps: 6 (3 a round); the federated run at these flags takes 42 (21 a round, every node its own): "
        "--local-steps 21 matches it"
    )
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["sgd_steps"]
    assert steps["total"] == 6 and steps["per_round"] == 3
    assert steps["federated"] == {"per_round": 21, "total": 42}


@pytest.mark.parametrize("cuda, asked", [(None, True), ("12.8", False)])
def test_install_torch_asks_for_torchvisions_cpu_build_beside_a_cpu_torch_only(tmp_path, cuda, asked):
    """The script's decision, with a stand-in interpreter that records what it is asked (the index itself is
    not reachable from here)."""
    log = tmp_path / "calls"
    py = tmp_path / "python"
    py.write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {log}\n"
        'case "$*" in *"torch.version.cuda"*) '
        + ("exit 0" if cuda is None else "exit 1") + ";; esac\nexit 0\n"
    )
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install_torch.sh"), str(py)], capture_output=True,
                          text=True, env={**os.environ})
    assert done.returncode == 0
    calls = log.read_text().splitlines()
    assert calls[0] == f"{ROOT / 'scripts' / 'fast_pip.py'} -q torch==2.13.0"  # pip install, through uv where it can
    cpu = [c for c in calls if "download.pytorch.org/whl/cpu" in c]
    assert bool(cpu) == asked
    if asked:
        assert cpu[0].endswith("torchvision==0.28.0+cpu")
        assert "torchvision 0.28.0+cpu (CPU build) installed" in done.stdout
