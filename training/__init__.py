"""Training side of cis: datasets and partitions, early-exit models, federated training.

Imports torch; the ``cis`` package never imports this one at module level.
"""
