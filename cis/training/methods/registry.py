"""The method registry: every ``cis train --method`` and every option, with its default, named once.

    method  family       model                                  built by (cis.training.builders.BUILDERS)
    cis     cis          the dataset's early-exit CNN            cis/training/families/algorithm1.py
    reefl, depthfl, inclusivefl, exclusivefl, scalefl, flame
            early-exit   ViT (cis/training/methods/vit.py)          cis/training/families/early_exit.py
    nefl, slt, heterofl, fjord, fedrolex, fd, small
            nested       NestedNet (cis/training/methods/nested.py) cis/training/families/nested.py

:func:`cis.training.builders.build_method_setup` hands a method to its family's builder, which gives its model's
config (``model_config``) and builds the engine's pieces (``build_pieces``). The methods of
:data:`USER_MODEL_METHODS` also train a user's model (``cis train --model``); the others need their own
architecture (:data:`OWN_ARCHITECTURE` says why, in the one line that refuses ``--model``).

Options are ``--option KEY=VALUE`` (or an ``options`` table in the config file);
:data:`OPTIONS` lists every key, the methods it applies to, its type and its default
(None: decided at build time from the data, as its help says). :func:`resolve_options`
checks a method's options and fills its defaults (so the run's config.json shows every
value it used); :func:`effective_options` adds the defaults of the options that do not
apply to the method, which is what the builders read, so no
default is written anywhere else. The choices the torch modules check (FLAME's groupings,
the nested layouts, ...) are named here too, and they import them from here.

This module needs no torch: the CLI builds its choices from it.

Inference-aware weighting (the CIS paper's point, for every method where it
applies): a client's weight in the methods' per-entry averages is
``Lambda~_e(t) * |S_i|``, ``e`` the exit (sub-model) it trained, ``Lambda~`` the
``--strategy`` weights. ``--strategy equal`` gives back the papers' ``|S_i|``
weighting. FLAME is the exception: every client trains the full model, and
``flame_aggregation`` sets its weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cis.core.errors import CisError

EARLY_EXIT_METHODS = ("reefl", "depthfl", "inclusivefl", "exclusivefl", "scalefl", "flame")
NESTED_METHODS = ("nefl", "slt", "heterofl", "fjord", "fedrolex", "fd", "small")
FAMILIES = {"cis": ("cis",), "early-exit": EARLY_EXIT_METHODS, "nested": NESTED_METHODS}
METHODS = tuple(m for family in FAMILIES.values() for m in family)
USER_MODEL_METHODS = ("cis", "depthfl", "exclusivefl", "flame")
"""Methods that train any early-exit model of the contract (cis/training/models/contract.py): ``cis train --model``."""
_NESTED_OWN = "trains width/depth-sliced sub-models of its own residual network (cis/training/methods/nested.py)"
OWN_ARCHITECTURE = {
    "reefl": "trains its own ViT with Ree, the recurrent early-exit module every exit shares",
    "inclusivefl": "moves weights between the transformer blocks of its own ViT (momentum distillation)",
    "scalefl": "slices the attention heads and MLP units of its own ViT by width",
    **{m: _NESTED_OWN for m in NESTED_METHODS},
}
"""Why a method cannot take a user's model."""

# Choices and constants of the methods, named once (the torch modules import them from here).
VIT_ARCHS = ("vit", "cnn")
FLAME_GROUPINGS = ("exit", "full", "random", "binary", "distant", "close")
FLAME_GROUP_STEPS = ("share", "mean")
FLAME_OPTIMIZERS = ("sgd", "adamw")
FLAME_AGGREGATIONS = ("fedavg", "patience-conscious", "exit-conscious", "exit-based")  # the paper's names
FLAME_ALIASES = (("patience", "patience-conscious"),)  # the name runs recorded before (still read)
FLAME_SETTING_A = (2, 2, 3, 3, 4, 4, 5, 5, 6, 6)  # training patience per client, cycled (the paper's Setting A)
FLAME_EVAL_PATIENCE = 4  # the paper's p_ev at inference
KD_RAMP_ROUNDS = 300  # the notes: R = 300 of the paper's 1k rounds
NESTED_LAYOUTS = ("digits", "resnet20", "resnet56")
NEFL_MODES = ("W", "D", "WD")
NEFL_STEP_INITS = ("D", "D0")
TIER_MODES = ("fixed", "dynamic")
VIT_OPTIONS = ("dim", "depth", "heads", "patch", "mlp_ratio", "vit_exits")  # what sizes the built-in ViT
VIT_DIMS = {"digits": 32, "other": 64}  # the ViT's token width by default (families/early_exit.py: vit_config)
RATIO_OPTIONS = ("gammas", "budgets")  # ratios of the full model: in (0, 1] (a larger one would be clamped to 1)

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
    aliases: tuple[tuple[str, str], ...] = ()  # (another name, the choice it stands for)

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
        text = dict(self.aliases).get(text, text) if text is not None else None
        got = _COERCE[self.kind](value, text, self.choices)
        if got is _NOT:
            raise ValueError(value)
        return got


