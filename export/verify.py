"""Check exported stages against torch with onnxruntime on the CPU.

Two checks, each at several batches (batch 1, an odd batch such as 17, and a
batch of validation data):

- *stage vs torch*: stage k's graph fed exactly what torch stage k was fed;
- *chain vs full*: the graphs chained through :func:`cis.stages.run_stages`
  against the full torch model's logits at every exit.

Every output's max absolute difference must stay within ``atol`` (1e-4 for
fp32) and the argmax of the logits must agree; a disagreement counts only
where torch's top two logits differ by more than ``atol`` (an exact tie may go
either way). A failed check raises :class:`VerificationError` with the numbers.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from cis.errors import CisError
from cis.stages import LOGITS, StageRunner, run_stages
from training.stage_plan import StagePlan, run_plan

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
            diff = max(float(np.max(np.abs(got[name] - _np(touts[name])))) if got[name].size else 0.0 for name in st.outputs)
            decisive, ties = _argmax_mismatch(_np(touts[LOGITS]), got[LOGITS], atol)
            entry["stages"][st.index] = {"max_abs_diff": diff, "argmax_mismatch": decisive, "argmax_ties": ties - decisive}
            report["stage_max_abs_diff"][st.index] = max(report["stage_max_abs_diff"].get(st.index, 0.0), diff)
            if not diff <= atol:
                failures.append(f"stage {st.index} vs torch at {label} (batch {n}): max abs diff {diff:.3g} > {atol:g}")
            if decisive:
                failures.append(f"stage {st.index} vs torch at {label} (batch {n}): argmax differs on {decisive} of {n} samples")
            carry = {name: _np(touts[name]) for name in st.carry}
        # chain vs full
        logits, _ = run_stages(runners, {k: _np(v) for k, v in feeds.items()})
        for st, ref in zip(plan.stages, full):
            got = logits[st.exit]
            diff = float(np.max(np.abs(got - ref))) if got.size else 0.0
            decisive, ties = _argmax_mismatch(ref, got, atol)
            entry["chain"][st.exit] = {"max_abs_diff": diff, "argmax_mismatch": decisive, "argmax_ties": ties - decisive}
            report["chain_max_abs_diff"][st.exit] = max(report["chain_max_abs_diff"].get(st.exit, 0.0), diff)
            if not diff <= atol:
                failures.append(f"chain vs full model, exit {st.exit}, at {label} (batch {n}): max abs diff {diff:.3g} > {atol:g}")
            if decisive:
                failures.append(f"chain vs full model, exit {st.exit}, at {label} (batch {n}): argmax differs on {decisive} of {n} samples")
        report["batches"][label] = entry
    report["max_abs_diff"] = max([*report["stage_max_abs_diff"].values(), *report["chain_max_abs_diff"].values(), 0.0])
    report["passed"] = not failures
    if failures:
        raise VerificationError(f"verification failed: {failures[0]}" + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""))
    return report
