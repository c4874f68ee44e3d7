"""The ``cis`` command line.

Each subcommand lives in its own module under ``cis/cli/commands/`` with two
functions, ``add_parser(subparsers)`` and ``run(args) -> int``. A module that
needs torch (train, evaluate, export, demo) imports it inside ``run``, so
``cis serve`` starts on a node that has no torch installed; :data:`NEEDS` says
which pip extra such a command needs, and ``main`` checks for it before running
the command (``cis train: needs the 'train' extra: pip install 'cis-inference[train]'``).

User mistakes raise :class:`cis.core.errors.CisError`; ``main`` prints its one line
to stderr and exits with status 2. A mistake in the flags argparse checks (types, choices, required or
unknown flags) is one line and status 2 too (:class:`OneLineParser`).

Global options (before or after the command): ``--log-level``, ``--log-format``
(also ``CIS_LOG_LEVEL``, ``CIS_LOG_FORMAT``; :mod:`cis.core.logs`); ``cis --version``.
Results go to stdout, logs to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cis import __version__
from cis.cli.os_errors import os_error_line, undecodable_file
from cis.core import logs
from cis.core.errors import CisError
from cis.core.extras import MissingExtra, require
from cis.core.seeds import MAX_SEED, is_seed

COMMANDS = [
    "spec",
    "rates",
    "simulate",
    "train",
    "evaluate",
    "serve",
    "infer",
    "bench",
    "status",
    "rollout",
    "keys",
    "export",
    "inspect",
    "demo",
    "report",
    "testbed",
    "link",
    "deploy",
]

# commands that need more than the core install: command -> pip extras (cis/core/extras.py); "cpu" stands for an
# onnxruntime, which the "gpu" extra gives too
NEEDS = {
    "train": ("train",),
    "evaluate": ("train",),
    "export": ("export", "cpu"),
    "demo": ("export", "cpu"),
    "serve": ("cpu",),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake in the flags is one line (what, where, and where help is), exit status 2.

    argparse's own ``error`` prints the whole usage first (two dozen lines for ``cis simulate``). Subcommands'
    parsers are of the same class (``add_subparsers`` makes them with ``type(parser)``).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="cis", description="Collaborative inference systems: train, export, serve, simulate."
    )
    parser.add_argument("--version", action="version", version=f"cis {__version__}")
    _log_options(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"cis.cli.commands.{name}").add_parser(sub)
        _log_options(sub.choices[name], argparse.SUPPRESS, nested=True)  # after the command too: it wins
    return parser


LOG_OPTIONS = (  # flag, choices, help
    ("--log-level", logs.LEVELS, f"least severe log records shown on stderr (default: ${logs.ENV_LEVEL}, else info)"),
    ("--log-format", logs.FORMATS, f"log lines as text or one JSON object each (default: ${logs.ENV_FORMAT}, else "
     "text)"),
)


def _log_options(parser: argparse.ArgumentParser, default: str | None, nested: bool = False) -> None:
    """The log flags on ``parser``; ``nested``: on its subcommands' parsers too (``cis spec new --log-level``)."""
    for flag, choices, text in LOG_OPTIONS:
        parser.add_argument(flag, type=str.lower, choices=choices, default=default, help=text)
    subcommands = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)) if nested else ()
    for action in subcommands:
        for child in set(action.choices.values()):  # an alias maps to the same parser
            _log_options(child, default, nested=True)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (a --timeout of 0, -1, nan or inf cannot work)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected seconds > 0") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}; expected a finite number of seconds > 0")
    return value


def seed(text: str) -> int:
    """An argparse type: a seed, an integer 0..2**32-1 (numpy refuses a negative one with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected a seed 0..{MAX_SEED}") from None
    if not is_seed(value):
        raise argparse.ArgumentTypeError(f"{text!r}; expected a seed, an integer 0..{MAX_SEED}")
    return value


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose: ``cis spec new``'s for ``cis spec new ...``."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[chosen]


def print_result(args: argparse.Namespace, result: Any, human: str) -> None:
    """Print the human summary, or with --json the machine-readable result."""
    if getattr(args, "json", False):
        json.dump(result, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(human)


def main(argv: Sequence[str] | None = None) -> int:
    try:  # building the parser imports every command's module: a Ctrl-C in that second is no traceback either
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print("cis: interrupted", file=sys.stderr)
        return 130
    if unknown:  # said by the command's parser, which names the command (argparse's root would say "cis")
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        logs.configure(logs.resolve(args.log_level, args.log_format))
        for extra in NEEDS.get(args.command, ()):
            require(extra)
        return int(args.func(args) or 0)
    except MissingExtra as exc:
        print(f"cis {args.command}: {exc}", file=sys.stderr)
        return 2
    except CisError as exc:
        print(f"cis {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `cis rates --json | head`
        sys.stderr.close()
        return 0
    except OSError as exc:  # a path that cannot be read or written (a folder missing, a file in the way, a full disk)
        print(f"cis {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:  # a binary file where a text file (TOML, CSV, JSON) was expected
        name = undecodable_file(exc)
        print(f"cis {args.command}: error: {name or 'a file given'}: not UTF-8 text ({exc.reason} at byte "
              f"{exc.start}); expected a text file", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print(f"cis {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