_NOT = object()  # what a coercer returns for a value that is not of its kind


def _as_bool(value: Any, text: str | None, choices: tuple[str, ...]) -> Any:
    if isinstance(value, bool):
        return value
    return _BOOL[text.lower()] if text is not None and text.lower() in _BOOL else _NOT


def _as_int(value: Any, text: str | None, choices: tuple[str, ...]) -> Any:
    if text is not None:
        return int(text)
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else _NOT


def _as_float(value: Any, text: str | None, choices: tuple[str, ...]) -> Any:
    if text is not None:
        return float(text)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _NOT


def _as_str(value: Any, text: str | None, choices: tuple[str, ...]) -> Any:
    return text if text is not None and (not choices or text in choices) else _NOT


def _as_list(cast: Any) -> Any:
    def coerce(value: Any, text: str | None, choices: tuple[str, ...]) -> Any:
        items = [v for v in text.split(",") if v.strip()] if text is not None else value
        if isinstance(items, (list, tuple)) and items and not any(isinstance(v, bool) for v in items):
            return [cast(v) for v in items]
        return _NOT

    return coerce


_COERCE = {"bool": _as_bool, "int": _as_int, "float": _as_float, "str": _as_str, "ints": _as_list(int),
           "floats": _as_list(float)}
"""An option kind -> (value, its stripped text or None, the choices) -> the value of that kind, or _NOT."""


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        # early-exit methods (ViT)
        Option(
            "arch",
            "str",
            ("depthfl", "exclusivefl", "flame"),
            "vit",
            "vit: the small early-exit ViT; cnn: the dataset's early-exit CNN (digits-cnn / resnet18)",
            VIT_ARCHS,
        ),
        Option("dim", "int", _EE, None, "ViT token width (default 32 digits, 64 CIFAR; scaled by --width)"),
        Option("depth", "int", _EE, None, "ViT blocks (default 3 digits, 6 CIFAR)"),
        Option("heads", "int", _EE, 4, "ViT attention heads"),
        Option("patch", "int", _EE, None, "ViT patch side (default 2 digits, 4 CIFAR)"),
        Option("mlp_ratio", "float", _EE, 2.0, "ViT MLP width / token width"),
        Option(
            "vit_exits",
            "ints",
            _EE,
            None,
            "blocks after which the exits sit (default: evenly spaced, one per spec exit)",
            optional=True,
        ),
        Option(
            "distill", "bool", ("reefl", "depthfl"), True, "self-distillation (ReeFL best-exit KD, DepthFL mutual KD)"
        ),
        Option(
            "kd_ramp_rounds",
            "int",
            ("reefl", "depthfl"),
            KD_RAMP_ROUNDS,
            "rounds over which the distillation weight ramps up, exp(-5 (1 - min(r, R)/R)^2) "
            "(the notes: R = 300 of 1k rounds)",
        ),
        Option(
            "modulation", "bool", ("reefl",), True, "ReeFL feature modulation (the carried CLS token is Ree's output)"
        ),
        Option(
            "clip_value",
            "float",
            ("reefl", "depthfl", "exclusivefl"),
            None,
            "clip gradients by value (the ReeFL paper: 1, for every method it compares)",
            optional=True,
        ),
        Option(
            "patience",
            "ints",
            ("flame",),
            None,
            "FLAME training patience per client, cycled (default Setting A 2,2,3,3,4,4,5,5,6,6)",
            optional=True,
        ),
        Option(
            "eval_patience",
            "int",
            ("flame",),
            FLAME_EVAL_PATIENCE,
            "FLAME patience p_ev of the exported bundle's exit policy (cis export --patience overrides it)",
        ),
        Option("grouping", "str", ("flame",), "exit", "FLAME grouped backpropagation", FLAME_GROUPINGS),
        Option(
            "group_step",
            "str",
            ("flame",),
            "share",
            "FLAME group update: share (group mean loss x |group|/b; a batch moves one SGD step) or mean "
            "(the paper's Algorithm 2 literally)",
            FLAME_GROUP_STEPS,
        ),
        Option(
            "optimizer",
            "str",
            ("flame",),
            "sgd",
            "FLAME local optimizer: sgd (the config's momentum SGD) or adamw (the paper's; betas 0.9/0.999, eps 1e-8, "
            "the config's lr and weight decay)",
            FLAME_OPTIMIZERS,
        ),
        Option("flame_aggregation", "str", ("flame",), "fedavg", "FLAME aggregation rule", FLAME_AGGREGATIONS,
               aliases=FLAME_ALIASES),
        # nested methods (NestedNet)
        Option(
            "layout",
            "str",
            _NESTED,
            None,
            "residual network (default digits for digits, resnet20 for CIFAR)",
            NESTED_LAYOUTS,
        ),
        Option("gammas", "floats", _NESTED, None, "parameter ratio of sub-models 1..E (default k/E)", optional=True),
        Option(
            "nefl_mode", "str", ("nefl",), "WD", "NeFL scaling: W (width), D (depth, step sizes), WD (both)", NEFL_MODES
        ),
        Option(
            "nefl_init",
            "str",
            ("nefl",),
            "D",
            "NeFL step-size init: D (1 per kept block) or D0 (skipped blocks' steps added)",
            NEFL_STEP_INITS,
        ),
        Option("learn_steps", "bool", ("nefl",), True, "NeFL: learn the step sizes (false: fixed, the paper's N/L)"),
        Option(
            "static_bn",
            "bool",
            ("heterofl",),
            True,
            "HeteroFL static BatchNorm: no running statistics while training; after training each sub-model's "
            "own, a cumulative average over the nodes' training data (false: shared running statistics tracked "
            "and averaged while training)",
        ),
        Option(
            "tiers",
            "str",
            _NESTED,
            "fixed",
            "fixed: a node trains its tier's sub-model; dynamic: it picks among E_i-spread..E_i each round",
            TIER_MODES,
        ),
        Option("tier_spread", "int", _NESTED, 1, "dynamic tiers: how many smaller sub-models a node may pick"),
        Option(
            "budgets",
            "floats",
            ("slt", "fedrolex", "fd"),
            None,
            "channel keep-ratio s of tiers 1..E (default: the sub-models' own ratios)",
            optional=True,
        ),
    )
}


