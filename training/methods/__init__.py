"""Other papers' methods as pieces of the one federated engine, and their models.

- :mod:`training.methods.registry`: every method and its options (torch-free: the CLI reads it);
- :mod:`training.methods.vit`: a small early-exit ViT (per-exit heads or ReeFL's Ree);
- :mod:`training.methods.ree`: the Ree module and the shared classifier;
- :mod:`training.methods.distill`: ReeFL's best-exit self-distillation and the baselines' KD terms;
- :mod:`training.methods.flame`: FLAME's sample-adaptive training (patience exits, grouped backprop);
- :mod:`training.methods.baselines`: DepthFL, InclusiveFL, ExclusiveFL and ScaleFL pieces (their aggregation
  rules are in :mod:`training.aggregation`);
- :mod:`training.methods.nested`, ``slicing``, ``subfl``, ``widthfl``, ``slt``: the nested (width/depth
  scaled) methods.

Importing this package imports nothing: the architectures are named in
:mod:`training.architectures`, not registered as a side effect.
"""
