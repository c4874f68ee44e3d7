"""Check exported stages against torch with onnxruntime on the CPU.

Two checks, each at several batches (batch 1, an odd batch such as 17, and a
batch of validation data):

- *stage vs torch*: stage k's graph fed exactly what torch stage k was fed;
- *chain vs full*: the graphs chained through :func:`cis.core.stages.runner.run_stages`
  against the full torch model's logits at every exit.

Every output's max absolute difference must stay within ``atol`` (1e-4 for
fp32) and the argmax of the logits must agree; a disagreement counts only
where torch's top two logits differ by more than ``atol`` (an exact tie may go
either way). A failed check raises :class:`VerificationError` with the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from cis.core.errors import CisError
from cis.core.stages.contract import LOGITS
from cis.core.stages.runner import StageRunner, run_stages
from cis.training.models.stage_plan import StagePlan, run_plan

DEFAULT_ATOL = 1e-4
ODD_BATCH = 17  # the odd batch size every check runs at besides 1 (catches batch-dependent shapes)


class VerificationError(CisError):
    """An exported graph does not reproduce its torch counterpart."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


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
        torch_outs = run_plan(plan, feeds)
        with torch.no_grad():
            full = [_np(t) for t in plan.reference(feeds)]
        n = len(next(iter(feeds.values())))
        entry: dict = {"size": n, "stages": {}, "chain": {}}
        # stage vs torch: each graph on its torch inputs
        carry = {k: _np(v) for k, v in feeds.items()}
        for st, runner, touts in zip(plan.stages, runners, torch_outs):
            got = runner.run({name: carry[name] for name in st.inputs})
            diff = max(float(np.max(np.abs(got[name] - _np(touts[name])))) if got[name].size else 0.0
                       for name in st.outputs)
            entry["stages"][st.index] = _check(f"stage {st.index} vs torch at {label}", diff, _np(touts[LOGITS]),
                                               got[LOGITS], atol, n, failures)
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
