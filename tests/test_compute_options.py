"""The GPU speed settings of a run (cis/training/device.py, cis/training/graphs.py): ``memory_format`` channels_last
and ``cuda_graphs`` on change how a run computes, not what. On the CPU channels_last runs as is, and the
graph plumbing runs with a stand-in for torch's capture; the ``gpu`` test captures real CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from cis.core.errors import CisError
from cis.training.config import make_config
from cis.training.graphs import ExitLoss, GraphedExitLoss
from cis.training.run import build_setup

SHORT = {"rounds": 2, "local_steps": 4, "seed": 5, "threads": 1, "augment": True, "p": 0.3}


def trained(**overrides) -> tuple[dict, list[float]]:
    """Two rounds of a digits run: the global state and every pair's loss."""
    s = build_setup(make_config(overrides={**SHORT, **overrides}))
    losses = [p["loss"] for _ in range(2) for p in s.engine.run_round()["pairs"]]
    return {k: v.detach().cpu().clone() for k, v in s.engine.global_state.items()}, losses


class FakeCapture:
    """Stands in for torch.cuda.make_graphed_callables on the CPU: runs warm-up steps on the module (which move
    BatchNorm's running statistics, as the real warm-up does) and returns the module itself."""

    def __init__(self) -> None:
        self.captured: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, module: ExitLoss, sample: tuple[torch.Tensor, ...]):
        self.captured.append((module.exit, tuple(sample[0].shape)))
        for _ in range(3):
            torch.autograd.grad(module(*sample), [p for p in module.parameters() if p.requires_grad],
                                allow_unused=True)  # fmt: skip
        return module


def test_graphed_steps_compute_what_eager_steps_compute():
    want, want_losses = trained()
    s = build_setup(make_config(overrides=SHORT))
    fake = FakeCapture()
    s.engine.trainer.exit_loss = GraphedExitLoss(make=fake)
    pairs = [p for _ in range(2) for p in s.engine.run_round()["pairs"]]
    assert [p["loss"] for p in pairs] == want_losses
    for k, v in s.engine.global_state.items():
        assert torch.equal(v, want[k]), k  # the warm-up's BatchNorm updates were undone
    trained_exits = sorted({p["exit"] for p in pairs})
    assert len(trained_exits) > 1 and sorted(e for e, _ in fake.captured) == trained_exits  # one capture each


def test_channels_last_keeps_the_numbers():
    want, want_losses = trained()
    s = build_setup(make_config(overrides={**SHORT, "memory_format": "channels_last"}))
    convs = [m.weight for m in s.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    got, losses = trained(memory_format="channels_last")
    assert losses == pytest.approx(want_losses, rel=1e-4)
    for k, v in got.items():
        assert torch.allclose(v.float(), want[k].float(), atol=1e-4), k


def test_defaults_and_refusals():
    c = make_config()
    assert (c.memory_format, c.cuda_graphs) == ("contiguous", "off")
    with pytest.raises(CisError, match="memory_format"):
        make_config(overrides={"memory_format": "nhwc"})
    with pytest.raises(CisError, match="cuda_graphs"):
        make_config(overrides={"cuda_graphs": "on", "method": "reefl"})
    if not torch.cuda.is_available():
        with pytest.raises(CisError, match="CUDA graphs need a CUDA device"):
            build_setup(make_config(overrides={**SHORT, "cuda_graphs": "on", "device": "cpu"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_real_cuda_graphs_train_like_eager_steps():
    want, want_losses = trained(device="cuda")
    got, losses = trained(device="cuda", cuda_graphs="on", memory_format="channels_last")
    assert losses == pytest.approx(want_losses, rel=1e-2, abs=1e-3)
    for k, v in got.items():
        assert torch.allclose(v.float(), want[k].float(), atol=1e-2), k
