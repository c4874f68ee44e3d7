"""``cis train``: inference-aware federated training (Algorithm 1 of the CIS paper) into a run dir.

``--method NAME`` trains another paper's method with the same engine, data,
partitions and weighting (cis/training/methods/registry.py); its options come from
``--option KEY=VALUE`` (repeatable), an ``options`` table in the config file, and
the named flags ``--no-distill``, ``--no-modulation``, ``--patience``, ``--nefl-mode``.

``--model PATH.py:FACTORY | pkg.module:FACTORY [--model-arg KEY=VALUE ...]`` trains a model of your own
(cis/training/models/contract.py, cis/training/models/model_ref.py; docs/your-model.md) with ``--method`` cis, depthfl,
exclusivefl or flame; ``--weights FILE`` starts it (or a built-in) from a state dict. The run dir records
the reference, its arguments and the file's sha256, so evaluate, export, ``--resume`` and ``--init``
rebuild the model without the flags.

Settings come from defaults <- ``--config FILE`` (JSON or TOML with the keys of
:class:`cis.training.config.RunConfig`) <- flags. ``--resume`` continues RUN_DIR from
its last checkpoint with the config stored there (flags may not change it) and
ends with the same weights as an uninterrupted run.

``--init RUN`` starts from an earlier run's weights and settings (a fine-tune;
cis/training/warm_start.py); ``--rates-from SOURCE`` weights the exits by the serving
rates a running CIS measured (:mod:`cis.runtime.measure`) and trains for the design
updated with the measured arrival rates (docs/closed-loop.md).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cis.cli.commands.train_flags import CONFIG_KEYS, RESUME_MAY_CHANGE, add_arguments, floats
from cis.cli.main import print_result
from cis.core.errors import CisError
from cis.core.spec import load_spec
from cis.training.config import RunConfig, make_config, read_config_file
from cis.training.methods.registry import parse_option_flags, resolve_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="federated training of an early-exit model for a CIS (Algorithm 1)")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags, options = _config_flags(args), _option_flags(args)
    if args.measure_grad_variance:
        return _measure_grad_variance(args, flags, options)
    if not args.out:
        raise CisError("missing --out RUN_DIR; expected a directory for the run")
    from cis.training.run_dir import check_out_folder, discard_unstarted, files_before

    out = Path(args.out)
    check_out_folder(out)  # a file in the way: one line before anything is built
    _check_flags_go_together(args)
    before = files_before(out)  # a new run that fails removes what it wrote, and only that (run_dir.py)
    try:
        config = _resumed_config(args, flags, options) if args.resume else _new_config(args, flags, options)
        result = _train(args, config)
    except CisError:
        if not args.resume:  # --rates-from's files too, written before a later check failed
            discard_unstarted(out, before)
        raise
    if "stopped_after_round" in result:
        print_result(args, result, f"stopped after round {result['stopped_after_round']} (resume with --resume)")
        return 0
    if "run_dir_host" in result:  # submitted to a remote SuperLink: no test report on this machine
        print_result(args, {k: v for k, v in result.items() if k != "human"}, result["human"])
        return 0
    from cis.training.evaluate import format_cis_report

    strategy = config.strategy
    if (chosen := (result.get("weights") or {}).get("auto")) is not None:
        strategy = f"auto: {chosen}"  # what the rule picked for these serving rates
    what = strategy if config.method == "cis" else f"{config.method} ({strategy} weights)"
    if config.centralised:
        what = f"centralised ({strategy} exit-loss weights)"
    human = f"trained {what} for {config.rounds} rounds into {args.out}\n" + format_cis_report(result["test"])
    if config.centralised:
        human += "\n" + centralised_steps_line(result["sgd_steps"])
    print_result(args, result, human)
    return 0


def _check_flags_go_together(args: argparse.Namespace) -> None:
    if args.window is not None and not args.rates_from:
        raise CisError("--window goes with --rates-from SOURCE")
    if args.resume and (args.init or args.rates_from):
        raise CisError("--resume continues a run as it was configured; drop --init and --rates-from")
    flower_flags = [f for f in ("mode", "superlink", "root_certificates") if getattr(args, f"flower_{f}") is not None]
    if flower_flags and args.engine != "flower":
        named = ", ".join("--flower-" + f.replace("_", "-") for f in flower_flags)
        raise CisError(f"{named} goes with --engine flower (this run uses the built-in engine)")


def _train(args: argparse.Namespace, config: RunConfig) -> dict:
    log = (lambda s: None) if args.json else logging.getLogger(__name__).info
    from cis.training.device import run_device

    run_device(config)  # --device cuda without a GPU: one line before the run trains
    return _flower_run(args, config, log) if args.engine == "flower" else _builtin_run(args, config, log)


def centralised_steps_line(steps: dict[str, Any]) -> str:
    """How a centralised run's SGD steps compare with the federated run's at the same flags, and the
    ``--local-steps`` that matches it."""
    fed = steps["federated"]
    said = f"SGD steps: {steps['total']} ({steps['per_round']} a round); the federated run at these flags takes " \
           f"{fed['total']} ({fed['per_round']} a round, every node its own)"
    if steps["per_round"] == fed["per_round"]:
        return said + ": as many"
    return said + f": --local-steps {fed['per_round']} matches it"


def _config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The config settings the flags give (--exit-weights implies --strategy explicit; --spec, --model's file and
    --weights made absolute; --model-arg's values parsed)."""
    flags = {key: getattr(args, key) for key in CONFIG_KEYS if getattr(args, key) is not None}
    if args.model is not None:
        _check_model_method(args)  # a method with its own architecture: said before --model's file is looked for
    if args.weights is not None and "strategy" not in flags:
        flags["strategy"] = "explicit"
    if args.model is not None or args.model_arg:
        from cis.training.models.model_ref import parse_model_args, parse_reference

        if args.model is not None:
            flags["model"] = parse_reference(args.model).text
        if args.model_arg:
            flags["model_args"] = parse_model_args(args.model_arg)
    if args.weights_file is not None:
        flags["weights_file"] = _weights_file(args.weights_file)
    if args.spec is not None:
        load_spec(args.spec)  # a missing, broken or invalid spec: its one line before anything is built
        flags["spec"] = str(Path(args.spec).resolve())
    if args.dataset is not None:  # paths made absolute: evaluate and export rebuild the data from any directory
        from cis.training.data.data_ref import absolute_ref

        flags["dataset"] = absolute_ref(args.dataset)
    return flags


