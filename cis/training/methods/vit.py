"""A small vision transformer with early exits, for 32x32 images (patch 4).

``ViTEE`` is an :class:`~cis.training.models.cnns.EarlyExitNet`: stage k is the blocks
after exit k-1 up to exit k. Its carry is a dict of named tensors:

- ``tokens`` (N, 1+n, D): the token sequence, CLS first;
- ``history`` (N, l, D), ReeFL only: the CLS tokens cls_1..cls_l of the l blocks run so far.

Two kinds of exits (``head``):

- ``"exit"``: one LayerNorm + Linear classifier per exit on the CLS token (the
  DepthFL / InclusiveFL / ExclusiveFL / ScaleFL / FLAME models);
- ``"ree"``: ReeFL. Ree runs after *every* block over [z_meta, cls_1..cls_l]; every
  exit uses one shared classifier on m_0 + cls_l; with ``modulation`` the carried
  CLS token is Ree's m_l (so the carry holds the modulated CLS plus the history).

Ree and the shared classifier are owned by the model, not by a stage (a stage
keeps an unregistered reference), so the state dict holds them once, under
``ree.`` and ``classifier.``; a stage's keys are ``stage_list.{k-1}.``.

Width scaling (ScaleFL): :meth:`ViTEE.set_width` makes every block use only its
first attention heads and MLP hidden units; the sliced forward touches (and
trains) exactly those rows and columns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.core.stages.contract import INPUT, carry_name
from cis.training.methods.ree import NormLinear, Ree, broadcast_param, multihead_attention, ree_step
from cis.training.models.contract import EarlyExitNet
from cis.training.models.contract import is_int as _is_int
from cis.training.models.stage_plan import ExportStage, StagePlan

TOKENS = "tokens"
HISTORY = "history"
HEADS = ("exit", "ree")
DEFAULT_EXITS = (2, 4, 6)


class PatchEmbed(nn.Module):
    """Patches -> tokens, plus a CLS token and learnable positions."""

    def __init__(self, in_channels: int, input_size: int, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch, patch)
        n = (input_size // patch) ** 2
        self.shape = (dim, n)  # constants, so an exported graph keeps static token shapes
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        nn.init.trunc_normal_(self.cls, std=0.02)
        nn.init.trunc_normal_(self.pos, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        z = self.proj(x).reshape(-1, *self.shape).transpose(1, 2)
        cls = broadcast_param(self.cls, z[:, :1])
        return torch.cat([cls, z], dim=1) + self.pos


class Block(nn.Module):
    """Pre-norm transformer block; ``heads_on`` / ``hidden_on`` restrict it to its first heads / MLP units."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.hidden = round(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, self.hidden)
        self.fc2 = nn.Linear(self.hidden, dim)
        self.heads_on, self.hidden_on = heads, self.hidden

    def forward(self, x: Tensor) -> Tensor:
        return self._mlp(self._attn(x))

    def _attn(self, x: Tensor) -> Tensor:
        h, hd = self.heads_on, self.head_dim
        b: Tensor  # a Parameter, replaced by its slice below
        w, b, w_out = self.qkv.weight, self.qkv.bias, self.proj.weight
        if h < self.heads:  # full width uses the weights as they are (a plain graph for export)
            rows = qkv_rows(self.heads, hd, h, x.device)
            w, b, w_out = w[rows], b[rows], w_out[:, : h * hd]
        return x + multihead_attention(self.norm1(x), w, b, w_out, self.proj.bias, h, hd)

    def _mlp(self, x: Tensor) -> Tensor:
        k = self.hidden_on
        hid = F.gelu(F.linear(self.norm2(x), self.fc1.weight[:k], self.fc1.bias[:k]))
        return x + F.linear(hid, self.fc2.weight[:, :k], self.fc2.bias)


def qkv_rows(heads: int, head_dim: int, heads_on: int, device: torch.device | None = None) -> Tensor:
    """Rows of the fused qkv weight (layout [q|k|v] x heads x head_dim) of the first ``heads_on`` heads."""
    dim = heads * head_dim
    one = torch.arange(heads_on * head_dim, device=device)
    return torch.cat([one, one + dim, one + 2 * dim])