def options_of(method: str) -> list[Option]:
    return [o for o in OPTIONS.values() if method in o.methods]


def family_of(method: str) -> str:
    """"cis", "early-exit" or "nested"."""
    return next(f for f, methods in FAMILIES.items() if check_method(method) in methods)


def check_user_model(method: str) -> None:
    """One line where ``method`` needs its own architecture (``cis train --model`` with it)."""
    if check_method(method) not in USER_MODEL_METHODS:
        raise CisError(
            f"--model: method {method!r} {OWN_ARCHITECTURE[method]}; a model of your own trains with "
            f"--method {', '.join(USER_MODEL_METHODS)}"
        )


def check_square_images(input_shape: tuple[int, ...], method: str) -> None:
    """One line where ``method`` (one that trains only its built-in models) meets data that is not square images."""
    if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
        yours = "pass your own model (--model PATH.py:FACTORY, docs/your-model.md)"
        if method not in USER_MODEL_METHODS:
            yours = f"it needs your own model, which --method {', '.join(USER_MODEL_METHODS)} train (your-model.md)"
        raise CisError(
            f"data of shape {input_shape} per sample: --method {method}'s built-in models take square images "
            f"(C, H, W); {yours}"
        )


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
        if out[name] is not None and (expected := _out_of_range(opt, out[name])):
            raise CisError(f"option {name}={given[name]!r}: expected {expected} ({opt.help})")
    _check_together(out)
    return out


