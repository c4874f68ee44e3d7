"""The cloud node of a cis bundle as a KServe model: ``kserve.Model`` running its ONNX stages with onnxruntime.

    .venv-kserve/bin/python -m bench.peers.kserve_cis --bundle BUNDLE --http_port 8080 [--model_name cis]

KServe's ``ModelServer`` serves it over the Open Inference Protocol (``POST /v2/models/cis/infer``), one
worker, gRPC off. The model's input is ``input`` (FP32, stage 1's shape); it answers ``class``,
``confidence`` and ``exit`` per sample (:class:`node_stages.NodeStages`, what ``cis serve --node cloud``
computes). Runs in its own environment (``scripts/peers_setup.sh``: kserve pins its own fastapi and uvicorn).
"""

from __future__ import annotations

import argparse
import uuid

import kserve  # noqa: E402  (parses its own flags from sys.argv: --http_port, --workers, ...)
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse  # noqa: E402

from bench.peers.node_stages import OUTPUT_TYPES, NodeStages  # noqa: E402


class CisStages(kserve.Model):
    def __init__(self, name: str, bundle: str, node: str):
        super().__init__(name)
        self.bundle, self.node = bundle, node
        self.load()

    def load(self) -> bool:
        self.stages = NodeStages(self.bundle, self.node)
        self.ready = True
        return self.ready

    async def predict(self, payload, headers=None, response_headers=None) -> InferResponse:
        assert isinstance(payload, InferRequest)
        out = self.stages(payload.inputs[0].as_numpy())
        outputs = [InferOutput(k, list(v.shape), OUTPUT_TYPES[k], v.tolist()) for k, v in out.items()]
        return InferResponse(payload.id or str(uuid.uuid4()), self.name, outputs)  # KServe needs an id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--node", default="cloud")
    ap.add_argument("--model_name", default="cis")
    ap.add_argument("--http_port", type=int, default=8080)
    args, _ = ap.parse_known_args()
    model = CisStages(args.model_name, args.bundle, args.node)
    kserve.ModelServer(http_port=args.http_port, enable_grpc=False, workers=1).start([model])


if __name__ == "__main__":
    main()