def _check_model_method(args: argparse.Namespace) -> None:
    """One line where --model comes with a method (--method, else the --config file's) that trains its own
    architecture."""
    from cis.training.methods.registry import check_user_model

    method = args.method
    if method is None and args.config:
        method = read_config_file(args.config).get("method")
    if isinstance(method, str):
        check_user_model(method)


def _weights_file(text: str) -> str:
    """--weights FILE made absolute; one line for a missing file (and for the old --weights a,b,c form)."""
    path = Path(text).expanduser()
    if not path.is_file():
        try:
            floats(text)
            hint = "; explicit exit weights are --exit-weights " + text
        except argparse.ArgumentTypeError:
            hint = ""
        raise CisError(f"--weights {text}: file not found; expected a state dict saved with torch.save{hint}")
    return str(path.resolve())


def _measure_grad_variance(args: argparse.Namespace, flags: dict, options: dict) -> int:
    from cis.training.run import measure_grad_variance

    ignored = [f for f, given in (("--out", args.out), ("--resume", args.resume), ("--init", args.init),
               ("--rates-from", args.rates_from), ("--engine flower", args.engine == "flower")) if given]  # fmt: skip
    if ignored:
        raise CisError(f"--measure-grad-variance measures the initial model and trains nothing; drop {ignored[0]}")
    config = make_config(*_with_options(read_config_file(args.config) if args.config else {}, flags, options))
    var = measure_grad_variance(config)
    result: dict[str, Any] = {
        "dataset": config.dataset,
        "width": config.width,
        "grad_variance": var,
        "sigma": [v**0.5 for v in var],
    }
    print_result(
        args,
        result,
        "per-exit gradient variance (Appendix C): "
        + ", ".join(f"exit {e} {v:.5g}" for e, v in enumerate(var, start=1)),
    )
    return 0


