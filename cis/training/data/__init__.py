"""Data for training: what ``--data REF`` names (:mod:`~cis.training.data.data_ref`, torch-free), the
readers of each source kind (:mod:`~cis.training.data.sources`, :mod:`~cis.training.data.images`), the
data set as the trainer holds it (:mod:`~cis.training.data.dataset`), loading the splits
(:mod:`~cis.training.data.loading`), and spreading them over the spec's nodes
(:mod:`~cis.training.data.partition`; a run's nodes with their data: :mod:`cis.training.clients`)."""
