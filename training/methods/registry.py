"""``cis train --method NAME``: the methods, their options, and the engine pieces they build.

    method  family       model                               pieces
    cis     Algorithm 1  the dataset's early-exit CNN         training/run.py builds them itself
    reefl, depthfl, inclusivefl, exclusivefl, scalefl, flame
            early exit   ViT (training/methods/vit.py)       training/methods/setup.py
    nefl, slt, heterofl, fjord, fedrolex, fd, small
            nested       NestedNet (training/methods/nested.py) training/methods/subfl.py

Options are ``--option KEY=VALUE`` (or an ``options`` table in the config file);
:data:`OPTIONS` lists every key, the methods it applies to, its type and default.
:func:`resolve_options` checks a method's options and fills its defaults (so the
run's config.json shows every value it used); :func:`build_method_setup` turns a
resolved config into (model, chooser, trainer, aggregator, matrix, weights).

Inference-aware weighting (the CIS paper's point, for every method where it
applies): a client's weight in the methods' per-entry averages is
``Lambda~_e(t) * |S_i|``, ``e`` the exit (sub-model) it trained, ``Lambda~`` the
``--strategy`` weights. ``--strategy equal`` gives back the papers' ``|S_i|``
weighting. FLAME is the exception: every client trains the full model, and
``flame_aggregation`` sets its weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cis.errors import CisError

EARLY_EXIT_METHODS = ("reefl", "depthfl", "inclusivefl", "exclusivefl", "scalefl", "flame")
NESTED_METHODS = ("nefl", "slt", "heterofl", "fjord", "fedrolex", "fd", "small")
METHODS = ("cis", *EARLY_EXIT_METHODS, *NESTED_METHODS)

_EE, _NESTED = EARLY_EXIT_METHODS, NESTED_METHODS
_BOOL = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True, "off": False}


@dataclass(frozen=True)
class Option:
    name: str
    kind: str  # bool | int | float | str | ints | floats
    methods: tuple[str, ...]
    default: Any  # None: decided at build time (see ``help``)
    help: str
    choices: tuple[str, ...] = ()
    optional: bool = False  # None (written "none") is a valid value

    def expected(self) -> str:
        if self.choices:
            what = " | ".join(self.choices)
        else:
            what = {
                "bool": "true | false", "int": "an integer", "float": "a number",
                "ints": "integers separated by commas", "floats": "numbers separated by commas", "str": "a name",
            }[self.kind]
        return what + (" | none" if self.optional else "")

    def coerce(self, value: Any) -> Any:
        """A value from a flag (text) or a config file (typed) -> the option's type; ValueError if it is not one."""
        if self.optional and (value is None or (isinstance(value, str) and value.strip().lower() == "none")):
            return None
        text = value.strip() if isinstance(value, str) else None
        k = self.kind
        if k == "bool":
            if isinstance(value, bool):
                return value
            if text is not None and text.lower() in _BOOL:
                return _BOOL[text.lower()]
        elif k == "int":
            if text is not None:
                return int(text)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                return int(value)
        elif k == "float":
            if text is not None:
                return float(text)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif k == "str":
            if text is not None and (not self.choices or text in self.choices):
                return text
        elif k in ("ints", "floats"):
            cast = int if k == "ints" else float
            items = [v for v in text.split(",") if v.strip()] if text is not None else value
            if isinstance(items, (list, tuple)) and items and not any(isinstance(v, bool) for v in items):
                return [cast(v) for v in items]
        raise ValueError(value)


