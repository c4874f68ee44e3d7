"""The choices of Algorithm 1's own run settings, named once and torch-free.

The CLI offers them (cis/cli/commands/train.py), the run config checks them
(cis/training/config.py), and the modules that implement them import them from
here: the algorithm (printed, or the authors' code), the p rules (cis/training/sampling.py),
the p modes, coefficient rules and BatchNorm rules of line 12 (cis/training/aggregation/line12.py), the local-step rule
for lower exits (cis/training/local.py), and the authors' code's exit-head rule
(cis/training/aggregation/aggregators.py).
docs/training.md says what each does.
"""

ALGORITHMS = ("printed", "authors-code")  # Algorithm 1 as printed, or as the authors' public code runs it
P_RULES = ("paper", "code")
P_MODES = ("divide", "multiply")
COEFFICIENT_RULES = ("literal", "capped", "self-normalised")
BN_RULES = ("convex", "literal")
STEP_RULES = ("same", "flops")
# authors-code: a non-root pair's exit-head update is applied (default), or dropped as arodio/FedCIS's released
# aggregate() drops it (it writes head e's difference at classifiers[L_e - 1] but applies classifiers[L_k])
HEAD_UPDATES = ("applied", "released-code")
OPTIMIZERS = ("sgd", "adamw")  # a local step's optimizer: momentum SGD (the papers'), or AdamW (transformers' usual)
OPTIMIZER_METHODS = ("cis", "depthfl", "exclusivefl")  # methods whose local steps take --optimizer, --clip-grad-norm
