"""Nested residual networks: NeFL's depth (step sizes) and width scaling, and the server model
of every width-scaled method.

Pieces (the compact networks themselves, :class:`~cis.training.methods.resnet.ResNetLayout` and
:class:`~cis.training.methods.resnet.CompactResNet`, are in :mod:`cis.training.methods.resnet`):

- :class:`SubModelSpec` and the initialisations: a width ratio gamma_W (a parameter
  ratio; channels keep sqrt(gamma_W)) and a step-size vector (0 = block skipped);
  ``D`` starts every kept block at 1, ``D0`` gives a kept block 1 + the number
  of skipped blocks after it in its stage (NeFL Table 12), and ``learn_steps=False``
  keeps the initial values fixed (NeFL's N/L).
- :class:`NestedNet`: the server model. Shared convolutions and classifier at full
  width; BatchNorm either shared (sliced per sub-model: HeteroFL, FedRolex, FD,
  SLT, small model) or one set per sub-model (NeFL, FjORD); step sizes one row per
  sub-model. With ``static_bn`` (HeteroFL's static BatchNorm,
  :mod:`cis.training.methods.static_bn`) the shared BatchNorm keeps no running
  statistics: each sub-model has its own (``sub_stats``, computed after training),
  stored like NeFL's per-sub-model sets, so evaluation and export pick them up through
  :meth:`NestedNet.selection` as they pick up NeFL's. Its "exits" are the sub-models,
  so ``forward(x, upto=e)`` returns the logits of sub-models 1..e and the CIS
  machinery (evaluation, policy, export) treats a nested model like an early-exit one.
  Each stage re-runs its sub-model on the raw input, which is its carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.core.stages.contract import INPUT, carry_name
from cis.training.methods.registry import NEFL_STEP_INITS
from cis.training.methods.resnet import CompactResNet, ResNetLayout, fold_steps, uniform_widths
from cis.training.methods.slicing import prefix, width_ratio
from cis.training.models.contract import EarlyExitNet
from cis.training.models.stage_plan import ExportStage, StagePlan
from cis.training.selection import Selection, gather

ModuleT = TypeVar("ModuleT", bound=nn.Module)

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


BN_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
"""A BatchNorm's running statistics (buffers), as opposed to its affine parameters."""
STATISTICS_MODULE = "sub_stats"
"""Where a static-BN :class:`NestedNet` keeps each sub-model's own running statistics."""


class BatchNormSet(nn.Module):
    """One sub-model's own BatchNorm layers (NeFL's inconsistent parameters); ``affine=False``: its
    running statistics only (static BN: the affine parameters stay shared)."""

    def __init__(self, layout: ResNetLayout, widths: Sequence[int], kept: Sequence[int], affine: bool = True) -> None:
        super().__init__()
        self.bns = nn.ModuleDict(
            {_flat(n): nn.BatchNorm2d(widths[k], affine=affine) for n, k in _bn_names(layout, kept)}
        )


def batch_statistics_only_(net: ModuleT) -> ModuleT:
    """Drop every BatchNorm's running statistics: it normalises with each batch's own, in training and
    evaluation alike, and its state holds only the affine parameters (static BN while training)."""
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None
    return net


