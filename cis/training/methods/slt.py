"""Successive Layer Training (Pfeiffer et al., NeurIPS 2023).

Layers k = 1..K are the conv layers of a :class:`~cis.training.methods.resnet.ResNetLayout`
(the stem, then conv1 and conv2 of every block; a block's 1x1 shortcut conv goes with
its conv2, whose output it shares), followed by the classifier, which is always
part of the head. A configuration S = (K_F, K_T, s): layers 1..K_F frozen (full
width, run without autograd, not uploaded), layers K_F+1..K_T trained at full width,
the head K_T+1..K scaled by s (its first layer keeps its full input).

- :func:`memory_bytes`: analytic training memory of a configuration (weights, stored
  activations, gradients); :func:`measured_memory_bytes` measures the same with hooks.
- :func:`plan`: step n = 1..N freezes n-1 layers, trains layer n, head width s_n the
  largest that fits the budget (memory of the whole network at width s, the
  FD/FedRolex constraint), then the suffix minimum so s_n never decreases; N is the
  first step whose head fits at s = 1.
- :func:`schedule`: rounds per step from Eq. 5 and 6.
- :func:`slt_selection`: what a device loads and what it uploads in a configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.training.methods.nested import prefix_selection
from cis.training.methods.resnet import CompactResNet, ResNetLayout
from cis.training.methods.slicing import kept_channels
from cis.training.selection import Selection

BYTES = 4  # float32
# Stored activations per conv layer, in units of its output map: the conv output (BatchNorm's
# input), the BatchNorm output (ReLU's input) and the ReLU output (the next conv's input).
ACTIVATIONS_PER_LAYER = 3


@dataclass(frozen=True)
class Config:
    """S = (K_F, K_T, s); layers are 1-based as in the paper."""

    frozen: int
    trained: int
    s: float


def layer_widths(layout: ResNetLayout, cfg: Config) -> list[int]:
    """Output channels of every conv layer under a configuration."""
    return [m if k <= cfg.trained else kept_channels(m, cfg.s) for k, m in enumerate(layout.conv_channels(), start=1)]


def _conv_params(layout: ResNetLayout, widths: Sequence[int]) -> list[int]:
    """Parameters of every conv layer (3x3 kernel, BatchNorm, and the shortcut conv with its conv2)."""
    down = [False] + [d for d in layout.downsamples() for d in (False, d)]
    ins = [layout.in_channels] + list(widths[:-1])
    out = []
    for k, (p, m) in enumerate(zip(ins, widths)):
        n = 9 * p * m + 2 * m
        if down[k]:  # 1x1 shortcut from the block's input (the output of layer k-2)
            n += widths[k - 2] * m + 2 * m
        out.append(n)
    return out


def memory_bytes(layout: ResNetLayout, cfg: Config, batch: int = 32) -> int:
    """Training memory of a configuration: weights of every loaded layer, gradients of the
    trained ones, ``ACTIVATIONS_PER_LAYER`` output maps per trained layer and the input of
    the first trained layer; frozen layers store no activations (they run without autograd)."""
    widths = layer_widths(layout, cfg)
    res = layout.conv_resolution()
    params = _conv_params(layout, widths)
    fc = widths[-1] * layout.num_classes + layout.num_classes
    weights = sum(params) + fc
    grads = sum(params[cfg.frozen :]) + fc
    acts = sum(ACTIVATIONS_PER_LAYER * widths[k] * res[k] ** 2 for k in range(cfg.frozen, len(widths)))
    # the first trained conv also keeps its input (the image, or the frozen part's output)
    acts += (
        layout.in_channels * layout.input_size**2
        if cfg.frozen == 0
        else widths[cfg.frozen - 1] * res[cfg.frozen - 1] ** 2
    )
    return BYTES * (weights + grads + batch * acts)


def budget_bytes(layout: ResNetLayout, s: float, batch: int = 32) -> int:
    """The FD/FedRolex constraint: the whole network trained end to end at width s."""
    return memory_bytes(layout, Config(0, 0, s), batch)


def _largest_s(layout: ResNetLayout, frozen: int, trained: int, budget: int, batch: int) -> float | None:
    """Largest head width (a multiple of 1/max channels) whose configuration fits, or None."""
    steps = max(layout.channels)
    best = None
    for j in range(1, steps + 1):
        s = j / steps
        if memory_bytes(layout, Config(frozen, trained, s), batch) <= budget:
            best = s
    return best


def suffix_minimum(values: Sequence[float]) -> list[float]:
    """v_n <- min(v_n, v_{n+1}, ...): the planner's non-decreasing head widths (Eq. 2)."""
    out = list(values)
    for n in range(len(out) - 2, -1, -1):
        out[n] = min(out[n], out[n + 1])
    return out


