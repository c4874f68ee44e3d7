"""Nested residual networks: NeFL's depth (step sizes) and width scaling, and the
compact sub-networks that every width-scaled method trains.

Pieces:

- :class:`ResNetLayout`: a CIFAR-style ResNet (3x3 stem, stages of basic blocks,
  the first block of every later stage halves the resolution through a 1x1
  shortcut conv). ``resnet20`` is the SLT paper's network; ``digits`` is a tiny
  one for 8x8 inputs so tests run in milliseconds.
- :class:`CompactResNet`: a plain network at given per-conv widths with a subset
  of the blocks, an optional step size per block (NeFL-D: Y_{j+1} = shortcut(Y_j)
  + s_j F_j(Y_j)) and an optional frozen prefix (SLT: run without autograd, so no
  activations are stored). Its state maps onto the server's tensors by a
  :data:`~training.methods.slicing.Selection`.
- :class:`SubModelSpec` and the initialisations: a width ratio gamma_W (a parameter
  ratio; channels keep sqrt(gamma_W)) and a step-size vector (0 = block skipped);
  ``D`` starts every kept block at 1, ``D0`` gives a kept block 1 + the number
  of skipped blocks after it in its stage (NeFL Table 12), and ``learn_steps=False``
  keeps the initial values fixed (NeFL's N/L).
- :class:`NestedNet`: the server model. Shared convolutions and classifier at full
  width; BatchNorm either shared (sliced per sub-model: HeteroFL, FedRolex, FD,
  SLT, small model) or one set per sub-model (NeFL, FjORD); step sizes one row per
  sub-model. Its "exits" are the sub-models, so ``forward(x, upto=e)`` returns the
  logits of sub-models 1..e and the CIS machinery (evaluation, policy, export)
  treats a nested model like an early-exit one. Each stage re-runs its sub-model
  on the raw input, which is its carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cis.errors import CisError
from cis.stages import INPUT, carry_name
from training.methods.registry import NEFL_STEP_INITS
from training.methods.slicing import Selection, gather, kept_channels, prefix, width_ratio
from training.models import EarlyExitNet
from training.stage_plan import ExportStage, StagePlan


@dataclass(frozen=True)
class ResNetLayout:
    """Stages of basic blocks; ``channels[l]`` and ``blocks[l]`` per stage."""

    channels: tuple[int, ...] = (16, 32, 64)
    blocks: tuple[int, ...] = (3, 3, 3)
    in_channels: int = 3
    input_size: int = 32
    num_classes: int = 10

    @property
    def num_blocks(self) -> int:
        return sum(self.blocks)

    def block_stage(self) -> list[int]:
        """Stage index of every block."""
        return [l for l, n in enumerate(self.blocks) for _ in range(n)]

    def downsamples(self) -> list[bool]:
        """True for blocks that change shape (first block of stages >= 2): never skippable."""
        return [l > 0 and (b == 0) for l, n in enumerate(self.blocks) for b in range(n)]

    @property
    def num_convs(self) -> int:
        """Conv layers in SLT's sense: the stem plus two per block (a shortcut conv
        belongs to its block's second conv, which has the same output)."""
        return 1 + 2 * self.num_blocks

    def conv_channels(self) -> list[int]:
        """Full output channels M_k of conv layers k = 0..K-1 (stem, then conv1/conv2 of each block)."""
        out = [self.channels[0]]
        for l in self.block_stage():
            out += [self.channels[l], self.channels[l]]
        return out

    def conv_inputs(self) -> list[int]:
        """Full input channels P_k of every conv layer."""
        outs = self.conv_channels()
        return [self.in_channels] + outs[:-1]

    def conv_resolution(self) -> list[int]:
        """Spatial side of every conv layer's output."""
        size, out = self.input_size, [self.input_size]
        for b, down in enumerate(self.downsamples()):
            if down:
                size = (size + 1) // 2
            out += [size, size]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "channels": list(self.channels),
            "blocks": list(self.blocks),
            "in_channels": self.in_channels,
            "input_size": self.input_size,
            "num_classes": self.num_classes,
        }


