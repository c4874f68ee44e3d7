"""The run configuration of ``cis train``: defaults <- config file (JSON or TOML) <- flags.

The resolved config (every default written out) is stored as ``config.json``
in the run directory, so a run documents itself and ``--resume`` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib  # novermin (3.10 takes the tomli fallback below)
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from cis.errors import CisError

# Per-dataset training defaults. CIFAR: the paper's (SGD 0.1 cosine, momentum 0.9,
# wd 5e-4, batch 128, crop+flip). Digits (~1.3k training images, 8x8): our choice,
# tuned so paper-7 reaches > 90 % final-exit accuracy in a few seconds; one thread,
# because intra-op threading costs more than it gains on a model this small.
# Where training runs and its optional autocast (training/device.py implements them).
# Not part of what a run computes on the CPU: --resume may move a run to another device.
DEVICES = ("auto", "cpu", "cuda")
AMP_MODES = ("off", "bf16")

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


@dataclass
class RunConfig:
    method: str = "cis"  # "cis" (Algorithm 1) or another paper's method (training/methods/registry.py)
    options: dict[str, Any] | None = None  # the method's options (--option KEY=VALUE); defaults filled when resolved
    dataset: str = "digits"
    spec: str | None = None  # path of a spec TOML; None: a built-in topology under `serving`
    topology: str = "paper-7"
    serving: str = "33-33-33"
    strategy: str = "serving-rate"
    weights: list[float] | None = None  # explicit Lambda~ (strategy "explicit")
    rounds: int | None = None
    seed: int = 0
    partition: str = "equal"
    dirichlet: float | None = None
    algorithm: str = "printed"  # Algorithm 1 as printed, or "authors-code": as arodio/FedCIS runs it (docs/training.md)
    p: float = 0.0
    p_rule: str = "paper"  # "paper": p per lower exit; "code": p/(E_i-1) per lower exit
    p_matrix: list[list[float]] | None = None
    p_mode: str | None = None  # "divide" by p_ie (printed; the default) or "multiply" (authors-code's, its only one)
    coefficient_rule: str = "literal"  # line 12 as written; "capped" or "self-normalised" (training/aggregation.py)
    bn_rule: str | None = None  # BatchNorm statistics: "convex" (printed's default) or "literal" (authors-code's only)
    lower_exit_steps: str = "same"  # "same" J for every exit, or "flops": J * flops(E_i) / flops(e) for a lower exit
    participation: float = 1.0
    width: float = 1.0
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    batch_size: int | None = None
    local_epochs: float = 1.0
    local_steps: int | None = None
    schedule: str = "cosine"
    augment: bool | None = None
    server_lr: float = 1.0
    sigma: list[float] | None = None  # balanced-adj: per-exit gradient std; None: measured
    sigma_batches: int = 50
    confidence: str | None = None  # None: the spec's measure
    eval_every: int = 1
    checkpoint_every: int = 1
    val_size: int | None = None
    train_subset: int | None = None  # a seeded subset of the training split (reduced-scale benchmarks)
    threads: int | None = None
    device: str = "auto"  # auto (cuda when torch sees a GPU) | cpu | cuda | cuda:K
    amp: str = "off"  # off | bf16: the local steps under torch.autocast(bfloat16)
    init: str | None = None  # a run dir whose weights start the model: a fine-tune (training/warm_start.py)
    rates_from: str | None = None  # where exit_rates were measured (cis train --rates-from SOURCE; cis.measured)
    exit_rates: list[float] | None = None  # measured Lambda_e per exit: the weights' serving rates, not the calculus

    @property
    def dataset_name(self) -> str:
        return self.dataset.partition(":")[0]

    def resolved(self) -> RunConfig:
        """Fill the per-dataset defaults."""
        d = DATASET_DEFAULTS.get(self.dataset_name)
        if d is None:
            raise CisError(f"dataset {self.dataset!r}: unknown, expected 'digits', 'cifar10:PATH' or 'cifar100:PATH'")
        out = RunConfig(**asdict(self))
        for k, v in d.items():
            if getattr(out, k) is None:
                setattr(out, k, v)
        from training.methods.registry import resolve_options

        out.options = resolve_options(out.method, out.options)
        authors = out.algorithm == "authors-code"
        if out.p_mode is None:
            out.p_mode = "multiply" if authors else "divide"
        if out.bn_rule is None:
            out.bn_rule = "literal" if authors else "convex"
        out.validate()
        return out

    def validate(self) -> None:
        def bad(field: str, expected: str) -> CisError:
            return CisError(f"config: field {field!r} is {getattr(self, field)!r}; expected {expected}")

        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise bad("rounds", "an integer >= 1")
        if not 0 < self.participation <= 1:
            raise bad("participation", "a fraction in (0, 1]")
        from training.cis_options import ALGORITHMS, BN_RULES, COEFFICIENT_RULES, P_MODES, STEP_RULES

        if self.algorithm not in ALGORITHMS:
            raise bad("algorithm", " or ".join(repr(a) for a in ALGORITHMS))
        if self.algorithm == "authors-code":
            self._check_authors_code(bad)
        if self.p_mode not in P_MODES:
            raise bad("p_mode", "'divide' or 'multiply'")
        for f, allowed in (
            ("coefficient_rule", COEFFICIENT_RULES),
            ("bn_rule", BN_RULES),
            ("lower_exit_steps", STEP_RULES),
        ):
            if getattr(self, f) not in allowed:
                raise bad(f, " or ".join(repr(a) for a in allowed))
        if self.schedule not in ("cosine", "constant"):
            raise bad("schedule", "'cosine' or 'constant'")
        for f in ("lr", "batch_size", "local_epochs", "server_lr", "width"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise bad(f, "a positive number")
        if self.method != "cis" and (self.p or self.p_matrix):
            raise CisError(
                f"config: --p / p_matrix sample lower exits in Algorithm 1; method {self.method!r} chooses its own "
                "sub-models"
            )
        if self.local_steps is not None and (not isinstance(self.local_steps, int) or self.local_steps < 1):
            raise bad("local_steps", "an integer >= 1")
        kind, _, index = str(self.device).partition(":")
        if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
            raise bad("device", f"one of {', '.join(DEVICES)} or cuda:K")
        if self.amp not in AMP_MODES:
            raise bad("amp", " or ".join(repr(a) for a in AMP_MODES))
        rates = self.exit_rates
        if rates is not None and (
            not isinstance(rates, list)
            or any(isinstance(r, bool) or not isinstance(r, (int, float)) or not r >= 0 for r in rates)
            or not sum(rates) > 0
        ):
            raise bad("exit_rates", "a list of requests/s per exit, >= 0 with a positive sum")

    def _check_authors_code(self, bad) -> None:
        """The authors' code has one aggregation: multiply by p_ce, line 12's coefficients, literal BatchNorm."""
        if self.method != "cis":
            raise CisError(f"config: algorithm 'authors-code' is Algorithm 1's; method {self.method!r} has its own")
        for f, only in (("p_mode", "multiply"), ("coefficient_rule", "literal"), ("bn_rule", "literal")):
            if getattr(self, f) != only:
                raise bad(f, f"{only!r} under algorithm 'authors-code' (the authors' code has no other)")

    def to_json(self) -> dict:
        return asdict(self)


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
    """defaults <- file values <- overrides (None values in overrides are ignored)."""
    values = {**(file_values or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        return RunConfig(**values).resolved()
    except TypeError as exc:
        raise CisError(f"config: {exc}") from None
