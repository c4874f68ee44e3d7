"""The flags of ``cis train``: the run config's fields (one flag each, help told the declared defaults) and
the command's own (method options, where the run comes from and goes, the engine). cis/cli/commands/train.py runs
them."""

from __future__ import annotations

import argparse
from typing import Any

from cis.core.spec import CONFIDENCE_MEASURES
from cis.training.aggregation.weights import STRATEGIES
from cis.training.cis_options import (
    ALGORITHMS,
    BN_RULES,
    COEFFICIENT_RULES,
    HEAD_UPDATES,
    OPTIMIZER_METHODS,
    OPTIMIZERS,
    P_MODES,
    P_RULES,
    STEP_RULES,
)
from cis.training.config import AMP_MODES, DATASET_DEFAULTS, GRAPH_MODES, MEMORY_FORMATS, declared_default
from cis.training.data.partition import SCHEMES
from cis.training.flower.launch import MODES as FLOWER_MODES
from cis.training.methods.registry import METHODS, NEFL_MODES, OPTIONS


def floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, e.g. 0.6,0.3,0.1") from None


# The flags that set the run config's field of the same name. In a help, {default} is the field's one default
# (cis/training/config.py) and {digits} / {cifar} the dataset's (DATASET_DEFAULTS); the choices come from their
# registries (all torch-free).
CONFIG_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--method", {"help": " | ".join(METHODS) + " (default {default}: Algorithm 1)"}),
    ("--model", {
        "metavar": "PATH.py:FACTORY",
        "help": "your early-exit model: a factory in a file or module (PATH.py:FACTORY | pkg.module:FACTORY) "
        "returning (body, head) pairs or an EarlyExitNet; default: the method's built-in (docs/your-model.md)",
    }),
    ("--weights", {
        "dest": "weights_file",
        "metavar": "FILE",
        "help": "starting weights: a state dict (torch.save; loaded with weights_only=True); a partial load says "
        "which tensors are missing and unexpected",
    }),
    ("--weights-prefix", {
        "metavar": "PREFIX",
        "help": "with --weights: strip PREFIX (e.g. model.backbone.) from the file's tensor names before matching",
    }),
    ("--allow-model-change", {
        "action": "store_true",
        "default": None,
        "help": "with --resume / --init: rebuild from a model file that changed since the run (else one line, exit 2)",
    }),
    ("--spec", {"help": "CIS spec (TOML); default: the built-in --topology under --serving"}),
    ("--serving", {"help": "x-y-z shares served at exits 1-2-3 for the built-in topology (default {default})"}),
    ("--topology", {"help": "built-in topology when no --spec (default {default})"}),
    ("--data", {
        "dest": "dataset",
        "aliases": ("--dataset",),
        "metavar": "REF",
        "help": "digits | cifar10:PATH | cifar100:PATH | PATH.npz | DIR (image folder) | hf:DIR | PATH.py:FACTORY | "
        "pkg.module:FACTORY (default {default}; docs/training.md, 'Data')",
    }),
    (
        "--strategy",
        {
            "choices": STRATEGIES,
            "help": "aggregation weights Lambda~ (default {default}; auto = flops where the last exit serves more "
            "than the first, else serving-ramp)",
        },
    ),
    ("--exit-weights", {
        "dest": "weights",
        "type": floats,
        "help": "explicit Lambda~, e.g. 0.6,0.3,0.1 (implies --strategy explicit)",
    }),
    ("--rounds", {"type": int, "help": "communication rounds T (default {digits} digits, {cifar} CIFAR)"}),
    ("--seed", {"type": int, "help": "seed of data split, partition, init and sampling (default {default})"}),
    ("--partition", {
        "choices": ("equal", *SCHEMES, "node"),
        "help": "data per network layer (default {default}), or node: each sample's node from the data's node column",
    }),
    ("--dirichlet", {"type": float, "metavar": "ALPHA", "help": "non-IID classes with Dirichlet(ALPHA)"}),
    ("--centralised", {
        "action": "store_true",
        "default": None,
        "aliases": ("--centralized",),
        "help": "one model on the pooled data, exit losses weighted by --strategy's Lambda~; no nodes, no "
        "aggregation (--rounds of J steps each; docs/training.md, 'Centralised training')",
    }),
    ("--algorithm", {
        "choices": ALGORITHMS,
        "help": "Algorithm 1 as printed (default) or as the authors' public code runs it: the root's model is the "
        "global one, p multiplied, their balanced-adj (docs/training.md)",
    }),
    ("--p", {"type": float, "help": "probability of training each lower exit (paper's ablation; default {default})"}),
    ("--p-rule", {"choices": P_RULES, "help": "paper: p per lower exit; code: p/(E_i-1) per lower exit"}),
    ("--p-mode", {"choices": P_MODES, "help": "divide by p_ie (paper) or multiply (authors' code)"}),
    ("--coefficient-rule", {
        "choices": COEFFICIENT_RULES,
        "help": "line 12's pair coefficients as written (default), capped at 1, or self-normalised per exit",
    }),
    ("--bn-rule", {
        "choices": BN_RULES,
        "help": "BatchNorm running statistics: line 12 shortened where it would overshoot (default), or literal",
    }),
    ("--head-update", {
        "choices": HEAD_UPDATES,
        "help": "authors-code: apply every pair's exit-head update (default {default}), or released-code: drop the "
        "non-root pairs' as arodio/FedCIS's released aggregate() does (a diagnostic; docs/training.md)",
    }),
    ("--lower-exit-steps", {
        "choices": STEP_RULES,
        "help": "local steps when a node trains a lower exit: same J (default) or J x flops(own) / flops(exit)",
    }),
    ("--participation", {"type": float, "help": "fraction of nodes taking part per round (default {default})"}),
    ("--width", {"type": float, "help": "channel width multiplier (default {default})"}),
    ("--lr", {"type": float, "help": "local SGD learning rate (cosine annealed over rounds)"}),
    ("--batch-size", {"type": int}),
    ("--local-epochs", {"type": float, "help": "epochs over the LARGEST node's data per round (default {default})"}),
    ("--local-steps", {"type": int, "help": "J directly (overrides --local-epochs)"}),
    ("--optimizer", {
        "choices": OPTIMIZERS,
        "help": "the local steps' optimizer: sgd (momentum SGD, the papers') or adamw (torch.optim.AdamW with --lr "
        "and the weight decay, e.g. --lr 0.001 for a transformer); methods " + ", ".join(OPTIMIZER_METHODS)
        + " (default {default})",
    }),
    ("--clip-grad-norm", {
        "type": float,
        "metavar": "MAX",
        "help": "clip each local step's gradients to this total norm (torch.nn.utils.clip_grad_norm_); methods "
        + ", ".join(OPTIMIZER_METHODS) + " (default: no clipping)",
    }),
    ("--confidence", {"choices": CONFIDENCE_MEASURES, "help": "confidence measure for evaluation"}),
    ("--threads", {"type": int, "help": "torch threads (default: {digits} for digits, torch's default otherwise)"}),
    ("--device", {
        "metavar": "auto|cpu|cuda",
        "help": "where to train: {default} (default: cuda when torch sees a GPU), cpu, cuda or cuda:K; --resume may "
        "change it (docs/training.md, 'Devices')",
    }),
    ("--amp", {"choices": AMP_MODES, "help": "bf16: local steps under torch.autocast(bfloat16) (default {default})"}),
    ("--memory-format", {
        "choices": MEMORY_FORMATS,
        "help": "channels_last: the model's conv weights NHWC, faster on GPUs (default {default}); --resume may "
        "change it",
    }),
    ("--cuda-graphs", {
        "choices": GRAPH_MODES,
        "help": "on: each local step's forward and backward replayed as a CUDA graph (--device cuda, method cis; "
        "default {default}); --resume may change it",
    }),
    ("--eval-every", {"type": int, "help": "validate every N rounds (default {default})"}),
)
CONFIG_KEYS = tuple(spec.get("dest") or flag[2:].replace("-", "_") for flag, spec in CONFIG_FLAGS)
# settings of where and how a run computes, not of what (and --allow-model-change): --resume may change them
RESUME_MAY_CHANGE = ("device", "memory_format", "cuda_graphs", "allow_model_change")