def compact_selection(
    layout: ResNetLayout,
    out_index: Sequence[Tensor],
    kept: Sequence[int] | None = None,
    bn_prefix: dict[str, str] | None = None,
    step_row: int | None = None,
    stats_prefix: dict[str, str] | None = None,
) -> Selection:
    """Where every tensor of a compact network sits in the server model.

    ``out_index[k]``: the server channels conv layer k keeps (its input channels are the
    previous layer's). ``bn_prefix``: compact BN name -> server key prefix of that
    sub-model's own BatchNorm (decoupled, taken whole); by default BN is shared and sliced.
    ``step_row``: row of the server's ``steps`` tensor this sub-model uses.
    ``stats_prefix``: compact BN name -> server key prefix of that sub-model's own running
    statistics (static BN: taken whole; the affine parameters stay as ``bn_prefix`` says);
    an empty dict leaves the statistics out (what a static-BN client trains).
    """
    kept = list(range(layout.num_blocks)) if kept is None else list(kept)
    down = layout.downsamples()
    sel: Selection = {}

    def conv(ck: str, gk: str, o: Tensor, i: Tensor | None) -> None:
        sel[ck] = (gk, (o, i))

    def bn(ck: str, gk: str, o: Tensor) -> None:
        own = (bn_prefix or {}).get(ck)
        for leaf in ("weight", "bias", *BN_STATISTICS):
            if stats_prefix is not None and leaf in BN_STATISTICS:
                if ck in stats_prefix:
                    sel[f"{ck}.{leaf}"] = (f"{stats_prefix[ck]}.{leaf}", ())
            elif own is not None:
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
            raise CisError(
                f"selection: block {b}'s identity shortcut needs its output channels to lead its input channels"
            )
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
        static_bn: bool = False,
    ) -> None:
        specs = list(specs)
        if not specs:
            raise CisError("nested model: expected at least one sub-model spec")
        if static_bn and decoupled_bn:
            raise CisError(
                "nested model: static BatchNorm re-estimates shared BatchNorm; expected decoupled_bn=False"
            )
        for k, s in enumerate(specs, start=1):
            if len(s.steps) != layout.num_blocks:
                raise CisError(
                    f"nested model: sub-model {k} has {len(s.steps)} step sizes, the layout {layout.num_blocks} blocks"
                )
        config = {
            "arch": self.arch,
            "layout": layout.to_json(),
            "specs": [s.to_json() for s in specs],
            "decoupled_bn": bool(decoupled_bn),
            "use_steps": bool(use_steps),
            "learn_steps": bool(learn_steps),
            "static_bn": bool(static_bn),
            "exits": list(range(1, len(specs) + 1)),
            "input_size": layout.input_size,
            "in_channels": layout.in_channels,
            "num_classes": layout.num_classes,
        }
        super().__init__([], config)
        self.layout, self.specs = layout, specs
        self.decoupled_bn, self.use_steps, self.learn_steps = decoupled_bn, use_steps, learn_steps
        self.static_bn = static_bn
        self.shared = CompactResNet(layout, layout.conv_channels())
        if decoupled_bn:
            self.sub_bns = nn.ModuleList(
                BatchNormSet(layout, self.widths(k), s.kept()) for k, s in enumerate(specs, start=1)
            )
        if static_bn:  # running statistics per sub-model, computed after training (cis/training/methods/static_bn.py)
            batch_statistics_only_(self.shared)
            self.sub_stats = nn.ModuleList(  # the name is STATISTICS_MODULE
                BatchNormSet(layout, self.widths(k), s.kept(), affine=False) for k, s in enumerate(specs, start=1)
            )
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

    def selection(self, k: int, statistics: bool = True) -> Selection:
        """Sub-model k's tensors in this model's state dict (ordered width slices). Under static BN its
        running statistics are its own (``sub_stats``), or left out with ``statistics=False``."""
        spec = self.specs[k - 1]
        kept = spec.kept()
        names = [n for n, _ in _bn_names(self.layout, kept)]
        own = {n: f"sub_bns.{k - 1}.bns.{_flat(n)}" for n in names} if self.decoupled_bn else None
        stats = None
        if self.static_bn:
            stats = {n: f"{STATISTICS_MODULE}.{k - 1}.bns.{_flat(n)}" for n in names} if statistics else {}
        return compact_selection(
            self.layout, [prefix(w) for w in self.widths(k)], kept, own, k - 1 if self.use_steps else None, stats
        )

    def trainee(self, k: int) -> tuple[CompactResNet, Selection]:
        """What a client trains as sub-model k: a fresh compact network and the selection it loads and
        uploads. Under static BN the network keeps no running statistics (each batch normalises with its
        own) and the selection leaves them out, so training never reads or writes them."""
        if not self.static_bn:
            return self.compact(k), self.selection(k)
        return batch_statistics_only_(self.compact(k)), self.selection(k, statistics=False)

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
        return {
            **self._config,
            "layout": dict(self._config["layout"]),
            "specs": [dict(s) for s in self._config["specs"]],
        }

    def serving_module(self, k: int) -> CompactResNet:
        """Sub-model k for inference, step sizes folded into the BatchNorm before them (eval mode)."""
        self._check_exit(k, "sub-model")
        net = self.compact(k)
        net.load_state_dict(gather(self.state_dict(), self.selection(k)))
        return fold_steps(net.eval())

    def stages(self) -> list[nn.Module]:
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


def build_nested(config: dict[str, Any]) -> NestedNet:
    """Rebuild a :class:`NestedNet` from its ``config()``."""
    try:
        layout_args: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in config["layout"].items()}
        layout = ResNetLayout(**layout_args)
        specs = [SubModelSpec(float(s["width"]), tuple(float(x) for x in s["steps"])) for s in config["specs"]]
        return NestedNet(
            layout, specs, bool(config["decoupled_bn"]), bool(config["use_steps"]), bool(config["learn_steps"]),
            bool(config.get("static_bn", False)),  # absent in checkpoints from before static BN
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CisError(
            f"nested model config: {type(exc).__name__}: {exc}; expected the dict NestedNet.config() writes"
        ) from None
