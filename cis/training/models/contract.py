"""The public model contract: an early-exit model is an ordered list of stages, each a ``(body, head)`` pair.

    body_k(carry_k)    -> features_k        (torch.nn.Module)
    head_k(features_k) -> logits_k          (N, num_classes)
    carry_1 = the input;  carry_{k+1} = features_k

Inputs and carries are tensors of any shape and dtype: images (N, C, H, W), float sequences (N, C, L),
int64 token ids (N, L), token sequences (N, L, D). This is what ``cis train --model PATH.py:FACTORY``
takes: the factory returns either a list of ``(body, head)`` pairs of plain torch modules (the file needs
nothing from cis) or an :class:`EarlyExitNet`. Every built-in architecture is one too
(cis/training/architectures.py), so the trainer, the offline evaluation and the exporter have one code path:

    model = EarlyExitNet([(body1, head1), (body2, head2), (body3, head3)])
    logits = model(x)              # [logits of exit 1, 2, 3]
    logits = model(x, upto=2)      # stages 3.. not run

The exporter cuts the model at its stages (stage k = body k + head k, one ONNX graph each,
cis/training/models/stage_plan.py); the run records the input's per-sample shape and dtype (``input_shape``,
``input_dtype``) from the training data. :func:`default_head` gives a head for a carry by its rank;
:func:`check_chain` runs one small batch through every body and head before training, so a body
that cannot take the previous body's output is found in one line that names both stages and shapes.

This module is stable: its names (``EarlyExitNet``, ``Stage``, ``default_head``, ``ExitHead``,
``TokenHead``, ``check_chain``, ``as_early_exit``) and the ``stage_list.{k}.body`` / ``.head`` state-dict
layout are what run dirs and bundles rely on (docs/your-model.md).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from cis.core.errors import CisError, error_line

TOKEN_POOLS = ("mean", "cls", "channels")
"""How :func:`default_head` reads a 3-D carry: tokens (N, L, D) by their mean or first (CLS) token, or a
channel-first sequence (N, C, L) by its mean over L."""


def is_int(v: object) -> bool:
    """True for Python and numpy integers (an exit sampled with numpy is fine), False for bools."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


class ExitHead(nn.Module):
    """Adaptive average pool + linear classifier: the default head of a 4-D carry (N, C, H, W)."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.pool(x), 1))


class TokenHead(nn.Module):
    """LayerNorm + linear on a pooled 3-D carry: tokens (N, L, D) by ``mean`` or ``cls`` (the first token),
    or ``channels``: a sequence (N, C, L) averaged over L (then no LayerNorm: a CNN's features)."""

    def __init__(self, dim: int, num_classes: int, pool: str = "mean") -> None:
        super().__init__()
        if pool not in TOKEN_POOLS:
            raise CisError(f"token head: pool {pool!r}; expected one of {', '.join(TOKEN_POOLS)}")
        self.pool = pool
        self.norm = nn.LayerNorm(dim) if pool != "channels" else nn.Identity()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if self.pool == "cls":
            pooled = x[:, 0]
        elif self.pool == "mean":
            pooled = x.mean(dim=1)
        else:
            pooled = x.mean(dim=2)
        return self.fc(self.norm(pooled))


def default_head(features: Tensor, num_classes: int, tokens: str = "mean") -> nn.Module:
    """A head for a carry like ``features`` (one example batch), by its rank: 4-D (N, C, H, W) pool + linear;
    3-D tokens (N, L, D) LayerNorm + linear on their mean (``tokens="cls"``: the first token;
    ``"channels"``: a (N, C, L) sequence averaged over L); 2-D (N, D) linear. Its dtype follows ``features``."""
    shape = tuple(features.shape)
    if features.dim() == 4:
        head: nn.Module = ExitHead(shape[1], num_classes)
    elif features.dim() == 3:
        if tokens not in TOKEN_POOLS:
            raise CisError(f"default head: tokens={tokens!r}; expected one of {', '.join(TOKEN_POOLS)}")
        head = TokenHead(shape[1] if tokens == "channels" else shape[2], num_classes, tokens)
    elif features.dim() == 2:
        head = nn.Linear(shape[1], num_classes)
    else:
        raise CisError(
            f"default head: features of shape {shape}; expected 2-D (N, D), 3-D (N, L, D) or 4-D (N, C, H, W)"
        )
    if features.is_floating_point():
        head = head.to(features.dtype)
    return head


class Stage(nn.Module):
    """The layers between two exits (``body``) and the exit head at its end (``head``)."""

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, carry: Tensor) -> tuple[Tensor, Tensor]:
        """Returns (logits of this exit, features for the next stage)."""
        features = self.body(carry)
        return self.head(features), features


