"""``pip install`` into this interpreter's environment, through uv where it can be had.

    .venv/bin/python scripts/fast_pip.py [-q] ARGS...     # what 'pip install [-q] ARGS...' would install

uv installs the same releases from the same places in a fraction of the time (the full '.[all]' install:
about 40 s against pip's 3 min on 2 cores), byte-compiled as pip does (without .pyc files every process
would compile torch again on import). It is given pip's own settings, read with 'pip config list' (config
files and PIP_* variables): index-url, extra-index-url, find-links, constraint, cert, trusted-host, and pip's
way of choosing among several indexes (the best match over all of them). pip itself runs instead where uv is
not installed, where a pip setting has no translation here, or where uv fails (pip then says why).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

MULTI = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host"}  # fmt: skip
SINGLE = {"index-url": "--index-url"}
FLAGS = {"no-index": "--no-index"}
HARMLESS = {"cert", "timeout", "default-timeout", "retries", "disable-pip-version-check", "progress-bar", "quiet",
            "no-cache-dir", "root-user-action", "no-warn-script-location", "break-system-packages"}  # fmt: skip
SECTION_RANK = {"global": 0, "install": 1, ":env:": 2}  # later wins, as in pip


def pip_settings() -> dict[str, str] | None:
    """pip's effective install settings (option -> value), None where pip cannot say."""
    run = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if run.returncode != 0:
        return None
    ranked: dict[str, tuple[int, str]] = {}
    for line in run.stdout.splitlines():
        key, _, raw = line.partition("=")
        section, _, option = key.rpartition(".")
        rank = SECTION_RANK.get(section)
        try:
            value = str(ast.literal_eval(raw)).strip()
        except (ValueError, SyntaxError):
            return None  # a listing this script does not understand: pip installs
        if rank is None or not value:
            continue
        if option not in ranked or ranked[option][0] <= rank:
            ranked[option] = (rank, value)
    return {option: value for option, (_, value) in ranked.items()}


def uv_command(settings: dict[str, str], args: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """The uv command (and environment) that installs what pip would, None where a setting has no translation."""
    cmd = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--compile-bytecode",
           "--index-strategy", "unsafe-best-match"]  # fmt: skip
    env = dict(os.environ)
    for option, value in settings.items():
        if option in MULTI:
            cmd += [part for item in value.split() for part in (MULTI[option], item)]
        elif option in SINGLE:
            cmd += [SINGLE[option], value]
        elif option in FLAGS:
            cmd += [FLAGS[option]] if value.lower() in ("1", "true", "yes", "on") else []
        elif option == "cert":
            env["SSL_CERT_FILE"] = value
        elif option in ("timeout", "default-timeout"):
            env["UV_HTTP_TIMEOUT"] = value
        elif option not in HARMLESS:
            return None
    return cmd + args, env


def main(args: list[str]) -> int:
    has_uv = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0
    settings = pip_settings() if has_uv else None
    translated = uv_command(settings, args) if settings is not None else None
    if translated is not None:
        cmd, env = translated
        if subprocess.run(cmd, env=env).returncode == 0:
            return 0
        why = "uv could not install it (above)"
    else:
        why = "uv is not installed here" if not has_uv else "a pip setting has no uv translation (pip config list)"
    print(f"fast_pip: {why}; pip installs", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