LAYOUTS: dict[str, ResNetLayout] = {
    "resnet20": ResNetLayout((16, 32, 64), (3, 3, 3)),
    "resnet56": ResNetLayout((16, 32, 64), (9, 9, 9)),
    "digits": ResNetLayout((8, 16, 32), (1, 1, 1), in_channels=1, input_size=8),
}


def uniform_widths(layout: ResNetLayout, ratio: float) -> list[int]:
    """Per-conv widths when every layer keeps ``ratio`` of its channels."""
    return [kept_channels(m, ratio) for m in layout.conv_channels()]


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN, scaled by an optional step size, plus the shortcut; ReLU after the sum."""

    def __init__(self, c_in: int, c_mid: int, c_out: int, stride: int, conv_shortcut: bool, step: float | None, learn_step: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_mid, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_mid)
        self.conv2 = nn.Conv2d(c_mid, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.sc: nn.Module | None = None
        if conv_shortcut:
            self.sc = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
        elif c_out > c_in:
            raise CisError(f"block without shortcut conv: output width {c_out} exceeds input width {c_in}")
        self.c_out = c_out
        self.step: Tensor | None
        if step is None:
            self.step = None
        elif learn_step:
            self.step = nn.Parameter(torch.tensor(float(step)))
        else:
            self.register_buffer("step", torch.tensor(float(step)))
        self.frozen1 = self.frozen2 = False

    def forward(self, x: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen1):
            h = F.relu(self.bn1(self.conv1(x)))
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen2):
            f = self.bn2(self.conv2(h))
            if self.step is not None:
                f = self.step * f
            short = self.sc(x) if self.sc is not None else x[:, : self.c_out]
            return F.relu(short + f)


class CompactResNet(nn.Module):
    """A stand-alone (sub-)network: ``widths`` per conv layer, ``kept`` block indices of the layout.

    ``steps``: one initial step size per kept block, or None for plain residual blocks.
    ``frozen``: conv layers 0..frozen-1 run without autograd and keep their BatchNorm
    in eval mode (SLT's frozen part: parameters only loaded, no activations stored).
    """

    def __init__(
        self,
        layout: ResNetLayout,
        widths: Sequence[int],
        kept: Sequence[int] | None = None,
        steps: Sequence[float] | None = None,
        learn_steps: bool = True,
        frozen: int = 0,
    ) -> None:
        super().__init__()
        widths = [int(w) for w in widths]
        if len(widths) != layout.num_convs:
            raise CisError(f"compact network: {len(widths)} widths for {layout.num_convs} conv layers")
        kept = list(range(layout.num_blocks)) if kept is None else [int(b) for b in kept]
        down = layout.downsamples()
        missing = [b for b, d in enumerate(down) if d and b not in kept]
        if missing:
            raise CisError(f"sub-model skips block(s) {missing}, which change the resolution; they must be kept")
        if steps is not None and len(steps) != len(kept):
            raise CisError(f"compact network: {len(steps)} step sizes for {len(kept)} kept blocks")
        self.layout, self.widths, self.kept, self.frozen = layout, widths, kept, int(frozen)
        self.stem = nn.Conv2d(layout.in_channels, widths[0], 3, 1, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(widths[0])
        blocks = []
        c_in = widths[0]
        for j, b in enumerate(kept):
            c_mid, c_out = widths[1 + 2 * b], widths[2 + 2 * b]
            block = BasicBlock(c_in, c_mid, c_out, 2 if down[b] else 1, down[b], None if steps is None else steps[j], learn_steps)
            block.frozen1 = 1 + 2 * b < self.frozen
            block.frozen2 = 2 + 2 * b < self.frozen
            blocks.append(block)
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c_in, layout.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.frozen < 1):
            h = F.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            h = block(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))

    def train(self, mode: bool = True) -> "CompactResNet":
        super().train(mode)
        if self.frozen >= 1:
            self.stem_bn.eval()
        for block in self.blocks:
            if block.frozen1:
                block.bn1.eval()
            if block.frozen2:
                block.bn2.eval()
                if block.sc is not None:
                    block.sc[1].eval()
        return self

    def trainable_keys(self) -> set[str]:
        """State keys of the layers that are trained (everything outside the frozen prefix)."""
        frozen = set()
        if self.frozen >= 1:
            frozen |= {"stem.", "stem_bn."}
        for j, block in enumerate(self.blocks):
            if block.frozen1:
                frozen |= {f"blocks.{j}.conv1.", f"blocks.{j}.bn1."}
            if block.frozen2:
                frozen |= {f"blocks.{j}.conv2.", f"blocks.{j}.bn2.", f"blocks.{j}.sc."}
        return {k for k in self.state_dict() if not any(k.startswith(p) for p in frozen)}

    def freeze_(self) -> None:
        """requires_grad=False on the frozen prefix's parameters (so an optimizer skips them)."""
        keep = self.trainable_keys()
        for name, p in self.named_parameters():
            p.requires_grad_(name in keep)


# ---------------------------------------------------------------- sub-model specs


@dataclass(frozen=True)
class SubModelSpec:
    """A NeFL sub-model: ``width`` = gamma_W (parameter ratio), ``steps`` = one initial
    step size per block of the layout (0 = the block is skipped)."""

    width: float
    steps: tuple[float, ...]

    @property
    def channel_ratio(self) -> float:
        return width_ratio(self.width)

    def kept(self) -> list[int]:
        return [b for b, s in enumerate(self.steps) if s != 0]

    def to_json(self) -> dict[str, Any]:
        return {"width": self.width, "steps": list(self.steps)}


def depth_mask(layout: ResNetLayout, depth: float) -> list[int]:
    """Blocks kept for a depth ratio gamma_D: in every stage the first max(1, round(gamma_D n)) blocks
    (a simple rule of our own; NeFL's tables are hand-picked per network)."""
    mask = []
    for n in layout.blocks:
        keep = max(1, round(depth * n))
        mask += [1 if b < keep else 0 for b in range(n)]
    return mask


def init_steps(layout: ResNetLayout, mask: Sequence[int], init: str = "D") -> tuple[float, ...]:
    """Initial step sizes for a 0/1 block mask. ``D``: 1 per kept block. ``D0``: a kept block also
    takes the steps of the skipped blocks after it in its stage (ResNet56, gamma 0.2: 1, 8, 0, ..., 0)."""
    if init not in NEFL_STEP_INITS:
        raise CisError(f"step-size init {init!r}: expected one of {NEFL_STEP_INITS}")
    steps = [float(m) for m in mask]
    if init == "D0":
        stage = layout.block_stage()
        last = None
        for b, m in enumerate(mask):
            if b > 0 and stage[b] != stage[b - 1]:
                last = None
            if m:
                last = b
            elif last is not None:
                steps[last] += 1.0
    return tuple(steps)


def nefl_specs(layout: ResNetLayout, gammas: Sequence[float], mode: str = "W", init: str = "D") -> list[SubModelSpec]:
    """Sub-models of total parameter ratio gamma each: ``W`` (width only), ``D`` (depth only),
    ``WD`` (gamma_W = gamma_D = sqrt(gamma), NeFL's default split)."""
    specs = []
    for g in gammas:
        if mode == "W":
            gw, gd = g, 1.0
        elif mode == "D":
            gw, gd = 1.0, g
        elif mode == "WD":
            gw = gd = g**0.5
        else:
            raise CisError(f"NeFL scaling {mode!r}: expected 'W', 'D' or 'WD'")
        specs.append(SubModelSpec(gw, init_steps(layout, depth_mask(layout, gd), init)))
    return specs


def depthfl_specs(layout: ResNetLayout, gammas: Sequence[float]) -> list[SubModelSpec]:
    """DepthFL as NeFL implements it (Appendix B.3): a contiguous prefix of the blocks, keeping
    only the later stages' downsampling blocks so the classifier still fits; fixed unit steps."""
    down = layout.downsamples()
    specs = []
    for g in gammas:
        keep = max(1, round(g * layout.num_blocks))
        specs.append(SubModelSpec(1.0, tuple(1.0 if b < keep or down[b] else 0.0 for b in range(layout.num_blocks))))
    return specs


# ---------------------------------------------------------------- the server model


def _bn_names(layout: ResNetLayout, kept: Sequence[int]) -> list[tuple[str, int]]:
    """(compact BN module name, conv layer index whose output it normalises) for a compact network."""
    down = layout.downsamples()
    names = [("stem_bn", 0)]
    for j, b in enumerate(kept):
        names += [(f"blocks.{j}.bn1", 1 + 2 * b), (f"blocks.{j}.bn2", 2 + 2 * b)]
        if down[b]:
            names.append((f"blocks.{j}.sc.1", 2 + 2 * b))
    return names


def _flat(name: str) -> str:
    return name.replace(".", "_")


class BatchNormSet(nn.Module):
    """One sub-model's own BatchNorm layers (NeFL's inconsistent parameters)."""

    def __init__(self, layout: ResNetLayout, widths: Sequence[int], kept: Sequence[int]) -> None:
        super().__init__()
        self.bns = nn.ModuleDict({_flat(n): nn.BatchNorm2d(widths[k]) for n, k in _bn_names(layout, kept)})


def compact_selection(
    layout: ResNetLayout,
    out_index: Sequence[Tensor],
    kept: Sequence[int] | None = None,
    bn_prefix: dict[str, str] | None = None,
    step_row: int | None = None,
) -> Selection:
    """Where every tensor of a compact network sits in the server model.

    ``out_index[k]``: the server channels conv layer k keeps (its input channels are the
    previous layer's). ``bn_prefix``: compact BN name -> server key prefix of that
    sub-model's own BatchNorm (decoupled, taken whole); by default BN is shared and sliced.
    ``step_row``: row of the server's ``steps`` tensor this sub-model uses.
    """
    kept = list(range(layout.num_blocks)) if kept is None else list(kept)
    down = layout.downsamples()
    sel: Selection = {}

    def conv(ck: str, gk: str, o: Tensor, i: Tensor | None) -> None:
        sel[ck] = (gk, (o, i))

    def bn(ck: str, gk: str, o: Tensor) -> None:
        own = (bn_prefix or {}).get(ck)
        for leaf in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            if own is not None:
                sel[f"{ck}.{leaf}"] = (f"{own}.{leaf}", ())
            else:
                sel[f"{ck}.{leaf}"] = (f"{gk}.{leaf}", () if leaf == "num_batches_tracked" else (o,))

    conv("stem.weight", "shared.stem.weight", out_index[0], None)
    bn("stem_bn", "shared.stem_bn", out_index[0])
    prev = out_index[0]
    for j, b in enumerate(kept):
        o1, o2 = out_index[1 + 2 * b], out_index[2 + 2 * b]
        conv(f"blocks.{j}.conv1.weight", f"shared.blocks.{b}.conv1.weight", o1, prev)
        bn(f"blocks.{j}.bn1", f"shared.blocks.{b}.bn1", o1)
        conv(f"blocks.{j}.conv2.weight", f"shared.blocks.{b}.conv2.weight", o2, o1)
        bn(f"blocks.{j}.bn2", f"shared.blocks.{b}.bn2", o2)
        if down[b]:
            conv(f"blocks.{j}.sc.0.weight", f"shared.blocks.{b}.sc.0.weight", o2, prev)
            bn(f"blocks.{j}.sc.1", f"shared.blocks.{b}.sc.1", o2)
        elif not torch.equal(prev[: len(o2)], o2):
            raise CisError(f"selection: block {b}'s identity shortcut needs its output channels to lead its input channels")
        if step_row is not None:
            sel[f"blocks.{j}.step"] = ("steps", (step_row, b))
        prev = o2
    sel["fc.weight"] = ("shared.fc.weight", (None, prev))
    sel["fc.bias"] = ("shared.fc.bias", ())
    return sel


def raw_input_name(k: int) -> str:
    """Name of the raw input as stage k's carry (k = 0: the request itself): ``input``, ``input_k``."""
    return INPUT if k == 0 else carry_name(INPUT, k)


def prefix_selection(layout: ResNetLayout, widths: Sequence[int], kept: Sequence[int] | None = None) -> Selection:
    """Ordered slices: conv layer k keeps its first ``widths[k]`` channels; BatchNorm shared."""
    return compact_selection(layout, [prefix(w) for w in widths], kept)


class SubModelStage(nn.Module):
    """A served tier: ``stage(x) -> (logits, x)``; the carry is the raw input, which the
    parent re-runs through its own larger sub-model. The last stage returns logits only."""

    def __init__(self, net: nn.Module, last: bool) -> None:
        super().__init__()
        self.net, self.last = net, last

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        logits = self.net(x)
        return (logits,) if self.last else (logits, x)


class NestedNet(EarlyExitNet):
    """The server model of a nested method; sub-model k (1-based) is "exit" k."""

    arch = "nested-resnet"

    def __init__(
        self,
        layout: ResNetLayout,
        specs: Sequence[SubModelSpec],
        decoupled_bn: bool = True,
        use_steps: bool = True,
        learn_steps: bool = True,
    ) -> None:
        specs = list(specs)
        if not specs:
            raise CisError("nested model: expected at least one sub-model spec")
        for k, s in enumerate(specs, start=1):
            if len(s.steps) != layout.num_blocks:
                raise CisError(f"nested model: sub-model {k} has {len(s.steps)} step sizes, the layout {layout.num_blocks} blocks")
        config = {
            "arch": self.arch,
            "layout": layout.to_json(),
            "specs": [s.to_json() for s in specs],
            "decoupled_bn": bool(decoupled_bn),
            "use_steps": bool(use_steps),
            "learn_steps": bool(learn_steps),
            "exits": list(range(1, len(specs) + 1)),
            "input_size": layout.input_size,
            "in_channels": layout.in_channels,
            "num_classes": layout.num_classes,
        }
        super().__init__([], config)
        self.layout, self.specs = layout, specs
        self.decoupled_bn, self.use_steps, self.learn_steps = decoupled_bn, use_steps, learn_steps
        self.shared = CompactResNet(layout, layout.conv_channels())
        if decoupled_bn:
            self.sub_bns = nn.ModuleList(BatchNormSet(layout, self.widths(k), s.kept()) for k, s in enumerate(specs, start=1))
        if use_steps:
            steps = torch.tensor([list(s.steps) for s in specs], dtype=torch.float32)
            if learn_steps:
                self.steps = nn.Parameter(steps)
            else:
                self.register_buffer("steps", steps)
        self._compact: dict[int, CompactResNet] = {}

    @property
    def num_exits(self) -> int:
        return len(self.specs)

    def widths(self, k: int) -> list[int]:
        return uniform_widths(self.layout, self.specs[k - 1].channel_ratio)

    def selection(self, k: int) -> Selection:
        """Sub-model k's tensors in this model's state dict (ordered width slices)."""
        spec = self.specs[k - 1]
        kept = spec.kept()
        own = None
        if self.decoupled_bn:
            own = {n: f"sub_bns.{k - 1}.bns.{_flat(n)}" for n, _ in _bn_names(self.layout, kept)}
        return compact_selection(
            self.layout, [prefix(w) for w in self.widths(k)], kept, own, k - 1 if self.use_steps else None
        )

    def compact(self, k: int, frozen: int = 0) -> CompactResNet:
        """A fresh stand-alone network shaped like sub-model k (untrained weights)."""
        spec = self.specs[k - 1]
        kept = spec.kept()
        steps = [spec.steps[b] for b in kept] if self.use_steps else None
        return CompactResNet(self.layout, self.widths(k), kept, steps, self.learn_steps, frozen)

    def submodel(self, k: int) -> CompactResNet:
        """Sub-model k with the current weights (a copy; cached shape, reloaded every call)."""
        self._check_exit(k, "sub-model")
        net = self._compact.get(k)
        if net is None:
            net = self._compact[k] = self.compact(k)
        net.load_state_dict(gather(self.state_dict(), self.selection(k)))
        return net.train(self.training)

    def forward(self, x: Tensor, upto: int | None = None) -> list[Tensor]:
        """Logits of sub-models 1..upto, each run on the input (no gradient reaches this model)."""
        upto = self.num_exits if upto is None else self._check_exit(upto, "upto")
        with torch.no_grad():
            return [self.submodel(k)(x) for k in range(1, upto + 1)]

    def exit_params(self, e: int) -> list[nn.Parameter]:
        """Every parameter tensor sub-model e takes a slice of."""
        self._check_exit(e, "exit")
        params = dict(self.named_parameters())
        return [params[g] for g, _ in self.selection(e).values() if g in params]

    def config(self) -> dict[str, Any]:
        return {**self._config, "layout": dict(self._config["layout"]), "specs": [dict(s) for s in self._config["specs"]]}

    def serving_module(self, k: int) -> CompactResNet:
        """Sub-model k for inference, step sizes folded into the BatchNorm before them (eval mode)."""
        self._check_exit(k, "sub-model")
        net = self.compact(k)
        net.load_state_dict(gather(self.state_dict(), self.selection(k)))
        return fold_steps(net.eval())

    def stages(self) -> list[SubModelStage]:
        """One stand-alone stage per sub-model: ``stage(x) -> (logits, x)`` (copies of the weights)."""
        n = self.num_exits
        return [SubModelStage(self.serving_module(k), k == n).eval() for k in range(1, n + 1)]

    def export_stages(self) -> StagePlan:
        """The exporter's plan: stage k reads the raw input and forwards it unchanged, named
        ``input`` for stage 1 and ``input_k`` as stage k's carry (the plan wants distinct names)."""
        stages = self.stages()
        n = len(stages)
        plan = [
            ExportStage(k, k, st, inputs=(raw_input_name(k - 1),), carry=() if k == n else (raw_input_name(k),))
            for k, st in enumerate(stages, start=1)
        ]
        model = self
        return StagePlan(plan, {INPUT: tuple(self.input_shape)}, lambda feeds: model(feeds[INPUT]))


@torch.no_grad()
def fold_steps(net: CompactResNet) -> CompactResNet:
    """Fold every block's step size into its second BatchNorm (s * BN(z) = BN'(z) with gamma' = s gamma,
    beta' = s beta) and drop the step. Eval-mode equivalent only."""
    for block in net.blocks:
        if block.step is not None:
            s = float(block.step)
            block.bn2.weight.mul_(s)
            block.bn2.bias.mul_(s)
            if isinstance(block.step, nn.Parameter):
                del block.step
            else:
                del block._buffers["step"]
            block.step = None
    return net


def build_nested(config: dict[str, Any]) -> NestedNet:
    """Rebuild a :class:`NestedNet` from its ``config()``."""
    try:
        layout = ResNetLayout(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["layout"].items()})
        specs = [SubModelSpec(float(s["width"]), tuple(float(x) for x in s["steps"])) for s in config["specs"]]
        return NestedNet(layout, specs, bool(config["decoupled_bn"]), bool(config["use_steps"]), bool(config["learn_steps"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CisError(f"nested model config: {type(exc).__name__}: {exc}; expected the dict NestedNet.config() writes") from None
