"""A bundle's stages: the contract's names (:mod:`~cis.core.stages.contract`), running them with
onnxruntime (:mod:`~cis.core.stages.runner`) or TensorRT engines (:mod:`~cis.core.stages.tensorrt_engines`),
and which backend a node uses (:mod:`~cis.core.stages.backends`)."""
