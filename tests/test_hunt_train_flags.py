"""`cis train`'s settings found by a hunt to be taken without a rule, or taken and ignored: each is refused in one
line (what, and what was expected) before anything trains or is written."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest
from test_hunt_training import refused  # one helper: cis train refused in one line, nothing written

from cis.core.errors import CisError
from cis.training.config import RunConfig, make_config
from cis.training.methods.registry import resolve_options


def config_error(file_values: dict | None = None, overrides: dict | None = None) -> str:
    with pytest.raises(CisError) as exc:
        make_config(file_values, overrides)
    return str(exc.value)


# ---------------------------------------------------------------- item 1: float options finite


@pytest.mark.parametrize(
    ("method", "option", "value", "expected"),
    [
        ("reefl", "clip_value", "nan", "finite"),
        ("reefl", "mlp_ratio", "inf", "finite"),
        ("nefl", "gammas", "inf,0.5,1", "(0, 1]"),
        ("slt", "budgets", "inf,0.5,1", "(0, 1]"),
        ("fedrolex", "budgets", "nan,0.5,1", "(0, 1]"),
        ("fedrolex", "budgets", "2,0.5,1", "(0, 1]"),  # above 1: clamped to the full width before
        ("nefl", "gammas", "0.5,1.5,1", "(0, 1]"),
    ],
)
def test_float_options_are_finite_and_ratios_at_most_one(method, option, value, expected):
    with pytest.raises(CisError, match=rf"option {option}=.*expected .*{re.escape(expected)}"):
        resolve_options(method, {option: value})


def test_a_nan_option_is_one_line_before_training(tmp_path, run_cli):
    err = refused(run_cli, tmp_path / "run", "--method", "reefl", "--option", "clip_value=nan")
    assert "clip_value" in err and "finite" in err


# ---------------------------------------------------------------- item 5 (and 9a): every field has a rule


def test_every_config_field_has_a_rule():
    assert [f.name for f in fields(RunConfig) if "rule" not in f.metadata] == []


@pytest.mark.parametrize(
    "values",
    [
        {"sigma": 5, "strategy": "balanced-adj"},
        {"sigma": ["a", 2, 1], "strategy": "balanced-adj"},
        {"sigma": [1, 2, float("inf")], "strategy": "balanced-adj"},
        {"weights": 5, "strategy": "explicit"},
        {"weights": ["a", 2, 1]},
        {"p_matrix": [["a", 0, 1]]},
        {"p_matrix": 5},
        {"spec": 5},
        {"init": 5},
        {"augment": "yes"},
        {"dataset": 5},
        {"topology": 5},
        {"serving": 5},
        {"strategy": 5},
        {"p_rule": "bogus"},
        {"allow_model_change": "yes"},
        {"exit_rates": [1, float("inf"), 1]},
        {"partition": ["a", 1]},
        {"val_size": 0},
        {"sigma_batches": 1},
    ],
)
def test_a_config_field_of_the_wrong_kind_is_one_line_naming_it(values):
    key = next(iter(values))
    err = config_error(values)
    assert f"field {key!r}" in err and "expected" in err, err


def test_a_bad_field_in_a_config_file_is_one_line(tmp_path, run_cli):
    for values in ({"sigma": 5, "strategy": "balanced-adj"}, {"spec": 5}, {"val_size": 0}):
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(values))
        key = next(k for k in values if k != "strategy")
        assert f"field {key!r}" in refused(run_cli, tmp_path / "run", "--config", cfg)


# ---------------------------------------------------------------- item 7: weights, sigma and their strategy


def test_a_weight_vector_without_a_strategy_means_explicit():
    assert make_config({"weights": [1, 2, 3]}).strategy == "explicit"
    assert make_config(None, {"weights": [1.0, 2.0, 3.0]}).strategy == "explicit"
    assert make_config({"weights": [1, 2, 3], "strategy": "explicit"}).weights == [1, 2, 3]


def test_weights_or_sigma_with_a_strategy_that_ignores_them_are_refused(tmp_path, run_cli):
    assert "explicit" in config_error({"weights": [1, 2, 3]}, {"strategy": "serving-rate"})
    err = refused(run_cli, tmp_path / "run", "--strategy", "serving-rate", "--exit-weights", "1,2,3")
    assert "--exit-weights" in err and "'serving-rate'" in err
    for strategy in ("auto", "serving-rate", "flops", "equal"):
        assert "sigma" in config_error({"sigma": [0.1, 0.2, 0.3], "strategy": strategy})
    for strategy in ("balanced-adj", "balanced-ramp"):
        assert make_config({"sigma": [0.1, 0.2, 0.3], "strategy": strategy}).sigma == [0.1, 0.2, 0.3]


def test_explicit_without_a_vector_names_the_flag_and_the_key(tmp_path, run_cli):
    err = refused(run_cli, tmp_path / "run", "--strategy", "explicit")
    assert "--exit-weights" in err and "'weights'" in err and "None" not in err


# ---------------------------------------------------------------- item 8: knobs and options that change nothing

KNOBS = [("coefficient_rule", "capped"), ("bn_rule", "literal"), ("p_mode", "multiply"),
         ("lower_exit_steps", "flops"), ("p_rule", "code")]


@pytest.mark.parametrize("method", ["reefl", "nefl", "flame", "depthfl"])
@pytest.mark.parametrize(("key", "value"), KNOBS)
def test_algorithm1_knobs_are_refused_with_another_method(method, key, value):
    err = config_error(None, {"method": method, key: value})
    assert f"--{key.replace('_', '-')}" in err and repr(method) in err


@pytest.mark.parametrize(("key", "value"), KNOBS)
def test_algorithm1_knobs_are_refused_with_centralised(key, value):
    assert f"--{key.replace('_', '-')}" in config_error(None, {"centralised": True, key: value})


def test_the_knobs_at_their_defaults_pass_with_any_method():
    make_config(None, {"method": "reefl", "coefficient_rule": "literal", "bn_rule": "convex", "p_mode": "divide"})
    make_config(None, {"centralised": True, "p_rule": "paper", "lower_exit_steps": "same"})


def test_a_knob_with_another_method_is_one_line(tmp_path, run_cli):
    assert "--bn-rule" in refused(run_cli, tmp_path / "run", "--method", "reefl", "--bn-rule", "literal")


@pytest.mark.parametrize(
    ("method", "options", "named"),
    [
        ("depthfl", {"arch": "cnn", "dim": 64}, "dim"),
        ("flame", {"arch": "cnn", "vit_exits": "1,2,3"}, "vit_exits"),
        ("nefl", {"tier_spread": 2}, "tier_spread"),
        ("nefl", {"nefl_mode": "W", "nefl_init": "D0"}, "nefl_init"),
        ("reefl", {"dim": 30}, "dim"),
    ],
)
def test_an_option_another_option_makes_a_no_op_is_refused(method, options, named):
    with pytest.raises(CisError, match=rf"option {named}="):
        resolve_options(method, options)


def test_more_heads_than_the_vits_channels_is_refused():
    assert "heads=64" in config_error(None, {"method": "reefl", "options": {"heads": 64}})
    assert "heads=8" in config_error(None, {"method": "reefl", "width": 0.125, "options": {"heads": 8}})
    make_config(None, {"method": "reefl", "options": {"heads": 8}})  # 32 channels: 8 heads of 4
    make_config(None, {"method": "reefl", "width": 0.1})  # the defaults: --width's documented rounding


def test_built_in_model_options_with_a_model_of_your_own_are_refused():
    err = config_error(None, {"method": "depthfl", "model": "m.py:make", "options": {"depth": 4}})
    assert "depth=4" in err and "--model" in err
    assert "arch=" in config_error(None, {"method": "flame", "model": "m.py:make", "options": {"arch": "cnn"}})


def test_dropped_options_are_one_line_from_the_cli(tmp_path, run_cli):
    err = refused(run_cli, tmp_path / "run", "--method", "nefl", "--option", "tier_spread=2")
    assert "tier_spread" in err and "tiers=dynamic" in err


# ---------------------------------------------------------------- item 12: balanced-adj's variance


def test_balanced_adj_with_one_mini_batch_says_it_needs_two(tmp_path, run_cli):
    err = refused(run_cli, tmp_path / "run", "--strategy", "balanced-adj", "--batch-size", "2000")
    assert "at least 2 mini-batches" in err and "--batch-size" in err and "sigma [0.0" not in err


def test_balanced_ramp_errors_name_balanced_ramp(tmp_path, run_cli):
    err = refused(run_cli, tmp_path / "run", "--strategy", "balanced-ramp", "--batch-size", "1000")
    assert "--strategy balanced-ramp" in err
    err = refused(run_cli, tmp_path / "run", "--strategy", "balanced-ramp", "--method", "nefl")
    assert "--strategy balanced-ramp" in err and "balanced-adj" not in err
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"sigma": [1.0, 2.0], "strategy": "balanced-ramp"}))
    err = refused(run_cli, tmp_path / "run", "--config", cfg)
    assert "'balanced-ramp'" in err and "balanced-adj" not in err
