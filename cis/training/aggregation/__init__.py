"""The aggregation wing: every way a round's local models become the next global model, in one place.

    line12.py       Algorithm 1's server update as pure functions: the pair coefficients c_ie (as printed,
                    capped, self-normalised), the weighted sum of differences, BatchNorm's convex rule, the
                    projection; and the authors' code's aliased update (the root's model as reference)
    averages.py     the per-entry weighted averages of the other methods: one accumulator
                    (SelectionAverage) for holds-masks (ReeFL, FLAME, the early-exit baselines) and
                    selections (the nested methods' ring average); each rule's per-client term
    weights.py      the aggregation weights Lambda~ (``--strategy``: equal, flops, serving-rate,
                    balanced-adj, the ramps, explicit, auto)
    aggregators.py  the engine's streaming form of the rules, one client at a time: CisAggregator,
                    AuthorsCodeAggregator, MaskedAggregator, SubsetAggregator

The engine's one call that runs them is :meth:`cis.training.federated.FederatedEngine.aggregate_round`, which
the Flower strategy uses too. The wing imports no method, engine or Flower module (an import contract
in pyproject.toml): methods hand it their terms, it never reaches into them.
"""
