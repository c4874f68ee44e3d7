"""Early-exit methods from other papers, as pieces of the one federated engine.

- :mod:`training.methods.vit`: a small early-exit ViT (per-exit heads or ReeFL's Ree);
- :mod:`training.methods.ree`: the Ree module and the shared classifier;
- :mod:`training.methods.distill`: ReeFL's best-exit self-distillation and the baselines' KD terms;
- :mod:`training.methods.flame`: FLAME's sample-adaptive training (patience exits, grouped backprop);
- :mod:`training.methods.aggregate`: the methods' aggregation rules as pure functions and engine aggregators;
- :mod:`training.methods.baselines`: DepthFL, InclusiveFL, ExclusiveFL and ScaleFL pieces.

Importing this package registers the ``vit`` architecture with :func:`training.models.build_model`.
"""

from training.methods import vit  # noqa: F401  (registers the architecture)
