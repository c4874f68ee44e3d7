"""The stage plan: how a model says where it is cut into stages (the exporter reads it).

The exporter never looks inside a model. It asks for a :class:`StagePlan`:

- ``stages``: one :class:`ExportStage` per exit, in order. Each holds a torch
  module whose ``forward(*inputs)`` takes the tensors named ``inputs`` and
  returns a tuple whose first element is the exit's logits and whose others are
  the tensors named ``carry`` (the last stage has no carry);
- ``inputs``: the per-sample shape of every tensor stage 1 reads (the request);
- ``reference``: the full model, ``reference(feeds) -> [logits of exits 1..E]``,
  which the chained stages must reproduce.

Stage k's inputs are names out of stage k-1's carry (or out of ``inputs`` for
k = 1), so a method can forward any state: features (early-exit CNNs), token
tensors and a CLS history (ReeFL), a patience counter (FLAME), or the raw input
(nested models, whose every stage starts again from the image).

A model provides its plan with a method ``export_stages() -> StagePlan``;
:class:`cis.training.models.contract.EarlyExitNet` (every user model) gets the default below: stage k is body k + head
k,
stage 1 reads ``input`` (the model's ``input_shape`` and ``input_dtype``: images, sequences, int64 token ids),
stage k forwards its features as ``features_k``. The names follow
the stage contract of :mod:`cis.core.stages.runner` (``INPUT``, ``LOGITS``, ``carry_name``),
which the bundle, the runtime and the simulator read; the plan lives here, in
training, because its stages are torch modules (export imports training, never
the other way round).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor, nn

from cis.core.errors import CisError
from cis.core.stages.contract import FEATURES, INPUT, LOGITS, carry_name


@dataclass
class ExportStage:
    """Stage ``index`` (1-based), serving exit ``exit``."""

    index: int
    exit: int
    module: nn.Module  # forward(*inputs) -> (logits, *carry)
    inputs: tuple[str, ...]
    carry: tuple[str, ...]  # empty for the last stage

    @property
    def outputs(self) -> tuple[str, ...]:
        return (LOGITS, *self.carry)


@dataclass
class StagePlan:
    stages: list[ExportStage]
    inputs: dict[str, tuple[int, ...]]  # stage 1's tensors: name -> per-sample shape
    reference: Callable[[Mapping[str, Tensor]], Sequence[Tensor]]
    input_dtypes: dict[str, torch.dtype] = field(default_factory=dict)  # default float32
    samples: dict[str, Tensor] = field(default_factory=dict)  # real inputs to draw integer examples from

    @property
    def num_exits(self) -> int:
        return len(self.stages)

    def example_inputs(self, batch: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """A batch of inputs: floats drawn from a normal; integers (token ids, indices whose valid range only
        the data knows) drawn from :attr:`samples` where given, else 0."""
        out = {}
        for name, shape in self.inputs.items():
            dtype = self.input_dtypes.get(name, torch.float32)
            if dtype.is_floating_point:
                out[name] = torch.randn((batch, *shape), generator=generator).to(dtype)
            elif name in self.samples and len(self.samples[name]):
                rows = torch.randint(len(self.samples[name]), (batch,), generator=generator)
                out[name] = self.samples[name][rows].to(dtype)
            else:
                out[name] = torch.zeros((batch, *shape), dtype=dtype)
        return out

    def validate(self) -> StagePlan:
        """Check that every stage reads only what the request or the previous stage provides."""
        available = set(self.inputs)
        for k, st in enumerate(self.stages, start=1):
            if st.index != k:
                raise CisError(f"stage plan: stage {k} says index {st.index}; expected stages numbered 1..E in order")
            unknown = [n for n in st.inputs if n not in available]
            if unknown:
                raise CisError(
                    f"stage plan: stage {k} reads {unknown[0]!r}, which stage {k - 1 or 'input'} does not provide "
                    f"({sorted(available)})"
                )
            clash = sorted(set(st.inputs) & set(st.carry))
            if clash:
                raise CisError(
                    f"stage plan: stage {k} reads and returns {clash[0]!r}; expected distinct names (e.g. numbered "
                    "per stage)"
                )
            if LOGITS in st.carry:
                raise CisError(
                    f"stage plan: stage {k} names a carry tensor {LOGITS!r}; that name is reserved for the exit's "
                    "logits"
                )
            if k == len(self.stages) and st.carry:
                raise CisError(f"stage plan: the last stage ({k}) returns a carry {st.carry}; expected logits only")
            available = set(st.carry)
        return self


class _TupleStage(nn.Module):
    """Adapts ``Stage.forward(carry) -> (logits, features)`` to the plan's convention."""

    def __init__(self, stage: nn.Module, last: bool) -> None:
        super().__init__()
        self.stage = stage
        self.last = last

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        logits, features = self.stage(x)
        return (logits,) if self.last else (logits, features)


def early_exit_plan(model: nn.Module) -> StagePlan:
    """The default plan of an :class:`~cis.training.models.cnns.EarlyExitNet`."""
    stages = cast(Callable[[], Sequence[nn.Module]], model.stages)()
    out = []
    for k, st in enumerate(stages, start=1):
        last = k == len(stages)
        out.append(
            ExportStage(
                index=k,
                exit=k,
                module=_TupleStage(st, last).eval(),
                inputs=(INPUT,) if k == 1 else (carry_name(FEATURES, k - 1),),
                carry=() if last else (carry_name(FEATURES, k),),
            )
        )
    dtype = getattr(model, "input_dtype", torch.float32)
    shape = tuple(cast(Sequence[int], model.input_shape))
    return StagePlan(out, {INPUT: shape}, lambda feeds: model(feeds[INPUT]), {INPUT: dtype})


def describe_stages(model: nn.Module) -> StagePlan:
    """The model's own plan (``export_stages()``), or the early-exit default."""
    model.eval()
    if hasattr(model, "export_stages"):
        plan = cast(Callable[[], StagePlan], model.export_stages)()
    elif hasattr(model, "stages") and hasattr(model, "input_shape"):
        plan = early_exit_plan(model)
    else:
        raise CisError(
            f"{type(model).__name__}: cannot cut it into stages; expected an EarlyExitNet or a model with "
            "export_stages()"
        )
    for st in plan.stages:
        st.module.eval()
    return plan.validate()


@torch.no_grad()
def run_plan(plan: StagePlan, feeds: Mapping[str, Tensor]) -> list[dict[str, Tensor]]:
    """Run the torch stages in a chain; returns each stage's named outputs."""
    carry = dict(feeds)
    outs = []
    for st in plan.stages:
        values = st.module(*[carry[n] for n in st.inputs])
        if isinstance(values, Tensor):
            values = (values,)
        if len(values) != len(st.outputs):
            raise CisError(
                f"stage plan: stage {st.index} returned {len(values)} tensors; expected {len(st.outputs)} {st.outputs}"
            )
        named = dict(zip(st.outputs, values))
        outs.append(named)
        carry = {n: named[n] for n in st.carry}
    return outs
