"""Other papers' methods as pieces of the one federated engine, and their models.

- :mod:`cis.training.methods.registry`: every method and its options (torch-free: the CLI reads it);
- :mod:`cis.training.methods.vit`: a small early-exit ViT (per-exit heads or ReeFL's Ree);
- :mod:`cis.training.methods.ree`: the Ree module and the shared classifier;
- :mod:`cis.training.methods.distill`: ReeFL's best-exit self-distillation and the baselines' KD terms;
- :mod:`cis.training.methods.flame`: FLAME's sample-adaptive training (patience exits, grouped backprop);
- :mod:`cis.training.methods.baselines`: DepthFL, InclusiveFL, ExclusiveFL and ScaleFL pieces (their aggregation
  rules are in :mod:`cis.training.aggregation`);
- :mod:`cis.training.methods.nested`, ``slicing``, ``subfl``, ``widthfl``, ``slt``: the nested (width/depth
  scaled) methods.

Importing this package imports nothing: the architectures are named in
:mod:`cis.training.architectures`, not registered as a side effect.
"""
