"""The one method registry: torch-free, every method (cis included) built by one dispatch, defaults once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cis.core.errors import CisError
from cis.training.methods import registry


def test_the_registry_and_the_cli_parser_import_no_torch():
    code = (
        "import sys, cis.training.methods.registry, cis.cli.main; cis.cli.main.build_parser(); "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cis_is_a_method_like_the_others():
    assert registry.METHODS[0] == "cis" and registry.family_of("cis") == "cis"
    assert {registry.family_of(m) for m in registry.EARLY_EXIT_METHODS} == {"early-exit"}
    assert {registry.family_of(m) for m in registry.NESTED_METHODS} == {"nested"}
    pytest.importorskip("torch")
    from cis.training.builders import BUILDERS

    assert set(BUILDERS) == set(registry.FAMILIES)


def test_defaults_come_from_the_schema_only():
    opts = registry.method_options("flame", grouping="full")
    assert opts["grouping"] == "full" and opts["group_step"] == registry.OPTIONS["group_step"].default
    assert opts["eval_patience"] == registry.FLAME_EVAL_PATIENCE
    assert registry.method_options("reefl")["arch"] == "vit"  # not reefl's option: the schema default
    assert registry.resolve_options("cis", None) is None
    with pytest.raises(CisError, match="not an option of method 'reefl'"):
        registry.method_options("reefl", grouping="full")


def test_the_torch_code_knows_every_choice_the_registry_offers():
    pytest.importorskip("torch")
    from cis.training.methods.resnet import LAYOUTS

    assert set(LAYOUTS) == set(registry.NESTED_LAYOUTS)
    assert registry.OPTIONS["layout"].choices == registry.NESTED_LAYOUTS


def test_flame_aggregation_takes_the_papers_names_and_the_old_one():
    """Issue 7 names FLAME's variants FedAvg, patience-conscious, exit-conscious, exit-based."""
    from cis.training.methods.registry import OPTIONS, resolve_options

    option = OPTIONS["flame_aggregation"]
    assert option.choices == ("fedavg", "patience-conscious", "exit-conscious", "exit-based")
    assert option.coerce("patience-conscious") == option.coerce("patience") == "patience-conscious"
    assert resolve_options("flame", {"flame_aggregation": "patience"})["flame_aggregation"] == "patience-conscious"
    with pytest.raises(ValueError):
        option.coerce("patient")