class EarlyExitNet(nn.Module):
    """A model made of stages 1..E: the common interface of every early-exit model, built-in or a user's.

    ``stages``: :class:`Stage` modules (or a built-in's own stage modules, e.g. the ViT's) or ``(body, head)``
    pairs. ``config``: what rebuilds it
    (a built-in architecture's fields, or a user model's reference record, cis/training/models/model_ref.py).
    ``input_shape`` / ``input_dtype``: one sample of stage 1's input (a built-in's come from its config;
    a user model's from the training data, recorded with the run).
    """

    arch: str = "early-exit"

    def __init__(
        self,
        stages: Sequence[nn.Module | tuple[nn.Module, nn.Module]],
        config: dict[str, Any] | None = None,
        input_shape: Sequence[int] | None = None,
        input_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.stage_list = nn.ModuleList(s if isinstance(s, nn.Module) else Stage(*s) for s in stages)
        self._config = dict(config or {})
        self._input_shape = None if input_shape is None else tuple(int(d) for d in input_shape)
        self.input_dtype = input_dtype

    @property
    def num_exits(self) -> int:
        return len(self.stage_list)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample (a built-in CNN's (C, H, W) from its config)."""
        if self._input_shape is not None:
            return self._input_shape
        if "input_size" not in self._config:
            raise CisError(f"{self.arch} model: no input shape recorded; expected one from the training data")
        size = self._config["input_size"]
        return (self._config["in_channels"], size, size)

    def set_input(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        """Record one sample's shape and dtype (a user model's, from the data it trains on)."""
        self._input_shape = tuple(int(d) for d in shape)
        self.input_dtype = dtype

    def stages(self) -> list[nn.Module]:
        """Stage k (index k-1) maps its carry to (logits_k, carry for stage k+1)."""
        return list(self.stage_list)

    def forward(self, x: Tensor, upto: int | None = None) -> list[Tensor]:
        """Logits of exits 1..upto (default: all); stages after ``upto`` are not run."""
        upto = self.num_exits if upto is None else self._check_exit(upto, "upto")
        logits: list[Tensor] = []
        carry = x
        for stage in self.stage_list[:upto]:
            out, carry = stage(carry)
            logits.append(out)
        return logits

    def config(self) -> dict[str, Any]:
        """JSON-serialisable description; ``cis.training.models.model_ref.build_model(model.config())`` rebuilds it."""
        out = dict(self._config)
        if "exits" in out:
            out["exits"] = list(out["exits"])
        return out

    def set_config(self, config: dict[str, Any]) -> None:
        self._config = dict(config)

    def exit_params(self, e: int) -> list[nn.Parameter]:
        """The parameters exit e's loss depends on: the bodies of stages 1..e and head e."""
        self._check_exit(e, "exit")
        params = [p for stage in self.stage_list[:e] for p in cast(nn.Module, stage.body).parameters()]
        return params + list(cast(nn.Module, self.stage_list[e - 1].head).parameters())

    def exit_state_keys(self, e: int, head: bool = True) -> list[str]:
        """The state-dict entries (parameters and BatchNorm buffers) that training exit e can change:
        those of the bodies of stages 1..e and (``head``) of head e."""
        self._check_exit(e, "exit")
        keys = [
            f"stage_list.{k}.body.{name}"
            for k in range(e)
            for name in cast(nn.Module, self.stage_list[k].body).state_dict()
        ]
        if not head:
            return keys
        last_head = cast(nn.Module, self.stage_list[e - 1].head)
        return keys + [f"stage_list.{e - 1}.head.{name}" for name in last_head.state_dict()]

    def _check_exit(self, e: int, what: str) -> int:
        if not is_int(e) or not 1 <= e <= self.num_exits:
            name = self._config.get("arch", self.arch)
            raise CisError(f"{name} {what} {e!r}: expected an exit in 1..{self.num_exits}")
        return int(e)


def as_early_exit(result: Any, where: str) -> EarlyExitNet:
    """A factory's result as an :class:`EarlyExitNet`: the model itself, or a list of ``(body, head)`` pairs."""
    expected = "a list of (body, head) pairs of torch.nn.Module, or a cis.training.models.contract.EarlyExitNet"
    if isinstance(result, EarlyExitNet):
        return result
    if isinstance(result, nn.Module):
        raise CisError(f"{where} returned a {type(result).__name__} (one torch module); expected {expected}")
    if not isinstance(result, (list, tuple)) or not result:
        what = "an empty list" if isinstance(result, (list, tuple)) else f"a {type(result).__name__}"
        raise CisError(f"{where} returned {what}; expected {expected}")
    for k, pair in enumerate(result, start=1):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(m, nn.Module) for m in pair)
        if not ok:
            got = (
                "(" + ", ".join(type(m).__name__ for m in pair) + ")"
                if isinstance(pair, (list, tuple))
                else type(pair).__name__
            )
            raise CisError(f"{where}: stage {k} is {got}; expected {expected}")
    return EarlyExitNet([Stage(body, head) for body, head in result])


def _describe(t: Any) -> str:
    if isinstance(t, Tensor):
        return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
    return type(t).__name__


@torch.no_grad()
def check_chain(model: EarlyExitNet, x: Tensor, num_classes: int | None = None, where: str = "model") -> None:
    """Run one small batch ``x`` through every body and head (eval mode, no gradient) before training.

    One line names the stage (and the stage before it) and the shapes where a body cannot take the carry,
    a body returns something other than one tensor, or a head's logits are not (N, num_classes), not
    floating-point, or NaN or inf."""
    was_training = model.training
    model.eval()
    try:
        carry: Any = x
        n = len(x)
        for k, stage in enumerate(model.stages(), start=1):
            source = "the input" if k == 1 else f"stage {k - 1}'s body output"
            if not isinstance(stage, Stage):  # a built-in stage with its own carry (e.g. the ViT's token dict)
                try:
                    logits, carry = stage(carry)
                except Exception as exc:
                    raise CisError(f"{where}: stage {k} cannot take {source} ({error_line(exc)})") from None
            else:
                try:
                    features = stage.body(carry)
                except Exception as exc:
                    raise CisError(
                        f"{where}: stage {k}'s body cannot take {source} of shape {_describe(carry)} "
                        f"({error_line(exc)})"
                    ) from None
                if not isinstance(features, Tensor):
                    raise CisError(
                        f"{where}: stage {k}'s body returned a {type(features).__name__}; expected one tensor "
                        "(the next stage's carry)"
                    )
                try:
                    logits = stage.head(features)
                except Exception as exc:
                    raise CisError(
                        f"{where}: stage {k}'s head cannot take its body's output of shape {_describe(features)} "
                        f"({error_line(exc)})"
                    ) from None
                carry = features
            _check_logits(logits, k, n, num_classes, where, carry if isinstance(stage, Stage) else None)
    finally:
        model.train(was_training)


def _check_logits(logits: Any, k: int, n: int, num_classes: int | None, where: str, features: Any = None) -> None:
    """Stage ``k``'s head output on the check batch of ``n``: floating-point logits (N, num_classes), none NaN or
    +inf (-inf, a class masked out, is fine); one line otherwise (``features``: its body's output, if known)."""
    want = f"({n}, {num_classes})" if num_classes is not None else f"({n}, classes)"
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != n or (
        num_classes is not None and logits.shape[1] != num_classes
    ):
        raise CisError(f"{where}: stage {k}'s head returned {_describe(logits)}; expected logits {want}")
    if not logits.is_floating_point():
        raise CisError(
            f"{where}: stage {k}'s head returned {_describe(logits)}; expected floating-point logits {want} "
            "(training takes the cross-entropy of float logits)"
        )
    bad = torch.isnan(logits) | torch.isposinf(logits)
    if bool(bad.any()):
        kind = "NaN" if bool(torch.isnan(logits).any()) else "inf"
        first = int(bad.any(dim=1).nonzero()[0, 0])
        body = (
            "; its body's output holds NaN or inf already"
            if isinstance(features, Tensor) and features.is_floating_point() and not bool(features.isfinite().all())
            else ""
        )
        raise CisError(
            f"{where}: stage {k}'s head returned {kind} logits (check sample {first} of {n}{body}); expected finite "
            "logits before training (look for a division by zero, a log of 0 or a NaN constant in the model)"
        )


@torch.no_grad()
def input_index_range(model: EarlyExitNet, x: Tensor) -> tuple[str, int] | None:
    """The index range a model declares for integer inputs: (the embedding's name, its ``num_embeddings``) of the
    first ``nn.Embedding`` / ``nn.EmbeddingBag`` that stage 1's body hands the input itself (or a view of it),
    found by running one probe sample of zeros (ids every embedding takes); None for float inputs or where
    no embedding takes the input as it is (e.g. a position embedding takes ``arange``, not the input)."""
    if x.is_floating_point() or not len(x):
        return None
    probe = torch.zeros_like(x[:1])
    found: list[tuple[str, int]] = []
    first = model.stages()[0]
    body = first.body if isinstance(first, Stage) else first

    def seen(name: str, module: nn.Embedding | nn.EmbeddingBag):
        def hook(_: nn.Module, args: tuple) -> None:
            given = args[0] if args else None
            if not found and isinstance(given, Tensor) and _same_storage(given, probe):
                found.append((name, int(module.num_embeddings)))
        return hook

    handles = [m.register_forward_pre_hook(seen(n, m)) for n, m in body.named_modules()
               if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    was_training = model.training
    model.eval()
    try:
        body(probe)
    except Exception:  # noqa: BLE001  check_chain says what is wrong with the body, in one line
        return None
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return found[0] if found else None


def _same_storage(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