def _out_of_range(opt: Option, value: Any) -> str | None:
    """What a coerced number (or list) of ``opt`` must be where it is not; None where it is fine."""
    values = list(np.atleast_1d(value)) if opt.kind in ("int", "ints", "float", "floats") else []
    if opt.kind in ("int", "ints") and min(values) < 1:
        return "positive integers"
    if opt.name in RATIO_OPTIONS and not all(math.isfinite(v) and 0 < v <= 1 for v in values):
        return "ratios in (0, 1] separated by commas, 1 being the full model"
    if opt.kind in ("float", "floats") and not all(math.isfinite(v) and v > 0 for v in values):
        return "a finite positive number" if opt.kind == "float" else "finite positive numbers separated by commas"
    return None


def _changed(options: dict[str, Any], name: str) -> bool:
    """The option is the method's and differs from its default (a value the user chose)."""
    return name in options and options[name] != OPTIONS[name].default


def _check_together(options: dict[str, Any]) -> None:
    """Options that another option's value makes a no-op are refused, one line each, not silently dropped."""
    if options.get("arch") == "cnn" and (sized := [n for n in VIT_OPTIONS if _changed(options, n)]):
        raise CisError(f"option {sized[0]}={options[sized[0]]!r}: sizes the ViT; arch=cnn trains the dataset's CNN "
                       "(drop it, or arch=vit)")
    if options.get("tiers") == "fixed" and _changed(options, "tier_spread"):
        raise CisError(f"option tier_spread={options['tier_spread']!r}: goes with tiers=dynamic; tiers=fixed trains "
                       "each node's own sub-model (add --option tiers=dynamic, or drop it)")
    if options.get("nefl_mode") == "W" and options.get("nefl_init") == "D0":
        raise CisError("option nefl_init='D0': gives skipped blocks' steps to the kept ones; nefl_mode=W skips no "
                       "block (use nefl_mode D or WD, or drop it)")
    dim, heads = options.get("dim"), options.get("heads")
    if options.get("arch", "vit") == "vit" and dim is not None and heads is not None and dim % heads:
        raise CisError(f"option dim={dim}: expected a multiple of heads {heads} (each head takes dim/heads channels)")


def builtin_model_options(options: dict[str, Any] | None) -> list[str]:
    """The options given (not at their defaults) that size a method's built-in model, which ``--model`` replaces."""
    return [n for n in ("arch", *VIT_OPTIONS) if _changed(options or {}, n)]


def check_vit_width(method: str, options: dict[str, Any], width: float, digits: bool) -> None:
    """One line where the heads chosen outnumber the ViT's channels (dim x --width), which would widen dim to heads."""
    if method not in EARLY_EXIT_METHODS or options.get("arch", "vit") != "vit":
        return
    heads, dim = options.get("heads", OPTIONS["heads"].default), options.get("dim")
    base = dim or VIT_DIMS["digits" if digits else "other"]
    if heads > base * width and (dim is not None or _changed(options, "heads")):
        raise CisError(
            f"option heads={heads}: more attention heads than the ViT's {base * width:g} channels (dim {base} x "
            f"--width {width:g}); expected heads <= {max(1, math.floor(base * width))} or a larger dim"
        )


def parse_option_flags(items: Sequence[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> {key: text}; the method checks keys and values."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CisError(f"--option {item!r}: expected KEY=VALUE, e.g. --option nefl_mode=W")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def effective_options(method: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Every option's value for a method: its resolved options, and the schema default of each option
    that does not apply to it (what the method then uses: e.g. ``arch`` is always ``vit`` for reefl)."""
    return {**{name: o.default for name, o in OPTIONS.items()}, **(options or {})}


def method_options(method: str, **given: Any) -> dict[str, Any]:
    """``effective_options`` of ``given`` options, checked and filled (the builders' input, for code and tests)."""
    return effective_options(method, resolve_options(method, given))