# The flags of the command itself: the method's named options, where the run comes from and goes, the engine.
COMMAND_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--model-arg", {
        "action": "append",
        "default": [],
        "metavar": "KEY=VALUE",
        "help": "a keyword argument of the --model factory, repeatable; VALUE read as JSON where it parses (4, 0.5, "
        "true, [1, 2]), a comma list as a list, else text",
    }),
    ("--option", {
        "action": "append",
        "default": [],
        "metavar": "KEY=VALUE",
        "help": "a method option, repeatable (see docs/training.md, 'Methods'), e.g. --option layout=resnet20",
    }),
    ("--no-distill", {"action": "store_true", "help": "reefl/depthfl: no self-distillation (option distill=false)"}),
    ("--no-modulation", {"action": "store_true", "help": "reefl: no feature modulation (option modulation=false)"}),
    ("--patience", {"metavar": "P,P,..", "help": "flame: training patience per client, cycled (option patience)"}),
    ("--nefl-mode", {
        "choices": NEFL_MODES,
        "help": f"nefl: width, depth or both (option nefl_mode; default {OPTIONS['nefl_mode'].default})",
    }),
    ("--out", {"help": "run directory"}),
    ("--config", {"help": "JSON or TOML file with train settings (flags override it)"}),
    ("--init", {
        "metavar": "RUN",
        "help": "start from RUN's weights and settings (its spec too): a fine-tune for --rounds more rounds; flags "
        "override its settings but not its data split (dataset, seed, val_size)",
    }),
    ("--rates-from", {
        "metavar": "SOURCE",
        "help": "weight the exits by the serving rates a running CIS measured (a spec: its live nodes; a 'cis serve "
        "--all' log folder; a requests file; a saved measurement) and train for the design (--spec, else --init's) "
        "with the measured arrival rates; docs/closed-loop.md",
    }),
    ("--window", {
        "type": float,
        "metavar": "SECONDS",
        "help": "with --rates-from: live, two snapshots SECONDS apart (default: since the nodes started); a requests "
        "file, its last SECONDS (default: all of it)",
    }),
    ("--resume", {"action": "store_true", "help": "continue RUN_DIR from its last checkpoint"}),
    ("--engine", {
        "choices": ("builtin", "flower"),
        "default": "builtin",
        "help": "builtin (one process, default) or flower (Flower ServerApp + one ClientApp per node; docs/flower.md)",
    }),
    ("--flower-mode", {
        "choices": FLOWER_MODES,
        "help": "flower: simulation engine on this machine, or deployment engine (SuperLink + SuperNodes) "
        "(default: deployment with --flower-superlink or --flower-root-certificates, else simulation)",
    }),
    ("--flower-superlink", {
        "metavar": "HOST:PORT",
        "help": "flower deployment (implied): submit to this running SuperLink (default: start one on loopback); "
        "a non-loopback address needs --flower-root-certificates",
    }),
    ("--flower-root-certificates", {
        "metavar": "PATH",
        "help": "flower deployment (implied), with --flower-superlink: CA certificate for TLS to the SuperLink",
    }),
    ("--measure-grad-variance", {
        "action": "store_true",
        "help": "print the per-exit gradient variance of the initial model (Appendix C) and exit",
    }),
    ("--no-progress", {"action": "store_true", "help": "no progress bar"}),
    ("--stop-after", {"type": int, "help": argparse.SUPPRESS}),  # simulates a kill after round N (tests)
    ("--json", {"action": "store_true", "help": "machine-readable output"}),
)


