"""The cloud node of a cis bundle as an MLServer custom runtime: ``MLModel`` running its ONNX stages.

There is no ONNX runtime for MLServer on the package index (no ``mlserver-onnx``), so this is the custom
runtime an MLServer user writes. ``bench/peers/run.py`` writes a model folder with ``settings.json``
(127.0.0.1, its ports, ``parallel_workers``) and ``model-settings.json`` (``implementation``:
``mlserver_cis.CisStages``; ``parameters.extra``: ``bundle``, ``node``) and starts
``.venv-mlserver/bin/mlserver start FOLDER`` with this folder on ``PYTHONPATH``. The model's input is
``input``; it answers ``class``, ``confidence`` and ``exit`` per sample (:class:`node_stages.NodeStages`).
"""

from __future__ import annotations

from mlserver import MLModel  # noqa: E402
from mlserver.codecs import NumpyCodec  # noqa: E402
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput  # noqa: E402

from bench.peers.node_stages import OUTPUT_TYPES, NodeStages  # noqa: E402


class CisStages(MLModel):
    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        self.stages = NodeStages(extra["bundle"], extra.get("node", "cloud"))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        out = self.stages(NumpyCodec.decode_input(payload.inputs[0]))
        outputs = [ResponseOutput(name=k, shape=list(v.shape), datatype=OUTPUT_TYPES[k], data=v.tolist())
                   for k, v in out.items()]  # fmt: skip
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