OPTIONS: dict[str, Option] = {o.name: o for o in (
    # early-exit methods (ViT)
    Option("arch", "str", ("depthfl", "exclusivefl", "flame"), "vit",
           "vit: the small early-exit ViT; cnn: the dataset's early-exit CNN (digits-cnn / resnet18)", ("vit", "cnn")),
    Option("dim", "int", _EE, None, "ViT token width (default 32 digits, 64 CIFAR; scaled by --width)"),
    Option("depth", "int", _EE, None, "ViT blocks (default 3 digits, 6 CIFAR)"),
    Option("heads", "int", _EE, 4, "ViT attention heads"),
    Option("patch", "int", _EE, None, "ViT patch side (default 2 digits, 4 CIFAR)"),
    Option("mlp_ratio", "float", _EE, 2.0, "ViT MLP width / token width"),
    Option("vit_exits", "ints", _EE, None, "blocks after which the exits sit (default: evenly spaced, one per spec exit)", optional=True),
    Option("distill", "bool", ("reefl", "depthfl"), True, "self-distillation (ReeFL best-exit KD, DepthFL mutual KD)"),
    Option("kd_ramp_rounds", "int", ("reefl", "depthfl"), 300,
           "rounds over which the distillation weight ramps up, exp(-5 (1 - min(r, R)/R)^2) (the notes: R = 300 of 1k rounds)"),
    Option("modulation", "bool", ("reefl",), True, "ReeFL feature modulation (the carried CLS token is Ree's output)"),
    Option("clip_value", "float", ("reefl", "depthfl", "exclusivefl"), None,
           "clip gradients by value (the ReeFL paper: 1, for every method it compares)", optional=True),
    Option("patience", "ints", ("flame",), None, "FLAME training patience per client, cycled (default Setting A 2,2,3,3,4,4,5,5,6,6)", optional=True),
    Option("grouping", "str", ("flame",), "exit", "FLAME grouped backpropagation", ("exit", "full", "random", "binary", "distant", "close")),
    Option("group_step", "str", ("flame",), "share",
           "FLAME group update: share (group mean loss x |group|/b; a batch moves one SGD step) or mean (the paper's Algorithm 2 literally)",
           ("share", "mean")),
    Option("optimizer", "str", ("flame",), "sgd",
           "FLAME local optimizer: sgd (the config's momentum SGD) or adamw (the paper's; betas 0.9/0.999, eps 1e-8, the config's lr and weight decay)",
           ("sgd", "adamw")),
    Option("flame_aggregation", "str", ("flame",), "fedavg", "FLAME aggregation rule", ("fedavg", "patience", "exit-conscious", "exit-based")),
    # nested methods (NestedNet)
    Option("layout", "str", _NESTED, None, "residual network (default digits for digits, resnet20 for CIFAR)", ("digits", "resnet20", "resnet56")),
    Option("gammas", "floats", _NESTED, None, "parameter ratio of sub-models 1..E (default k/E)", optional=True),
    Option("nefl_mode", "str", ("nefl",), "WD", "NeFL scaling: W (width), D (depth, step sizes), WD (both)", ("W", "D", "WD")),
    Option("nefl_init", "str", ("nefl",), "D", "NeFL step-size init: D (1 per kept block) or D0 (skipped blocks' steps added)", ("D", "D0")),
    Option("learn_steps", "bool", ("nefl",), True, "NeFL: learn the step sizes (false: fixed, the paper's N/L)"),
    Option("tiers", "str", _NESTED, "fixed", "fixed: a node trains its tier's sub-model; dynamic: it picks among E_i-spread..E_i each round", ("fixed", "dynamic")),
    Option("tier_spread", "int", _NESTED, 1, "dynamic tiers: how many smaller sub-models a node may pick"),
    Option("budgets", "floats", ("slt", "fedrolex", "fd"), None, "channel keep-ratio s of tiers 1..E (default: the sub-models' own ratios)", optional=True),
)}


def options_of(method: str) -> list[Option]:
    return [o for o in OPTIONS.values() if method in o.methods]


def check_method(method: Any) -> str:
    if method not in METHODS:
        raise CisError(f"config: field 'method' is {method!r}; expected one of {', '.join(METHODS)}")
    return method


