"""Logs of every ``cis`` command: one handler on stderr, text or JSON lines (docs/runtime.md, *Logs*).

Library code (cis, training, export, sim) only asks ``logging.getLogger(__name__)`` and, for the
runtime's named events (a node's start, its parent going down, overload, restarts ...), calls
:func:`event`, which gives the record an ``event`` name and fields. The command layer calls
:func:`configure` once per command with the level and format that :func:`resolve` takes from
``--log-level``/``--log-format``, else ``CIS_LOG_LEVEL``/``CIS_LOG_FORMAT``, else ``info``/``text``.

- text: ``2026-11-26T18:33:24.123Z INFO cis.runtime.node node_start: node edge0 (exit 1) at ...``
  (the event name only on event records), a traceback on the lines after;
- json: one object per line: ``time``, ``level``, ``logger``, ``pid``, ``event`` (event records),
  ``message``, the event's fields (e.g. ``node``), ``exc`` (a traceback, when there is one).

The level applies to the project's own loggers; other libraries' records pass at WARNING and above.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cis.core.errors import CisError

LEVELS = ("debug", "info", "warning", "error", "critical")
_LEVEL = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}  # fmt: skip
FORMATS = ("text", "json")
ENV_LEVEL, ENV_FORMAT = "CIS_LOG_LEVEL", "CIS_LOG_FORMAT"
PACKAGES = ("cis",)  # the project's loggers (every module logs under cis.*): the level applies to these


@dataclass(frozen=True)
class LogSettings:
    level: str = "info"
    format: str = "text"


def resolve(level: str | None = None, fmt: str | None = None, environ: Mapping[str, str] = os.environ) -> LogSettings:
    """The flags' values, else the environment's, else the defaults; a bad value is one line (CisError)."""
    default = LogSettings()
    return LogSettings(
        _pick("--log-level", level, ENV_LEVEL, environ, LEVELS, default.level),
        _pick("--log-format", fmt, ENV_FORMAT, environ, FORMATS, default.format),
    )


def _pick(flag: str, given: str | None, env: str, environ: Mapping[str, str], allowed: tuple, default: str) -> str:
    where, value = (flag, given) if given is not None else (env, environ.get(env))
    if value is None or (where == env and not value.strip()):
        return default
    if value.strip().lower() not in allowed:
        raise CisError(f"{where} is {value!r}; expected one of {', '.join(allowed)}")
    return value.strip().lower()


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # logging.StreamHandler.__init__ sets it
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        """Other libraries' records at WARNING and above only, whatever level their own loggers are set to (flwr
        sets DEBUG on its logger); the project's pass at the level :func:`configure` set on them."""
        ours = any(record.name == p or record.name.startswith(p + ".") for p in PACKAGES)
        return (ours or record.levelno >= logging.WARNING) and bool(super().filter(record))


def adopt(name: str) -> None:
    """Route library ``name``'s records through the project's handler only: drop the console handlers the
    library put on its own logger (flwr prints every record itself, DEBUG included, in its own format), so its
    records show at WARNING and above, in the format ``--log-format`` chose."""
    library = logging.getLogger(name)
    for handler in list(library.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            library.removeHandler(handler)
    library.propagate = True


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        name = getattr(record, "event", None)
        head = f"{_utc(record)} {record.levelname} {record.name}" + (f" {name}" if name else "")
        text = f"{head}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _utc(record), "level": record.levelname, "logger": record.name}
        line["pid"] = record.process
        if getattr(record, "event", None):
            line["event"] = record.event  # type: ignore[attr-defined]
        line["message"] = record.getMessage()
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


FORMATTERS: dict[str, type[logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}
_current = LogSettings()
_handler: logging.Handler | None = None


def configure(settings: LogSettings) -> None:
    """Send every record to stderr in ``settings.format``; the project's loggers at ``settings.level``,
    other libraries' at WARNING and above. Calling it again replaces what an earlier call set."""
    global _current, _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = _Stderr()
    _handler.setFormatter(FORMATTERS[settings.format]())
    root.addHandler(_handler)
    level = _LEVEL[settings.level]
    root.setLevel(max(level, logging.WARNING))
    for name in PACKAGES:
        logging.getLogger(name).setLevel(level)
    _current = settings


def current() -> LogSettings:
    """What :func:`configure` set last (the launcher passes it on to the nodes it starts)."""
    return _current


def event(logger: logging.Logger, level: int, name: str, message: str, *, exc_info: Any = None, **fields: Any) -> None:
    """Log one named event: ``name`` (e.g. ``parent_down``) and ``fields`` travel with the record; JSON lines
    carry them as keys, text lines show the name."""
    if logger.isEnabledFor(level):
        logger.log(level, message, exc_info=exc_info, extra={"event": name, "fields": fields}, stacklevel=2)


def append(path: str | Path, logger: str, level: int, name: str, message: str, **fields: Any) -> None:
    """Append one event, formatted as :func:`configure` formats records, to a file (the launcher's lines in a
    node's log file, beside that node's own lines)."""
    record = logging.LogRecord(logger, level, __file__, 0, message, None, None)
    record.event, record.fields = name, fields
    with open(path, "a") as f:
        f.write(FORMATTERS[_current.format]().format(record) + "\n")


class Every:
    """At most one record per ``seconds`` for a recurring event; :meth:`due` says whether this one may go,
    and how many were held back since the last that went."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.next, self.held = seconds, -float("inf"), 0

    def due(self, now: float) -> int | None:
        """None: hold this one back; else the number held back before it (the count starts over)."""
        if now < self.next:
            self.held += 1
            return None
        held, self.held, self.next = self.held, 0, now + self.seconds
        return held
