"""One builder per method family of the registry (:data:`cis.training.methods.registry.FAMILIES`), named in
:data:`cis.training.builders.BUILDERS`.

    algorithm1.py   --method cis: the dataset's early-exit CNN, ExitSampler, ExitSGDTrainer, CisAggregator
    early_exit.py   ReeFL, DepthFL, InclusiveFL, ExclusiveFL, ScaleFL, FLAME: a ViT (or the CNN), the
                    baselines' choosers and trainers, MaskedAggregator
    nested.py       NeFL, SLT, HeteroFL, FjORD, FedRolex, FD, small model: a NestedNet, the device models
                    and SubsetTrainer, SubsetAggregator

Each has ``model_config(config, options, num_exits, train)`` (the config of its built-in model, which
:func:`cis.training.models.model_ref.build_model` builds; a user's ``--model`` replaces it where the method allows) and
``build_pieces(config, spec, model, clients, sgd, options, weights_for, log)``;
:func:`cis.training.builders.build_method_setup` calls them. A builder builds down: registry options in, model
configs (cis/training/architectures.py), trainers (cis/training/local.py, cis/training/methods/) and aggregators
(cis/training/aggregation/) out.
"""