def plan(layout: ResNetLayout, s: float, batch: int = 32) -> list[Config]:
    """Configurations S_1..S_N for the constraint of width s (Eq. 2 and 4)."""
    budget = budget_bytes(layout, s, batch)
    K = layout.num_convs
    widths: list[float] = []
    for n in range(1, K + 1):
        best = _largest_s(layout, n - 1, n, budget, batch)
        if best is None:
            raise CisError(f"SLT at s={s}: step {n} does not fit the budget even with the smallest head")
        widths.append(best)
        if best >= 1.0:
            break
    return [Config(n - 1, n, w) for n, w in enumerate(suffix_minimum(widths), start=1)]


def min_frozen(layout: ResNetLayout, cfg: Config, budget: int, batch: int = 32) -> int:
    """Eq. 7: a less constrained device keeps K_T and s_n but freezes as few layers as its budget allows."""
    for kf in range(0, cfg.frozen + 1):
        if memory_bytes(layout, Config(kf, cfg.trained, cfg.s), batch) <= budget:
            return kf
    return cfg.frozen


def trained_params(layout: ResNetLayout, frozen: int, trained: int, s: float) -> int:
    """Q(K_F, K_T, s) of Eq. 5 (kernel sizes included): full layers K_F+1..K_T, the head's first
    layer with full input and s-scaled output, the rest s-scaled on both sides."""
    P, M = layout.conv_inputs(), layout.conv_channels()
    q = 0
    for k in range(1, len(M) + 1):
        p, m = P[k - 1], M[k - 1]
        if frozen < k <= trained:
            q += p * m
        elif k == trained + 1:
            q += p * kept_channels(m, s)
        elif k > trained + 1:
            q += kept_channels(p, s) * kept_channels(m, s)
    return 9 * q


def schedule(layout: ResNetLayout, configs: Sequence[Config], s: float, rounds: int) -> list[int]:
    """Rounds for pretraining (the whole network at width s) and steps 1..N (Eq. 5 and 6).

    Switching points r_pre = R Q(0,0,s)/Q(0,0,1) and r_n = R Q(n-1,n,s_n)/Q(0,0,1), rounded;
    the last step takes every remaining round. Eq. 6 can give a later step fewer trained
    parameters than the one before (freezing removes a full layer); the switching points
    are then kept non-decreasing, i.e. such a step gets 0 rounds. Sums to R.
    """
    total = trained_params(layout, 0, 0, 1.0)
    points = [trained_params(layout, 0, 0, s)] + [
        trained_params(layout, c.frozen, c.trained, c.s) for c in configs[:-1]
    ]
    out, prev = [], 0
    for q in points:
        r = min(rounds, max(prev, round(rounds * q / total)))
        out.append(r - prev)
        prev = r
    out.append(rounds - prev)
    return out


def step_at(round: int, rounds_per_step: Sequence[int]) -> int:
    """The step (0 = pretraining) that round t = 1..R trains."""
    acc = 0
    for n, r in enumerate(rounds_per_step):
        acc += r
        if round <= acc:
            return n
    return len(rounds_per_step) - 1


def slt_compact(layout: ResNetLayout, cfg: Config) -> CompactResNet:
    """The device network of a configuration (frozen prefix without autograd)."""
    net = CompactResNet(layout, layer_widths(layout, cfg), frozen=cfg.frozen)
    net.freeze_()
    return net


def slt_selection(layout: ResNetLayout, cfg: Config) -> tuple[Selection, Selection]:
    """(what the device loads, what it uploads): the upload leaves out the frozen layers."""
    load = prefix_selection(layout, layer_widths(layout, cfg))
    keep = slt_compact(layout, cfg).trainable_keys()
    return load, {k: v for k, v in load.items() if k in keep}


def measured_memory_bytes(net: nn.Module, x: Tensor) -> int:
    """Weights + gradients + activations kept for backward, measured on one training step.

    Stored activations are counted by autograd's saved-tensor hooks (every tensor the
    backward pass keeps, deduplicated by storage), gradients by summing ``.grad`` of
    the trained parameters, weights from the state dict (SLT Appendix E counts the
    same three with module hooks).
    """
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        if t.requires_grad or t.grad_fn is not None or t.is_floating_point():
            ptr = t.untyped_storage().data_ptr()
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    params = {p.data_ptr() for p in net.parameters()}
    net.train()
    net.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = net(x).float().logsumexp(1).mean()
    acts = sum(n for ptr, n in seen.items() if ptr not in params)
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in net.parameters() if p.grad is not None)
    weights = sum(t.numel() * t.element_size() for t in net.state_dict().values())
    return int(weights + grads + acts)
