"""The one exception type for user mistakes.

A ``CisError`` carries a single line that says what was wrong, where, and what
was expected; the CLI prints it and exits with status 2 instead of a traceback.
"""


class CisError(Exception):
    """A user-facing error: bad input, missing file, invalid spec."""


class SpecError(CisError):
    """The CIS spec (TOML) is invalid."""


class BundleError(CisError):
    """A bundle is missing, malformed or tampered with."""


def error_line(exc: BaseException) -> str:
    """``Type: first line of its message`` (or ``Type``): how a one-line error quotes the exception under it."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
