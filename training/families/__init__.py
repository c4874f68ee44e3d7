"""One builder per method family of the registry (:data:`training.methods.registry.FAMILIES`), named in
:data:`training.builders.BUILDERS`.

    algorithm1.py   --method cis: the dataset's early-exit CNN, ExitSampler, ExitSGDTrainer, CisAggregator
    early_exit.py   ReeFL, DepthFL, InclusiveFL, ExclusiveFL, ScaleFL, FLAME: a ViT (or the CNN), the
                    baselines' choosers and trainers, MaskedAggregator
    nested.py       NeFL, SLT, HeteroFL, FjORD, FedRolex, FD, small model: a NestedNet, the device models
                    and SubsetTrainer, SubsetAggregator

Each has ``model_config(config, options, num_exits, train)`` (the config of its built-in model, which
:func:`training.reference.build_model` builds; a user's ``--model`` replaces it where the method allows) and
``build_pieces(config, spec, model, clients, sgd, options, weights_for, log)``;
:func:`training.builders.build_method_setup` calls them. A builder builds down: registry options in, model
configs (training/architectures.py), trainers (training/local.py, training/methods/) and aggregators
(training/aggregation/) out.
"""