HELP_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("everyday", "what to train, on what, and where the run goes", (
        "--data", "--model", "--model-arg", "--spec", "--serving", "--topology", "--rounds", "--out", "--weights",
        "--weights-prefix", "--centralised", "--partition", "--seed", "--device", "--resume", "--init", "--config",
        "--allow-model-change", "--no-progress", "--json",
    )),
    ("local steps", "the optimisation every node runs (defaults: the data's; docs/training.md)", (
        "--lr", "--batch-size", "--local-epochs", "--local-steps", "--optimizer", "--clip-grad-norm", "--width",
        "--eval-every", "--threads", "--amp", "--memory-format", "--cuda-graphs",
    )),
    ("methods and the papers' knobs", "other papers' methods, Algorithm 1's variants and ablations "
     "(docs/training.md, docs/methods-nested.md)", (
        "--method", "--option", "--no-distill", "--no-modulation", "--patience", "--nefl-mode", "--strategy",
        "--exit-weights", "--algorithm", "--p", "--p-rule", "--p-mode", "--coefficient-rule", "--bn-rule",
        "--head-update", "--lower-exit-steps", "--participation", "--dirichlet", "--confidence",
        "--measure-grad-variance",
    )),
    ("closed loop", "train for the rates a running CIS measured (docs/closed-loop.md)", ("--rates-from", "--window")),
    ("Flower", "the same Algorithm 1 on Flower's engines (docs/flower.md)", (
        "--engine", "--flower-mode", "--flower-superlink", "--flower-root-certificates",
    )),
)
"""``cis train --help``'s groups, everyday flags first: (title, description, flags)."""