def _resumed_config(args: argparse.Namespace, flags: dict, options: dict) -> RunConfig:
    """--resume: the config stored in the run dir; a flag or option that would change it is one line."""
    from cis.training.checkpoint import read_json

    stored_path = Path(args.out) / "config.json"
    if not stored_path.is_file():
        raise CisError(
            f"{args.out}: nothing to resume; expected config.json from an earlier 'cis train --out {args.out}'"
        )
    stored = read_json(stored_path)
    stored.pop("allow_model_change", None)  # a permission of one command, not of the run
    defaults = RunConfig().to_json()  # keys that older runs did not store
    differing = [k for k, v in flags.items() if k not in RESUME_MAY_CHANGE and stored.get(k, defaults.get(k)) != v]
    if differing:
        k = differing[0]
        raise CisError(
            f"--resume: --{k.replace('_', '-')} {flags[k]!r} differs from the run's "
            f"{stored.get(k, defaults.get(k))!r}; a resumed run keeps its config"
        )
    try:
        config = RunConfig(**{**stored, **{k: flags[k] for k in RESUME_MAY_CHANGE if k in flags}}).resolved()
    except TypeError as exc:
        raise CisError(f"{stored_path}: {exc}") from None
    given = (resolve_options(config.method, options) or {}) if options else {}
    for k in options:
        if given[k] != (config.options or {}).get(k):
            raise CisError(
                f"--resume: option {k}={options[k]!r} differs from the "
                f"run's {(config.options or {}).get(k)!r}; a resumed run keeps its config"
            )
    return config


def _new_config(args: argparse.Namespace, flags: dict, options: dict) -> RunConfig:
    """defaults <- --init's run <- --config file <- flags (<- --rates-from's measured rates)."""
    file_values = read_config_file(args.config) if args.config else {}
    if isinstance(file_values.get("model"), str):  # a file's path made absolute, as --model's
        from cis.training.models.model_ref import parse_reference

        file_values["model"] = parse_reference(file_values["model"]).text
    if args.init:
        from cis.training.warm_start import check_data_split, inherited_config

        inherited = inherited_config(args.init)
        check_data_split(inherited, {**file_values, **flags}, args.init)
        model = flags.get("model", file_values.get("model", inherited.get("model")))
        if model != inherited.get("model"):  # another model: the earlier run's arguments and hash are not its
            inherited = {k: v for k, v in inherited.items() if k not in ("model_args", "model_sha256", "model_root")}
        if "strategy" in flags or "strategy" in file_values:  # a new strategy: the run's vector and sigma were its
            inherited = {k: v for k, v in inherited.items() if k not in ("weights", "sigma")}
        file_values = {**inherited, **file_values}
    values = {**file_values, **flags}
    _check_built_in_flags(flags, values)
    from cis.training.run_dir import check_foreign_files, check_inputs_apart, check_out_outside_data

    check_inputs_apart(Path(args.out), {  # the run would overwrite them: one line before anything is written
        "spec file": values.get("spec"), "--config file": args.config, "--rates-from source": args.rates_from,
        "--weights file": values.get("weights_file"),
    })
    check_foreign_files(Path(args.out))
    check_out_outside_data(Path(args.out), values.get("dataset"))
    if not args.rates_from:
        return make_config(*_with_options(file_values, flags, options))
    measured, write = _measured_rates(args, values)
    config = make_config(*_with_options(file_values, {**flags, **measured}, options))  # checked before it writes
    write()
    return config


