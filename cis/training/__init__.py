"""Training (needs torch): data and partitions (:mod:`cis.training.data`), models with exits
(:mod:`cis.training.models`), the federated engine and its pieces, aggregation
(:mod:`cis.training.aggregation`), the other papers' methods (:mod:`cis.training.methods`) and Flower
(:mod:`cis.training.flower`). Nothing below the command layer imports it except the exporter.
"""
