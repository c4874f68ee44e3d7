"""Check exported stages against torch with onnxruntime on the CPU.

Two checks, each at several batches (batch 1, an odd batch such as 17, and a
batch of validation data):

- *stage vs torch*: stage k's graph fed exactly what torch stage k was fed;
- *chain vs full*: the graphs chained through :func:`cis.core.stages.runner.run_stages`
  against the full torch model's logits at every exit.

Every float output's max absolute difference must stay within ``atol`` (1e-4 for
fp32), every other output (a bool mask, int64 ids) must match exactly, and the argmax
of the logits must agree; a disagreement counts only
where torch's top two logits differ by more than ``atol`` (an exact tie may go
either way). A failed check raises :class:`VerificationError` with the numbers.

The torch side runs each stage on copies of its inputs (:func:`torch_stages`), so a body that changes its
input in place (``nn.ReLU(inplace=True)`` first, ``x.mul_(2)``) leaves the tensors the previous stage returned
as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from cis.core.errors import CisError
from cis.core.stages.contract import LOGITS
from cis.core.stages.runner import StageRunner, run_stages
from cis.training.models.stage_plan import StagePlan

DEFAULT_ATOL = 1e-4
ODD_BATCH = 17  # the odd batch size every check runs at besides 1 (catches batch-dependent shapes)


class VerificationError(CisError):
    """An exported graph does not reproduce its torch counterpart."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def torch_stages(plan: StagePlan, feeds: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Each torch stage's named outputs, the stages chained as :func:`cis.training.models.stage_plan.run_plan`
    does, but every stage fed copies: a stage that writes to its input in place changes neither ``feeds`` nor
    what the stage before returned."""
    carry = dict(feeds)
    outs = []
    with torch.no_grad():
        for st in plan.stages:
            values = st.module(*[carry[n].clone() for n in st.inputs])
            if isinstance(values, torch.Tensor):
                values = (values,)
            if len(values) != len(st.outputs):
                raise CisError(
                    f"stage plan: stage {st.index} returned {len(values)} tensors; expected {len(st.outputs)} "
                    f"{st.outputs}"
                )
            named = dict(zip(st.outputs, values))
            outs.append(named)
            carry = {n: named[n] for n in st.carry}
    return outs


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def _output_diff(name: str, got: np.ndarray, ref: np.ndarray) -> tuple[float, str | None]:
    """(max abs difference of a float output, why a non-float one differs): a float output is compared with
    the tolerance, any other (bool, integer) exactly."""
    if _is_float(got) and _is_float(ref):
        return (float(np.max(np.abs(got - ref))) if got.size else 0.0), None
    if got.shape != ref.shape:
        return 0.0, f"output {name!r} has shape {got.shape}, torch's {ref.shape}"
    if np.array_equal(got, ref):
        return 0.0, None
    wrong = int(np.sum(got != ref))
    return 0.0, f"output {name!r} ({ref.dtype}) differs in {wrong} of {ref.size} values; expected an exact match"


def _argmax_mismatch(reference: np.ndarray, got: np.ndarray, atol: float) -> tuple[int, int]:
    """(decisive mismatches, all mismatches) of the argmax over the last axis."""
    ref_arg, got_arg = reference.argmax(-1), got.argmax(-1)
    differ = ref_arg != got_arg
    if not differ.any():
        return 0, 0
    top2 = np.sort(reference, axis=-1)[..., -2:]
    decisive = differ & ((top2[..., 1] - top2[..., 0]) > atol)
    return int(decisive.sum()), int(differ.sum())


def _check(what: str, diff: float, reference: np.ndarray, got: np.ndarray, atol: float, n: int,
           failures: list[str]) -> dict:
    """One comparison's figures (``diff``: its max abs difference; ``reference``/``got``: the logits);
    a failure line for each bound it breaks."""
    decisive, ties = _argmax_mismatch(reference, got, atol)
    if not diff <= atol:
        failures.append(f"{what} (batch {n}): max abs diff {diff:.3g} > {atol:g}")
    if decisive:
        failures.append(f"{what} (batch {n}): argmax differs on {decisive} of {n} samples")
    return {"max_abs_diff": diff, "argmax_mismatch": decisive, "argmax_ties": ties - decisive}


def verify_stages(
    plan: StagePlan,
    runners: Sequence[StageRunner],
    batches: Mapping[str, Mapping[str, torch.Tensor]],
    atol: float = DEFAULT_ATOL,
) -> dict:
    """Run both checks on every named batch; returns the figures, raises on failure."""
    report: dict = {"atol": atol, "batches": {}, "stage_max_abs_diff": {}, "chain_max_abs_diff": {}}
    failures: list[str] = []
    for label, feeds in batches.items():
        torch_outs = torch_stages(plan, feeds)
        with torch.no_grad():
            full = [_np(t) for t in plan.reference({k: v.clone() for k, v in feeds.items()})]
        n = len(next(iter(feeds.values())))
        entry: dict = {"size": n, "stages": {}, "chain": {}}
        # stage vs torch: each graph on its torch inputs
        carry = {k: _np(v) for k, v in feeds.items()}
        for st, runner, touts in zip(plan.stages, runners, torch_outs):
            got = runner.run({name: carry[name] for name in st.inputs})
            what = f"stage {st.index} vs torch at {label}"
            diff = 0.0
            for name in st.outputs:
                d, exact = _output_diff(name, got[name], _np(touts[name]))
                diff = max(diff, d)
                if exact:
                    failures.append(f"{what} (batch {n}): {exact}")
            entry["stages"][st.index] = _check(what, diff, _np(touts[LOGITS]), got[LOGITS], atol, n, failures)
            report["stage_max_abs_diff"][st.index] = max(report["stage_max_abs_diff"].get(st.index, 0.0), diff)
            carry = {name: _np(touts[name]) for name in st.carry}
        # chain vs full
        logits, _ = run_stages(runners, {k: _np(v) for k, v in feeds.items()})
        for st, ref in zip(plan.stages, full):
            chained = logits[st.exit]
            diff = float(np.max(np.abs(chained - ref))) if chained.size else 0.0
            entry["chain"][st.exit] = _check(
                f"chain vs full model, exit {st.exit}, at {label}", diff, ref, chained, atol, n, failures
            )
            report["chain_max_abs_diff"][st.exit] = max(report["chain_max_abs_diff"].get(st.exit, 0.0), diff)
        report["batches"][label] = entry
    report["max_abs_diff"] = max([*report["stage_max_abs_diff"].values(), *report["chain_max_abs_diff"].values(), 0.0])
    report["passed"] = not failures
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise VerificationError(f"verification failed: {failures[0]}" + more)
    return report