def _check_built_in_flags(flags: dict, values: dict) -> None:
    """--serving and --topology build the built-in spec: one line where a spec (--spec, the --config file's, or
    --init's run's) decides instead, rather than a run that trains for the spec and records the flag."""
    named = [f"--{k}" for k in ("serving", "topology") if k in flags]
    if named and values.get("spec") is not None:
        raise CisError(
            f"{' and '.join(named)} build the built-in topology's spec, but this run trains for the spec "
            f"{values['spec']} (--spec, the --config file's or --init's run's); expected one of them: drop "
            f"{' and '.join(named)}, or give the spec you want as --spec"
        )


def _builtin_run(args: argparse.Namespace, config: RunConfig, log: Callable[[str], None]) -> dict:
    from cis.training.run import train_run

    return train_run(
        config, args.out, resume=args.resume, progress=not args.no_progress, stop_after=args.stop_after, log=log
    )


def _flower_run(args: argparse.Namespace, config: RunConfig, log: Callable[[str], None]) -> dict:
    if config.centralised:
        raise CisError("--centralised trains one model in one process; drop --engine flower")
    if args.init:
        raise CisError("--init starts the builtin engine's model; use --engine builtin for a fine-tune")
    if args.resume:
        raise CisError(
            "--resume is not supported with --engine flower (node momentum lives on the nodes); start a new run"
        )
    from cis.training.flower.launch import run_flower, submitted_text

    result = run_flower(
        config,
        args.out,
        mode=args.flower_mode,  # None: deployment with --flower-superlink / --flower-root-certificates
        superlink=args.flower_superlink,
        root_certificates=args.flower_root_certificates,
        log=log,
    )
    if "run_dir_host" in result:  # on a SuperLink on another host: its run dir, and summary, are there
        result["human"] = submitted_text(result)
    return result


def _measured_rates(args: argparse.Namespace, values: dict) -> tuple[dict, Callable[[], None]]:
    """--rates-from: measure; the config keys that point to the updated design in the run dir, and what writes
    it there (with the measurement), called once the config is checked."""
    from cis.runtime.measure import rates_from, updated_spec_text

    design_file = values.get("spec")
    if not design_file:
        raise CisError("--rates-from needs the design spec the CIS was built from: pass --spec DESIGN or --init RUN")
    out = Path(args.out)
    if (out / "checkpoint.pt").exists():
        raise CisError(f"{out}: already holds a run; use --resume to continue it or choose another --out")
    design = load_spec(design_file)
    m, updated = rates_from(args.rates_from, design, str(design_file), args.window)
    spec_file = out / "measured-spec.toml"

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(updated_spec_text(design, updated, m, False, str(design_file)))
        (out / "measurement.json").write_text(json.dumps(m.to_json(), indent=2))

    lam = m.rates().exit_serving_rate
    return {
        "spec": str(spec_file.resolve()),
        "rates_from": str(args.rates_from),
        "exit_rates": [lam[e] for e in range(1, design.num_exits + 1)],
    }, write


def _option_flags(args: argparse.Namespace) -> dict:
    """--option KEY=VALUE items, then the named method flags (which win)."""
    options: dict[str, Any] = parse_option_flags(args.option)
    if args.no_distill:
        options["distill"] = False
    if args.no_modulation:
        options["modulation"] = False
    if args.patience is not None:
        options["patience"] = args.patience
    if args.nefl_mode is not None:
        options["nefl_mode"] = args.nefl_mode
    return options


def _with_options(file_values: dict, flags: dict, options: dict) -> tuple[dict, dict]:
    """Merge the flags' method options into the config file's (flags win key by key)."""
    if options:
        file_options = file_values.get("options") or {}
        if not isinstance(file_options, dict):
            raise CisError(f"config file: 'options' is {file_options!r}; expected a table of method options")
        flags = {**flags, "options": {**file_options, **options}}
    return file_values, flags
