"""Where training runs (``--device auto|cpu|cuda``) and its optional bf16 autocast (``--amp bf16``).

The device is a place, not a different computation: the model, the working state
and the nodes' data live on it, while every random draw (batch order, exit
sampling, augmentation) still comes from the engine's CPU generators. So
``--device cpu`` is exactly the computation of before, and a CUDA run draws
the same batches as a CPU run with the same seed (its floats differ in the last
bits, as GPU kernels sum in another order).

``--amp bf16`` runs each local step's forward and loss under ``torch.autocast``
with bfloat16 (weights, optimizer state and aggregation stay float32). It works
on the CPU too (slowly), which is how it is tested without a GPU.

``memory_format`` channels_last and ``cuda_graphs`` on (:func:`apply_compute_options`) are the
other two speed settings of a GPU run (bench/train_device_speed.py measures them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cis.core.errors import CisError
from cis.training.config import AMP_MODES, DEVICES, is_device_name
from cis.training.graphs import GraphedExitLoss


def resolve_device(name: str) -> torch.device:
    """``auto``: cuda when torch sees a GPU, else cpu; ``cuda`` (or ``cuda:K``) refuses in one line without one."""
    if not is_device_name(name):
        raise CisError(f"device {name!r}: expected one of {', '.join(DEVICES)} or cuda:K")
    kind, _, index = str(name).partition(":")
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + (
                " built without CUDA" if torch.version.cuda is None else f", CUDA {torch.version.cuda}"
            )
            raise CisError(f"--device {name}: no CUDA GPU is visible to torch ({build}); use --device cpu or auto")
        if index and int(index) >= torch.cuda.device_count():
            raise CisError(
                f"--device {name}: torch sees {torch.cuda.device_count()} GPU(s), "
                f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(name)


def describe(device: torch.device) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``, for logs and summary.json."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return device.type


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (cpu for one with neither)."""
    for t in module.parameters():
        return t.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")


class AutocastTrainer:
    """A local trainer whose ``train`` runs under bf16 autocast; everything else is the wrapped trainer's."""

    def __init__(self, trainer: Any, device: torch.device) -> None:
        self.inner, self.device_type = trainer, device.type

    def train(self, *args: Any, **kwargs: Any) -> dict:
        # One autocast region spans every step of the call, so its cache of bf16 weight copies must be
        # off: with it, each step's forward would reuse the weights as cast before the first step.
        with torch.autocast(self.device_type, dtype=torch.bfloat16, cache_enabled=False):
            return self.inner.train(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # setup, state_dict, load_state_dict, the trainer's own fields
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:  # e.g. a benchmark setting the trainer's fixed exits
        if name in ("inner", "device_type"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


def with_amp(trainer: Any, amp: str, device: torch.device) -> Any:
    """``trainer`` itself for ``amp="off"``, else wrapped in :class:`AutocastTrainer`."""
    if amp not in AMP_MODES:
        raise CisError(f"amp {amp!r}: expected one of {', '.join(AMP_MODES)}")
    return AutocastTrainer(trainer, device) if amp == "bf16" else trainer


def run_device(config: Any, log: Callable[[str], None] = lambda s: None) -> torch.device:
    """The device a run trains on: ``config.device`` resolved; the nested methods stay on the CPU.
    Also refuses ``--amp bf16`` for FLAME.

    The nested methods (NeFL, SLT, HeteroFL ...) slice sub-models out of the global
    state with index and weight tensors made on the CPU (cis/training/methods/slicing.py,
    nested.py), so they train on the CPU: ``auto`` picks it for them, ``cuda`` refuses.
    """
    from cis.training.methods.registry import NESTED_METHODS

    if config.amp == "bf16" and config.method == "flame":  # its patience forward reads bf16 logits into numpy
        raise CisError(
            "--amp bf16: method 'flame' reads each batch's exit logits into numpy, which has no bfloat16; use --amp off"
        )
    device = resolve_device(config.device)
    if config.cuda_graphs == "on" and device.type != "cuda":
        raise CisError(f"--cuda-graphs on: CUDA graphs need a CUDA device, and this run's is {device.type}; use off")
    if device.type != "cpu" and config.method in NESTED_METHODS:
        if config.device != "auto":
            raise CisError(
                f"--device {config.device}: method {config.method!r} trains on the CPU only (its sub-model "
                "slicing is not device-aware yet); use --device cpu or auto"
            )
        log(f"device: cpu (method {config.method!r} trains on the CPU only)")
        return torch.device("cpu")
    return device


def apply_compute_options(model: torch.nn.Module, trainer: Any, config: Any) -> None:
    """``memory_format`` channels_last: the model's 4-D tensors (conv weights) go NHWC, in place, so the
    convolutions run in that layout (their inputs follow); ``cuda_graphs`` on: the trainer's step loss goes
    through :class:`cis.training.graphs.GraphedExitLoss`. Both change how a run computes, not what."""
    if config.memory_format == "channels_last":
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if config.cuda_graphs == "on":
        trainer.exit_loss = GraphedExitLoss()
