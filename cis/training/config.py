"""The run configuration of ``cis train``: defaults <- config file (JSON or TOML) <- flags.

Each setting is declared once, as a field of :class:`RunConfig`: its default and, where
its value is constrained, its :class:`Rule` (what it must hold, and the words a one-line
error says it expected). The CLI's flags take their defaults from here; rules that tie
two settings together are :meth:`RunConfig.check_together`.

The resolved config (every default written out) is stored as ``config.json``
in the run directory, so a run documents itself and ``--resume`` reads it back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cis.core.errors import CisError
from cis.core.seeds import is_seed
from cis.core.spec import CONFIDENCE_MEASURES
from cis.core.spec_file import tomllib  # tomli on Python 3.10
from cis.core.topologies import TOPOLOGIES
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
from cis.training.data.data_ref import USER_KINDS, data_kind
from cis.training.methods.registry import (
    METHODS,
    builtin_model_options,
    check_user_model,
    check_vit_width,
    resolve_options,
)

# Per-dataset training defaults. CIFAR: the paper's (SGD 0.1 cosine, momentum 0.9,
# wd 5e-4, batch 128, crop+flip). Digits (~1.3k training images, 8x8): our choice,
# tuned so paper-7 reaches > 90 % final-exit accuracy in a few seconds; one thread,
# because intra-op threading costs more than it gains on a model this small.
# Where training runs and its optional autocast (cis/training/device.py implements them).
# Not part of what a run computes on the CPU: --resume may move a run to another device.
DEVICES = ("auto", "cpu", "cuda")
AMP_MODES = ("off", "bf16")
MEMORY_FORMATS = ("contiguous", "channels_last")  # the model's tensors: NCHW, or NHWC (faster convolutions on GPUs)
GRAPH_MODES = ("off", "on")  # on: each local step's forward and backward replayed as a CUDA graph

DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": {
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "batch_size": 32,
        "augment": False,
        "rounds": 30,
        "threads": 1,
    },
    "cifar10": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 128, "augment": True, "rounds": 100},
    "cifar100": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 128, "augment": True, "rounds": 100},
}
# The user's data (--data PATH.npz | DIR | hf:DIR | PATH.py:FACTORY): digits' SGD settings, torch's threads, no
# augmentation.
USER_DATA_DEFAULTS: dict[str, Any] = {
    "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 32, "augment": False, "rounds": 30,
}
DATASET_DEFAULTS.update({kind: USER_DATA_DEFAULTS for kind in USER_KINDS})
# cis/training/data/partition.py: the layer shares, or "node": the data's own node column
PARTITIONS = ("equal", "biased", "highly-biased", "node")


@dataclass(frozen=True)
class Rule:
    """What a setting may hold: a test of its value and what the error says was expected."""

    holds: Callable[[Any], bool]
    expected: str


def one_of(choices: Sequence[str]) -> Rule:
    return Rule(lambda v: v in choices, " or ".join(repr(c) for c in choices))


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float))


def _is_integer(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def is_device_name(name: str) -> bool:
    """auto, cpu, cuda or cuda:K (cis/training/device.py resolves it)."""
    kind, _, index = str(name).partition(":")
    return kind in DEVICES and (not index or (kind == "cuda" and index.isdigit()))


def _finite(v: Any) -> bool:
    return _is_number(v) and math.isfinite(v)


def _numbers(v: Any, each: Callable[[float], bool]) -> bool:
    """A non-empty list of finite numbers, each passing ``each``."""
    return isinstance(v, list) and bool(v) and all(_finite(x) and each(x) for x in v)


def _rates_hold(rates: Any) -> bool:
    return _numbers(rates, lambda r: r >= 0) and sum(rates) > 0


def _optional(rule: Rule) -> Rule:
    """The rule, or None (the setting's default: unset, or decided from others)."""
    return Rule(lambda v: v is None or rule.holds(v), f"{rule.expected} (or none)")


def _text(expected: str) -> Rule:
    return Rule(lambda v: isinstance(v, str) and bool(v.strip()), expected)


def _table(expected: str) -> Rule:
    return Rule(lambda v: v is None or isinstance(v, dict), expected)


POSITIVE = Rule(lambda v: _finite(v) and v > 0, "a finite positive number")
NON_NEGATIVE = Rule(lambda v: _finite(v) and v >= 0, "a finite number >= 0")
COUNT = Rule(lambda v: _is_integer(v) and v >= 1, "an integer >= 1")
COUNT_OR_NONE = Rule(lambda v: v is None or COUNT.holds(v), COUNT.expected)
FRACTION = Rule(lambda v: _finite(v) and 0 < v <= 1, "a fraction in (0, 1]")
POSITIVE_OR_NONE = Rule(lambda v: v is None or POSITIVE.holds(v), "a finite positive number (or none)")
SEED = Rule(is_seed, "an integer in 0..2**32-1")
BOOL = Rule(lambda v: isinstance(v, bool), "true or false")
PATH = _optional(_text("a path (a string)"))
TEXT = _optional(_text("a string"))
# explicit Lambda~; sigma_e; the p matrix's rows (its shape is the spec's, checked when the run is built)
WEIGHT_VECTOR = _optional(Rule(lambda v: _numbers(v, lambda x: x >= 0) and sum(v) > 0,
                               "a list of finite numbers >= 0, one per exit, with a positive sum"))
SIGMA = _optional(Rule(lambda v: _numbers(v, lambda x: x > 0), "a list of finite positive numbers, one per exit"))
P_MATRIX = _optional(Rule(lambda v: isinstance(v, list) and bool(v) and all(_numbers(r, lambda x: 0 <= x <= 1)
                                                                            for r in v),
                          "a list of rows (one per node) of probabilities in [0, 1], one per exit"))
# Algorithm 1's knobs -> their value where they change nothing: another method, or centralised (no aggregation)
ALGORITHM1_KNOBS = {"p_rule": "paper", "p_mode": "divide", "coefficient_rule": "literal", "bn_rule": "convex",
                    "lower_exit_steps": "same"}
SIGMA_STRATEGIES = ("balanced-adj", "balanced-ramp")  # the strategies that read sigma


def setting(default: Any = None, rule: Rule | None = None) -> Any:
    """A field of :class:`RunConfig`: its one default and, where the value is constrained, its rule."""
    return field(default=default, metadata={"rule": rule} if rule else {})


@dataclass
class RunConfig:
    # "cis" (Algorithm 1) or another paper's method (cis/training/methods/registry.py)
    method: str = setting("cis", Rule(lambda v: v in METHODS, "one of " + ", ".join(METHODS)))
    # the method's options (--option KEY=VALUE); defaults filled when resolved
    options: dict[str, Any] | None = setting(None, _table("a table of method options"))
    # a user's model: PATH.py:FACTORY or pkg.module:FACTORY (cis/training/models/model_ref.py); None: the method's
    # built-in
    model: str | None = setting(None, _optional(Rule(lambda v: isinstance(v, str) and ":" in v,
                                                     "PATH.py:FACTORY or pkg.module:FACTORY")))
    # --model-arg KEY=VALUE: the factory's keyword arguments
    model_args: dict[str, Any] | None = setting(None, _table("a table of the factory's keyword arguments"))
    # the model's source file when the run started (cis train records it)
    model_sha256: str | None = setting(None, TEXT)
    # pkg.module:FACTORY: the sys.path folder it was imported from (cis train records it)
    model_root: str | None = setting(None, PATH)
    # --weights FILE: starting weights, a state dict (cis/training/weights_file.py)
    weights_file: str | None = setting(None, PATH)
    # --weights-prefix PREFIX: stripped from the file's tensor names first
    weights_prefix: str | None = setting(None, TEXT)
    # --allow-model-change: rebuild from a model file changed since the run
    allow_model_change: bool = setting(False, BOOL)
    dataset: str = setting("digits", _text("a data reference (digits, cifar10:PATH, PATH.npz, DIR, hf:DIR, "
                                           "PATH.py:FACTORY)"))
    spec: str | None = setting(None, PATH)  # path of a spec TOML; None: a built-in topology under `serving`
    topology: str = setting("paper-7", one_of(tuple(TOPOLOGIES)))
    serving: str = setting("33-33-33", _text("shares served at exits 1, 2, 3 joined by '-', such as 80-15-5"))
    # the evidence: docs/training.md, "When inference-aware weighting pays" (issue 44)
    strategy: str = setting("auto", one_of(STRATEGIES))
    # explicit Lambda~ (strategy "explicit"; given without a strategy, it means explicit: make_config)
    weights: list[float] | None = setting(None, WEIGHT_VECTOR)
    rounds: int | None = setting(None, COUNT)
    seed: int = setting(0, SEED)
    # layer shares (equal, biased, highly-biased; a list of shares in a config file) or "node": the data's node column
    partition: str | list[float] = setting("equal", Rule(lambda v: v in PARTITIONS or _numbers(v, lambda x: x >= 0),
                                                         " or ".join(map(repr, PARTITIONS)) + " or a list of shares"))
    dirichlet: float | None = setting(None, POSITIVE_OR_NONE)
    # one model on the pooled data, exit losses weighted by the strategy's Lambda~ (cis/training/centralised.py)
    centralised: bool = setting(False, Rule(lambda v: isinstance(v, bool), "true or false"))
    # Algorithm 1 as printed, or "authors-code": as arodio/FedCIS runs it (docs/training.md)
    algorithm: str = setting("printed", one_of(ALGORITHMS))
    p: float = setting(0.0, Rule(lambda v: _is_number(v) and 0 <= v <= 1, "a probability in [0, 1]"))
    p_rule: str = setting("paper", one_of(P_RULES))  # "paper": p per lower exit; "code": p/(E_i-1) per lower exit
    p_matrix: list[list[float]] | None = setting(None, P_MATRIX)
    # "divide" by p_ie (printed; the default) or "multiply" (authors-code's, its only one)
    p_mode: str | None = setting(None, one_of(P_MODES))
    # line 12 as written; "capped" or "self-normalised" (cis/training/aggregation/line12.py)
    coefficient_rule: str = setting("literal", one_of(COEFFICIENT_RULES))
    # BatchNorm statistics: "convex" (printed's default) or "literal" (authors-code's only)
    bn_rule: str | None = setting(None, one_of(BN_RULES))
    # "same" J for every exit, or "flops": J * flops(E_i) / flops(e) for a lower exit
    lower_exit_steps: str = setting("same", one_of(STEP_RULES))
    # authors-code only: a non-root pair's exit-head update "applied" (default) or dropped as the released code does
    head_update: str = setting("applied", one_of(HEAD_UPDATES))
    participation: float = setting(1.0, FRACTION)
    width: float = setting(1.0, POSITIVE)
    lr: float | None = setting(None, POSITIVE)
    momentum: float | None = setting(None, NON_NEGATIVE)
    weight_decay: float | None = setting(None, NON_NEGATIVE)
    batch_size: int | None = setting(None, COUNT)
    local_epochs: float = setting(1.0, POSITIVE)
    local_steps: int | None = setting(None, COUNT_OR_NONE)
    schedule: str = setting("cosine", one_of(("cosine", "constant")))
    # the local steps' optimizer: momentum SGD, or AdamW (torch's; lr and weight_decay as given) for transformers
    optimizer: str = setting("sgd", one_of(OPTIMIZERS))
    clip_grad_norm: float | None = setting(None, POSITIVE_OR_NONE)  # each step's gradients clipped to this norm
    augment: bool | None = setting(None, _optional(BOOL))
    server_lr: float = setting(1.0, POSITIVE)
    sigma: list[float] | None = setting(None, SIGMA)  # balanced-adj: per-exit gradient std; None: measured
    sigma_batches: int = setting(50, Rule(lambda v: _is_integer(v) and v >= 2, "an integer >= 2 (a variance needs "
                                                                              "two mini-batches)"))
    # None: the spec's measure
    confidence: str | None = setting(None, Rule(lambda v: v is None or v in CONFIDENCE_MEASURES,
                                                " or ".join(map(repr, CONFIDENCE_MEASURES)) + " (or none: the spec's)"))
    eval_every: int = setting(1, COUNT)
    checkpoint_every: int = setting(1, COUNT)
    # samples held out of train for validation, which calibrates the thresholds (None: the data's default)
    val_size: int | None = setting(None, Rule(lambda v: v is None or COUNT.holds(v), "an integer >= 1 (or none: the "
                                              "data's default); the validation split calibrates the thresholds"))
    # a seeded subset of the training split (reduced-scale benchmarks)
    train_subset: int | None = setting(None, COUNT_OR_NONE)
    threads: int | None = setting(None, COUNT_OR_NONE)
    # auto (cuda when torch sees a GPU) | cpu | cuda | cuda:K
    device: str = setting("auto", Rule(is_device_name, f"one of {', '.join(DEVICES)} or cuda:K"))
    amp: str = setting("off", one_of(AMP_MODES))  # off | bf16: the local steps under torch.autocast(bfloat16)
    # how a run computes, not what (cis/training/device.py; --resume may change them, like device):
    memory_format: str = setting("contiguous", one_of(MEMORY_FORMATS))  # channels_last: conv weights NHWC
    cuda_graphs: str = setting("off", one_of(GRAPH_MODES))  # on: steps as CUDA graphs (cis/training/graphs.py)
    # a run dir whose weights start the model: a fine-tune (cis/training/warm_start.py)
    init: str | None = setting(None, PATH)
    # where exit_rates were measured (cis train --rates-from SOURCE; cis.runtime.measure)
    rates_from: str | None = setting(None, TEXT)
    # measured Lambda_e per exit: the weights' serving rates, not the calculus
    exit_rates: list[float] | None = setting(
        None, _optional(Rule(_rates_hold, "a list of requests/s per exit, finite, >= 0 with a positive sum"))
    )

    @property
    def dataset_name(self) -> str:
        """The data's kind: digits, cifar10, cifar100, or the user's npz, images, hf, factory (data/data_ref.py)."""
        return data_kind(self.dataset)

    def resolved(self) -> RunConfig:
        """Fill the per-dataset defaults (the settings given are checked against their rules first)."""
        self.check_rules(given_only=True)
        d = DATASET_DEFAULTS[self.dataset_name]
        out = RunConfig(**asdict(self))
        for k, v in d.items():
            if getattr(out, k) is None:
                setattr(out, k, v)
        out.options = resolve_options(out.method, out.options)
        authors = out.algorithm == "authors-code"
        if out.p_mode is None:
            out.p_mode = "multiply" if authors else "divide"
        if out.bn_rule is None:
            out.bn_rule = "literal" if authors else "convex"
        out.validate()
        return out

    def validate(self) -> None:
        """Every setting against its rule, then :meth:`check_together`; the first that fails is one line."""
        self.check_rules()
        self.check_together()

    def check_rules(self, given_only: bool = False) -> None:
        """Each setting against its rule (``given_only``: those not None, before the defaults are filled)."""
        for f in fields(self):
            rule, value = f.metadata.get("rule"), getattr(self, f.name)
            if rule is not None and not (given_only and value is None) and not rule.holds(value):
                raise self._bad(f.name, rule.expected)

    def check_together(self) -> None:
        """The rules that tie settings together: the authors' code has one aggregation; p is Algorithm 1's; a
        user's model goes with the methods that take one; one source of starting weights."""
        self._check_model()
        self._check_algorithm()
        if (self.optimizer != "sgd" or self.clip_grad_norm is not None) and self.method not in OPTIMIZER_METHODS:
            raise CisError(
                f"config: --optimizer / --clip-grad-norm go with method {', '.join(OPTIMIZER_METHODS)}; method "
                f"{self.method!r} has its own local steps" + (" (--option optimizer=adamw)" if self.method == "flame"
                                                              else "")
            )
        if self.cuda_graphs == "on" and self.method != "cis":
            raise self._bad("cuda_graphs", f"'off' for method {self.method!r} (graphs capture Algorithm 1's step)")
        if self.partition == "node" and self.dirichlet is not None:
            raise CisError("config: partition 'node' takes each sample's node from the data; drop dirichlet")
        if self.centralised:
            self._check_centralised()
        if self.method != "cis" and (self.p or self.p_matrix):
            raise CisError(
                f"config: --p / p_matrix sample lower exits in Algorithm 1; method {self.method!r} chooses its own "
                "sub-models"
            )
        if self.method != "cis":
            self._check_knobs(f"method {self.method!r} (it samples and aggregates its own way)")
        self._check_weighting()

    def _check_model(self) -> None:
        """A user's model goes with the methods that take one, its arguments with it, and not the options that
        size the built-in one; one source of starting weights."""
        if self.model is not None:
            check_user_model(self.method)
            if sized := builtin_model_options(self.options):
                raise CisError(f"config: option {sized[0]}={(self.options or {})[sized[0]]!r} sizes the method's "
                               "built-in model; --model trains yours (drop the option)")
        else:
            check_vit_width(self.method, self.options or {}, self.width, self.dataset_name == "digits")
        if self.model_args and self.model is None:
            raise CisError("config: --model-arg (model_args) goes with --model PATH.py:FACTORY")
        if self.weights_file is not None and self.init is not None:
            raise CisError("config: --weights and --init both give starting weights; expected one of them")
        if self.weights_prefix is not None and self.weights_file is None:
            raise CisError("config: --weights-prefix goes with --weights FILE (it is stripped from the file's names)")

    def _check_algorithm(self) -> None:
        """The authors' code multiplies by p_ce, takes line 12's coefficients and literal BatchNorm; the printed
        algorithm applies every exit-head update."""
        if self.algorithm == "authors-code":
            if self.method != "cis":
                raise CisError(f"config: algorithm 'authors-code' is Algorithm 1's; method {self.method!r} has its own")
            for key, only in (("p_mode", "multiply"), ("coefficient_rule", "literal"), ("bn_rule", "literal")):
                if getattr(self, key) != only:
                    raise self._bad(key, f"{only!r} under algorithm 'authors-code' (the authors' code has no other)")
        elif self.head_update != "applied":
            raise self._bad("head_update", "'applied' under algorithm 'printed' (released-code is authors-code's)")

    def _check_centralised(self) -> None:
        """--centralised trains the early-exit model of Algorithm 1 on pooled data: no partition, no exit sampling."""
        if self.method != "cis":
            raise CisError(f"config: centralised trains method 'cis' (weighted exit losses), not {self.method!r}")
        if self.partition == "node":
            raise self._bad("partition", "layer shares with centralised (one model on the pooled data, no nodes)")
        for key, neutral in (("algorithm", "printed"), ("dirichlet", None), ("p", 0.0), ("p_matrix", None),
                             ("participation", 1.0)):
            if getattr(self, key) != neutral:
                raise self._bad(key, f"{neutral!r} with centralised (one model on the pooled data, no nodes)")
        self._check_knobs("centralised (one model on the pooled data: no exit sampling, no aggregation)")

    def _check_knobs(self, where: str) -> None:
        """Algorithm 1's sampling, line-12 and local-step knobs (--p-rule, --p-mode, --coefficient-rule, --bn-rule,
        --lower-exit-steps) change nothing elsewhere: another value than their neutral one is refused."""
        for key, neutral in ALGORITHM1_KNOBS.items():
            if getattr(self, key) != neutral:
                raise CisError(f"config: --{key.replace('_', '-')} (field {key!r}) {getattr(self, key)!r} is "
                               f"Algorithm 1's and would be ignored with {where}; expected {neutral!r} (or drop it)")

    def _check_weighting(self) -> None:
        """The strategy and the settings it reads: explicit's vector, balanced-adj's sigma, each with its own."""
        if self.strategy == "explicit" and self.weights is None:
            raise CisError("config: strategy 'explicit' weights the exits by your vector; expected --exit-weights "
                           "a,b,c (key 'weights', one weight per exit)")
        if self.weights is not None and self.strategy != "explicit":
            raise CisError(f"config: --exit-weights (key 'weights') {self.weights} go with strategy 'explicit' "
                           f"(their default without a strategy); strategy {self.strategy!r} would ignore them")
        if self.sigma is not None and self.strategy not in SIGMA_STRATEGIES:
            raise CisError(f"config: 'sigma' is the per-exit gradient std of {' and '.join(SIGMA_STRATEGIES)}; "
                           f"strategy {self.strategy!r} would ignore it")

    def _bad(self, key: str, expected: str) -> CisError:
        return CisError(f"config: field {key!r} is {getattr(self, key)!r}; expected {expected}")

    def to_json(self) -> dict:
        return asdict(self)


def declared_default(key: str) -> Any:
    """A setting's one default (None: the dataset's, :data:`DATASET_DEFAULTS`, or resolved from others)."""
    return {f.name: f.default for f in fields(RunConfig)}[key]


def config_keys() -> set[str]:
    return {f.name for f in fields(RunConfig)}


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CisError(f"{path}: config file not found; expected a JSON or TOML file of train settings")
    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CisError(f"{path}: cannot parse ({exc})") from None
    if not isinstance(data, dict):
        raise CisError(f"{path}: expected a table of train settings")
    unknown = sorted(set(data) - config_keys())
    if unknown:
        raise CisError(f"{path}: unknown key {unknown[0]!r}; expected some of {', '.join(sorted(config_keys()))}")
    return data


def make_config(file_values: dict | None = None, overrides: dict | None = None) -> RunConfig:
    """defaults <- file values <- overrides (None values in overrides are ignored). A weight vector given without a
    strategy (file or flag) means strategy ``explicit``."""
    values = {**(file_values or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if values.get("weights") is not None and "strategy" not in values:
        values["strategy"] = "explicit"
    try:
        return RunConfig(**values).resolved()
    except TypeError as exc:
        raise CisError(f"config: {exc}") from None
