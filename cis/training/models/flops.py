"""Measured per-exit costs of an early-exit model (FLOPs and parameters).

FLOPs are counted with torch's own per-operator formulas (``torch.utils.flop_counter``'s
registry, what ``FlopCounterMode`` uses) while the model really runs ``forward(x, upto=e)`` on
one sample, so they follow the code rather than a hand formula. The formulas count matrix
multiplications, convolutions and attention (2 FLOPs per multiply-add); BatchNorm, activations
and pooling are not counted.

The counting mode is :class:`_FlopCount`, not ``FlopCounterMode`` itself: the latter's dispatch
handler imports ``torch._dynamo`` on its first operator (about 3 s, paid by every process that
trains or exports), and it tracks modules, which a total does not need. Both take the same
steps per operator (decompose what has no formula, run, count), so their totals are equal
(tests/test_flops.py compares them).

:func:`count_flops` counts the real work of attention layers too. In eval mode
``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` take a fused "fast path"
(one ``aten._transformer_encoder_layer_fwd`` call) that the counter does not see (an
encoder layer counted 0 FLOPs), and on the CPU scaled-dot-product attention runs
``aten._scaled_dot_product_flash_attention_for_cpu``, which it does not know either. So the
count runs with the fast path off (``torch.backends.mha``; the same arithmetic, unfused) and
counts that CPU kernel with torch's own attention formula (``sdpa_flop_count``). Every user
of FLOPs goes through it: ``--strategy flops`` / ``auto``, ``--lower-exit-steps flops``,
FLAME's training FLOPs and the bundle's per-stage ``flops`` (``cis inspect``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from cis.core.errors import CisError, error_line
from cis.training.models.contract import EarlyExitNet


def _cpu_attention_flops(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return int(flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape))


_cpu_attention_flops._get_raw = True  # type: ignore[attr-defined]  # it takes the tensors (FlopCounterMode's flag)
_UNCOUNTED = {  # kernels torch's registry has no formula for -> ours
    op: _cpu_attention_flops
    for op in (getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None),)
    if op is not None
}
_FORMULAS = {**flop_counter.flop_registry, **_UNCOUNTED}  # torch's formulas (FlopCounterMode's registry) and ours


class _FlopCount(TorchDispatchMode):
    """The total FLOPs of the operators run inside it: FlopCounterMode's steps, without its module tracking.

    An operator without a formula is decomposed (its parts may have one), as in FlopCounterMode. Saying
    that dynamo need not be skipped inside the handler (``_should_skip_dynamo``) keeps torch from wrapping it in
    ``torch._dynamo.disable``, whose first call imports dynamo; nothing here is compiled.
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's signature)
        kwargs = kwargs or {}
        formula = _FORMULAS.get(func._overloadpacket)
        if formula is None and func is not torch.ops.prim.device.default:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def count_flops(run: Callable[[], Any]) -> int:
    """The FLOPs of ``run()`` (no gradient), attention's included (the module doc says how)."""
    mha = torch.backends.mha
    fast = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        counter = _FlopCount()
        with torch.no_grad(), counter:
            run()
        return counter.total
    finally:
        mha.set_fastpath_enabled(fast)


def exit_costs(model: EarlyExitNet, input_shape: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One dict per exit e = 1..E.

    - ``flops``: forward FLOPs of ``forward(x, upto=e)`` for one sample, i.e.
      stages 1..e including the heads of exits 1..e-1 (what a request served at
      exit e has cost in a CIS);
    - ``params``: parameters of stages 1..e (what a node whose largest exit is e holds);
    - ``exit_params``: parameters exit e's loss touches (stage bodies 1..e and head e).

    ``input_shape`` is the shape of one sample ((C, H, W) for images), default ``model.input_shape``; the
    sample is zeros of the model's ``input_dtype`` (floats in the parameters' dtype; token ids 0).
    """
    shape = tuple(model.input_shape if input_shape is None else input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise CisError(f"exit_costs input_shape {shape}: expected the positive dimensions of one sample")
    param = next(model.parameters())
    dtype = getattr(model, "input_dtype", torch.float32)
    x = torch.zeros((1, *shape), dtype=param.dtype if dtype.is_floating_point else dtype, device=param.device)
    was_training = model.training
    model.eval()
    costs = []
    try:
        for e in range(1, model.num_exits + 1):
            try:
                flops = count_flops(partial(model, x, upto=e))
            except (RuntimeError, ValueError, IndexError) as exc:
                what = f"exit_costs: the model cannot take one sample of shape {shape} ({error_line(exc)})"
                raise CisError(what) from None
            costs.append(
                {
                    "exit": e,
                    "flops": flops,
                    "params": sum(p.numel() for s in model.stages()[:e] for p in s.parameters()),
                    "exit_params": sum(p.numel() for p in model.exit_params(e)),
                }
            )
    finally:
        model.train(was_training)
    return costs