def _default_text(key: str, declared: Any) -> str:
    """A config flag's default as its help shows it: the declared one, else the data's (DATASET_DEFAULTS)."""
    if declared is not None and not isinstance(declared, bool):
        return f"default {declared}"
    if declared is not None or key not in DATASET_DEFAULTS["digits"]:
        return ""
    digits, cifar, yours = (DATASET_DEFAULTS[d].get(key) for d in ("digits", "cifar10", "npz"))
    mine = f"{digits} for digits and your data" if digits == yours else f"{digits} for digits, {yours} for your data"
    return f"default {mine}, {cifar} for CIFAR"


def with_defaults(key: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A config flag's argparse keywords, its help told the declared defaults (``{default}``, ``{digits}``,
    ``{cifar}`` in the text; else appended where the flag has one)."""
    if "help" not in spec:
        spec = {**spec, "help": ""}
    declared = declared_default(key)
    shown = {"default": declared}
    for name, dataset in (("digits", "digits"), ("cifar", "cifar10")):
        shown[name] = DATASET_DEFAULTS[dataset].get(key)
    text = spec["help"].format(**shown)
    default = _default_text(key, declared) if "default" not in text else ""
    if default:
        text = f"{text} ({default})" if text else default
    return {**spec, "help": text}


def _command_help(spec: dict[str, Any]) -> dict[str, Any]:
    """A command flag's keywords, its default appended to its help where it has one and does not say it."""
    default, text = spec.get("default"), spec.get("help")
    if text and text is not argparse.SUPPRESS and isinstance(default, str) and "default" not in text:
        return {**spec, "help": f"{text} (default {default})"}
    return spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``cis train`` on its parser, in the groups of :data:`HELP_GROUPS`."""
    flags: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
    for (flag, spec), key in zip(CONFIG_FLAGS, CONFIG_KEYS):
        keywords = {k: v for k, v in with_defaults(key, spec).items() if k != "aliases"}
        flags[flag] = ((flag, *spec.get("aliases", ())), keywords)
    for flag, spec in COMMAND_FLAGS:
        flags[flag] = ((flag,), _command_help(spec))
    for title, description, names in HELP_GROUPS:
        group = p.add_argument_group(title, description)
        for name in names:
            names_, keywords = flags.pop(name)
            group.add_argument(*names_, **keywords)
    for names_, keywords in flags.values():  # not in a group (--stop-after, a test's): hidden among the options
        p.add_argument(*names_, **keywords)
