"""What one cis node computes for a client's request, as a plain function for the single-model servers.

KServe's and MLServer's models (``kserve_cis.py``, ``mlserver_cis.py``) serve the cloud node of a cis bundle
alone: a request entering it at stage 1 runs the node's stages (stages 1..3 at the root of paper-7) with
onnxruntime (:class:`cis.core.stages.runner.StageRunner`, one thread per session as ``cis serve``'s default) and is
answered with the root's decision (:meth:`cis.core.policy.exit_policy.ExitPolicy.batch`: the class and the confidence
at its
exit), exactly what ``cis serve BUNDLE --node cloud`` answers. Needs cis's core and onnxruntime, no torch.
"""

from __future__ import annotations

import numpy as np

from cis.core.bundle import load_bundle  # noqa: E402
from cis.core.stages.contract import INPUT  # noqa: E402
from cis.core.stages.runner import StageRunner, run_stages  # noqa: E402


class NodeStages:
    """Stages 1..exit of ``node`` and its exit decision: ``__call__(x)`` gives class, confidence, exit."""

    def __init__(self, bundle_dir: str, node: str = "cloud", threads: int = 1):
        bundle = load_bundle(bundle_dir)  # every sha256 checked, as a cis node does
        assert bundle.spec is not None and bundle.policy is not None, f"{bundle_dir}: a bundle with spec and policy"
        me = bundle.spec.node(node)
        self.exit, self.node = me.exit, node
        self.runners = [StageRunner(bundle, k, threads=threads) for k in bundle.stages_for_node(node)]
        self.decision = bundle.policy.batch(node, me.exit, me.parent is None)

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        logits, _ = run_stages(self.runners, {INPUT: np.ascontiguousarray(x, dtype=np.float32)})
        v = self.decision.verdict(logits[self.exit])
        n = len(v.cls)
        return {"class": v.cls.astype(np.int64), "confidence": v.conf.astype(np.float32),
                "exit": np.full(n, self.exit, np.int32)}  # fmt: skip


OUTPUT_TYPES = {"class": "INT64", "confidence": "FP32", "exit": "INT32"}  # the Open Inference Protocol's names