def resolve_options(method: str, given: dict[str, Any] | None) -> dict[str, Any] | None:
    """The method's options with defaults filled; one-line CisError for unknown keys or bad values."""
    check_method(method)
    if given is not None and not isinstance(given, dict):
        raise CisError(f"config: field 'options' is {given!r}; expected a table of method options")
    given = dict(given or {})
    known = {o.name: o for o in options_of(method)}
    for key in given:
        if key not in known:
            if not known:
                raise CisError(f"option {key!r}: method {method!r} takes no options")
            raise CisError(f"option {key!r}: not an option of method {method!r}; expected one of {', '.join(known)}")
    if not known:
        return None
    out = {}
    for name, opt in known.items():
        if name not in given or (given[name] is None and opt.default is None):  # None default: decided at build time
            out[name] = opt.default
            continue
        try:
            out[name] = opt.coerce(given[name])
        except (ValueError, TypeError):
            raise CisError(f"option {name}={given[name]!r}: expected {opt.expected()} ({opt.help})") from None
        if opt.kind in ("int", "ints") and out[name] is not None and min(np.atleast_1d(out[name])) < 1:
            raise CisError(f"option {name}={given[name]!r}: expected positive integers ({opt.help})")
        if opt.kind in ("float", "floats") and out[name] is not None and min(np.atleast_1d(out[name])) <= 0:
            raise CisError(f"option {name}={given[name]!r}: expected positive numbers ({opt.help})")
    return out


