"""``cis train --init RUN``: a run that starts from an earlier run's weights (a fine-tune).

The new run takes the earlier run's settings (its config.json; its spec.toml as the spec),
except the rounds and where it computes; flags and a config file override them, but not the
data split (dataset, seed, val_size): the earlier run's test samples must stay unseen. The
global model starts from the earlier run's checkpoint; every node's optimizer and learning-rate
schedule start afresh over the new rounds (a smaller ``--lr`` suits a fine-tune).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cis.core.errors import CisError
from cis.training.checkpoint import load_checkpoint, read_json
from cis.training.config import RunConfig
from cis.training.federated import FederatedEngine

STARTED_FROM = ("weights_file", "weights_prefix", "allow_model_change")  # how the earlier run itself started
NOT_INHERITED = ("rounds", "init", "rates_from", "exit_rates", "device", "spec", *STARTED_FROM)
DATA_SPLIT = ("dataset", "seed", "val_size")  # what the earlier run's test numbers rest on


def inherited_config(init: str | Path) -> dict[str, Any]:
    """The earlier run's settings a fine-tune starts from (its spec.toml as ``spec``)."""
    run = Path(init)
    config, spec = run / "config.json", run / "spec.toml"
    if not config.is_file() or not spec.is_file():
        raise CisError(f"--init {init}: no config.json and spec.toml; expected a run dir written by 'cis train'")
    out = {k: v for k, v in read_json(config).items() if k not in NOT_INHERITED}
    return {**out, "spec": str(spec.resolve()), "init": str(run.resolve())}


def check_data_split(inherited: dict[str, Any], given: dict[str, Any], init: str | Path) -> None:
    """Refuse settings that would move the earlier run's data split."""
    defaults = RunConfig().to_json()
    for k in DATA_SPLIT:
        if k in given and given[k] != inherited.get(k, defaults[k]):
            raise CisError(
                f"--init {init}: --{k.replace('_', '-')} {given[k]!r} differs from the run's "
                f"{inherited.get(k, defaults[k])!r}; a fine-tune keeps its data split (its test samples stay unseen)"
            )


def warm_start(engine: FederatedEngine, config: RunConfig, log: Callable[[str], None]) -> None:
    """Load ``config.init``'s weights into the engine's global model (same method and architecture)."""
    assert config.init is not None
    model, meta, _ = load_checkpoint(config.init, config.allow_model_change)
    method = str(meta.get("method", "cis"))
    if method != config.method:
        raise CisError(f"--init {config.init}: a {method} run; this run trains {config.method}")
    mine = engine.model.config()
    if model.config() != mine:
        theirs = model.config()
        key = next(k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
        raise CisError(
            f"--init {config.init}: its model has {key} = {theirs.get(key)!r}, this run's {mine.get(key)!r}; "
            "expected the same architecture (keep the run's method, width and options)"
        )
    engine.start_from(model.state_dict())
    log(f"starting from the weights of {config.init} (round {meta.get('round')} of its {meta.get('rounds')})")