def width_counts(heads: int, hidden: int, ratio: float) -> tuple[int, int]:
    """(heads, MLP units) a block keeps at width ``ratio``: ceil of the share, at least one."""
    return max(1, math.ceil(ratio * heads - 1e-9)), max(1, math.ceil(ratio * hidden - 1e-9))


class ViTStage(nn.Module):
    """Stage k: (patch embedding for k = 1) + its blocks + (its own head, or the shared Ree classifier)."""

    shared: ReeParts | None  # a plain attribute (set through __dict__), not a submodule

    def __init__(
        self, embed: PatchEmbed | None, blocks: list[Block], head: NormLinear | None, shared: ReeParts | None
    ) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head
        self.__dict__["shared"] = shared  # not registered: the model owns Ree and the classifier once

    def forward(self, carry: Tensor | dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        history: Tensor | None
        if self.embed is not None:
            tokens, history = self.embed(carry), None
        else:
            given = cast(dict[str, Tensor], carry)  # a later stage takes the previous stage's carry dict
            tokens, history = given[TOKENS], given.get(HISTORY)
        feature = None
        for block in self.blocks:
            tokens = block(tokens)
            if self.shared is not None:
                tokens, history, feature = ree_step(self.shared.ree, tokens, history, self.shared.modulation)
        if self.shared is not None:  # every stage has a block (_validated), so ree_step set history
            return self.shared.classifier(feature), {TOKENS: tokens, HISTORY: cast(Tensor, history)}
        return cast(NormLinear, self.head)(tokens[:, 0]), {TOKENS: tokens}  # own head wherever shared is None


class ReeParts:
    """What every ReeFL stage shares: the Ree module, the classifier and the modulation switch."""

    def __init__(self, ree: Ree, classifier: NormLinear, modulation: bool) -> None:
        self.ree, self.classifier, self.modulation = ree, classifier, modulation


class ViTEE(EarlyExitNet):
    """Early-exit ViT; ``exits`` are 1-based block indices ending at ``depth``."""

    arch = "vit"

    def __init__(
        self,
        num_classes: int = 10,
        exits: Sequence[int] = DEFAULT_EXITS,
        in_channels: int = 3,
        input_size: int = 32,
        patch: int = 4,
        dim: int = 64,
        depth: int = 6,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        head: str = "exit",
        modulation: bool = True,
    ) -> None:
        config = _validated(
            num_classes, exits, in_channels, input_size, patch, dim, depth, heads, mlp_ratio, head, modulation
        )
        blocks = [Block(dim, heads, mlp_ratio) for _ in range(depth)]
        embed = PatchEmbed(in_channels, input_size, patch, dim)
        shared = None
        if head == "ree":
            shared = ReeParts(Ree(dim, depth), NormLinear(dim, num_classes), modulation)
        stages, start = [], 0
        for k, e in enumerate(config["exits"]):
            own_head = None if shared else NormLinear(dim, num_classes)
            stages.append(ViTStage(embed if k == 0 else None, blocks[start:e], own_head, shared))
            start = e
        super().__init__(stages, config)
        if shared is not None:
            self.ree, self.classifier = shared.ree, shared.classifier

    def config(self) -> dict[str, Any]:
        return dict(self._config, exits=list(self._config["exits"]))

    def exit_params(self, e: int) -> list[nn.Parameter]:
        """Stages 1..e without the heads of exits before e; ReeFL adds Ree and the shared classifier."""
        self._check_exit(e, "exit")
        params = []
        for k, stage in enumerate(self.stage_list[:e], start=1):
            params += [p for name, p in stage.named_parameters() if k == e or not name.startswith("head.")]
        if self._config["head"] == "ree":
            params += list(self.ree.parameters()) + list(self.classifier.parameters())
        return params

    def blocks(self) -> list[Block]:
        stages = cast(Iterable[ViTStage], self.stage_list)  # ViTEE's stages are ViTStages of Blocks
        return [cast(Block, b) for stage in stages for b in stage.blocks]

    def set_width(self, ratio: float) -> None:
        """Every block keeps its first ceil(ratio * heads) heads and ceil(ratio * hidden) MLP units."""
        for b in self.blocks():
            b.heads_on, b.hidden_on = width_counts(b.heads, b.hidden, ratio)

    def carry_names(self) -> tuple[str, ...]:
        return (TOKENS, HISTORY) if self._config["head"] == "ree" else (TOKENS,)

    def export_stages(self) -> StagePlan:
        """The stage plan for the exporter: stage k reads ``input`` (k = 1) or stage k-1's carry, returns logits
        and carry.

        Carry tensors are named per stage (``tokens_k``, ``history_k``), as the stage contract asks
        (cis.core.stages.runner).
        """
        names = self.carry_names()
        out = []
        for k, stage in enumerate(cast(Iterable[ViTStage], self.stage_list), start=1):
            last = k == self.num_exits
            module = NamedStage(stage, () if last else names).eval()
            inputs = (INPUT,) if k == 1 else tuple(carry_name(n, k - 1) for n in names)
            carry = () if last else tuple(carry_name(n, k) for n in names)
            out.append(ExportStage(k, k, module, inputs, carry))
        return StagePlan(out, {INPUT: tuple(self.input_shape)}, lambda feeds: self(feeds[INPUT]))


class NamedStage(nn.Module):
    """Adapts a :class:`ViTStage` to positional tensors: ``forward(*inputs) -> (logits, *carry)``."""

    def __init__(self, stage: ViTStage, carry: tuple[str, ...]) -> None:
        super().__init__()
        self.stage = stage
        self.carry = carry
        if stage.shared is not None:  # register the shared modules so the exported graph holds their weights
            self.ree, self.classifier = stage.shared.ree, stage.shared.classifier

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        if self.stage.embed is not None:
            carry_in: Tensor | dict[str, Tensor] = inputs[0]
        else:
            carry_in = dict(zip((TOKENS, HISTORY), inputs))
        logits, carry = self.stage(carry_in)
        return (logits, *[carry[n] for n in self.carry])


def _validated(
    num_classes: int, exits: Sequence[int], in_channels: int, input_size: int, patch: int, dim: int, depth: int,
    heads: int, mlp_ratio: float, head: str, modulation: bool,
) -> dict[str, Any]:
    where = "model config (vit)"
    for field, value, low in (
        ("num_classes", num_classes, 2), ("in_channels", in_channels, 1), ("input_size", input_size, 1),
        ("patch", patch, 1), ("dim", dim, 1), ("depth", depth, 1), ("heads", heads, 1),
    ):
        if not _is_int(value) or value < low:
            raise CisError(f"{where}: field {field!r} is {value!r}, expected an integer >= {low}")
    if input_size % patch:
        raise CisError(f"{where}: field 'patch' is {patch}, expected a divisor of input_size {input_size}")
    if dim % heads:
        raise CisError(f"{where}: field 'heads' is {heads}, expected a divisor of dim {dim}")
    try:
        exits = list(exits)
    except TypeError:
        exits = []
    if (
        not exits
        or not all(_is_int(e) for e in exits)
        or exits[0] < 1
        or exits[-1] != depth
        or any(b <= a for a, b in zip(exits, exits[1:]))
    ):
        raise CisError(
            f"{where}: field 'exits' is {exits!r}, expected increasing block indices in 1..{depth} ending at {depth}"
        )
    if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or not mlp_ratio > 0:
        raise CisError(f"{where}: field 'mlp_ratio' is {mlp_ratio!r}, expected a positive number")
    if head not in HEADS:
        raise CisError(f"{where}: field 'head' is {head!r}, expected one of {list(HEADS)}")
    if not isinstance(modulation, bool):
        raise CisError(f"{where}: field 'modulation' is {modulation!r}, expected true or false")
    return {
        "arch": ViTEE.arch,
        "exits": [int(e) for e in exits],
        "num_classes": int(num_classes),
        "in_channels": int(in_channels),
        "input_size": int(input_size),
        "patch": int(patch),
        "dim": int(dim),
        "depth": int(depth),
        "heads": int(heads),
        "mlp_ratio": float(mlp_ratio),
        "head": head,
        "modulation": bool(modulation),
    }