def parse_option_flags(items: Sequence[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> {key: text}; the method checks keys and values."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CisError(f"--option {item!r}: expected KEY=VALUE, e.g. --option nefl_mode=W")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


# ---------------------------------------------------------------- building


@dataclass
class MethodSetup:
    model: Any
    chooser: Any
    trainer: Any
    aggregator: Any
    matrix: np.ndarray  # the exit (sub-model) each node trains, as a sampling matrix
    weights: Any  # training.strategies.Weights


WeightsFor = Callable[[Any, np.ndarray], Any]
"""(model, matrix) -> Weights: the run's ``--strategy`` weights for this model."""


def method_model(config, num_exits: int, train) -> Any:
    """The model a method trains for a dataset (shape and classes from the data), ``num_exits`` exits."""
    import torch

    from training.architectures import build_model
    from training.models import default_model_config

    opts = config.options or {}
    torch.manual_seed(config.seed)
    in_channels, size = int(train.x.shape[1]), int(train.x.shape[2])
    if config.method in NESTED_METHODS:
        from training.methods.nested import LAYOUTS
        from training.methods.subfl import subset_model

        if opts["gammas"] is not None and len(opts["gammas"]) != num_exits:
            raise CisError(f"option gammas: {len(opts['gammas'])} values; expected one parameter ratio per sub-model (E = {num_exits})")
        base = LAYOUTS[opts["layout"] or ("digits" if config.dataset_name == "digits" else "resnet20")]
        layout = dataclasses.replace(
            base, in_channels=in_channels, input_size=size, num_classes=train.num_classes,
            channels=tuple(max(2, round(c * config.width)) for c in base.channels),
        )
        return subset_model(
            config.method, layout, num_exits, opts["gammas"], opts.get("nefl_mode", "WD"), opts.get("nefl_init", "D"),
            opts.get("learn_steps", True),
        )
    from training.methods.setup import method_model_config

    if opts.get("arch", "vit") == "cnn":
        base = default_model_config(config.dataset_name, config.width)
        base.update(num_classes=train.num_classes, in_channels=in_channels, input_size=size)
        if len(base["exits"]) != num_exits:
            raise CisError(f"option arch=cnn: the {base['arch']} model has {len(base['exits'])} exits; the spec has {num_exits}")
    else:
        digits = config.dataset_name == "digits"
        heads = opts["heads"]
        dim = opts["dim"] or (32 if digits else 64)
        dim = max(heads, round(dim * config.width / heads) * heads)
        depth = opts["depth"] or (3 if digits else 6)
        exits = opts["vit_exits"] or [round(depth * k / num_exits) for k in range(1, num_exits + 1)]
        if len(exits) != num_exits or len(set(exits)) != num_exits or min(exits) < 1:
            raise CisError(f"ViT: {num_exits} exits in {depth} blocks; expected depth >= {num_exits} or option vit_exits with {num_exits} blocks")
        base = {
            "arch": "vit", "exits": list(exits), "num_classes": train.num_classes, "in_channels": in_channels,
            "input_size": size, "patch": opts["patch"] or (2 if digits else 4), "dim": dim, "depth": depth,
            "heads": heads, "mlp_ratio": opts["mlp_ratio"],
        }
        if config.method == "reefl":
            base["modulation"] = bool(opts["modulation"])
    return build_model(method_model_config(config.method, base))


def build_method_setup(config, spec, train, clients, sgd: dict, weights_for: WeightsFor, log: Callable[[str], None]) -> MethodSetup:
    """Model and engine pieces of ``config.method`` (not "cis") for the spec's nodes (``clients``)."""
    try:
        model = method_model(config, spec.num_exits, train)
        if config.method in NESTED_METHODS:
            return _nested(config, model, clients, sgd, weights_for, log)
        return _early_exit(config, model, clients, sgd, weights_for, log)
    except ValueError as exc:  # the methods' own checks of user input
        raise CisError(f"--method {config.method}: {exc}") from None


def _early_exit(config, model, clients, sgd, weights_for, log) -> MethodSetup:
    from training.methods.distill import RAMP_ROUNDS
    from training.methods.setup import MethodOptions, build_method
    from training.sampling import sampling_matrix

    o = config.options or {}
    opts = MethodOptions(
        participation=config.participation, distill=o.get("distill", True), modulation=o.get("modulation", True),
        patience=o.get("patience"), grouping=o.get("grouping", "exit"), group_step=o.get("group_step", "share"),
        optimizer=o.get("optimizer", "sgd"),
        flame_aggregation=o.get("flame_aggregation", "fedavg"), clip_value=o.get("clip_value"),
        kd_ramp_rounds=o.get("kd_ramp_rounds", RAMP_ROUNDS),
    )
    chooser, trainer, aggregator = build_method(config.method, model, clients, sgd, opts)
    E = model.num_exits
    exits = [E if config.method == "flame" else c.max_exit for c in clients]
    matrix = sampling_matrix(exits, E, 0.0)
    weights = weights_for(model, matrix)
    if config.method == "flame":
        log(f"flame: the {opts.flame_aggregation!r} aggregation rule sets the clients' weights; --strategy {config.strategy} is recorded but not applied")
    else:
        aggregator = InferenceAware(aggregator, weights)
    return MethodSetup(model, chooser, trainer, aggregator, matrix, weights)


def _nested(config, model, clients, sgd, weights_for, log) -> MethodSetup:
    from training.methods.subfl import build_subset_method, nefl_tiers, tier_matrix

    o = config.options or {}
    E = model.num_exits
    allowed = None
    if o["tiers"] == "dynamic":
        allowed = nefl_tiers([c.max_exit for c in clients], E, o["tier_spread"])
    budgets = o.get("budgets")
    if budgets is not None and len(budgets) != E:
        raise CisError(f"option budgets: {len(budgets)} values; expected one channel keep-ratio per tier (E = {E})")
    matrix = tier_matrix(allowed or [[c.max_exit] for c in clients], E)
    weights = weights_for(model, matrix)
    chooser, trainer, aggregator = build_subset_method(
        config.method, model, clients, sgd, config.participation, allowed, budgets,
        weight=lambda c, k, t: float(weights.at(t)[k - 1]) * c.size,  # nodes serving more requests weigh more
    )
    if config.method == "slt":
        trainer.device.plan(model)  # a budget the planner cannot meet fails now, not in round 1
    return MethodSetup(model, chooser, trainer, aggregator, matrix, weights)


class InferenceAware:
    """Wraps a per-entry averaging aggregator (``.weight(client, exit)``): client weight Lambda~_e(t) |S_i|."""

    def __init__(self, inner, weights) -> None:
        self.inner, self.weights = inner, weights
        self._lam = weights.at(1)
        inner.weight = lambda client, exit: float(self._lam[exit - 1]) * client.size

    def begin(self, global_state, round: int, pairs) -> None:
        self._lam = self.weights.at(round)
        self.inner.begin(global_state, round, pairs)

    def add(self, client, exit: int, local_state) -> None:
        self.inner.add(client, exit, local_state)

    def finish(self, global_state) -> None:
        self.inner.finish(global_state)
