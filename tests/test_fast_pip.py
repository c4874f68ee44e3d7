"""scripts/fast_pip.py, through which scripts/test.sh and setup.sh install: uv gets pip's own settings (where pip
finds releases, its constraints and certificate), the environment's over the config files', and any pip setting
without a translation sends the install to pip itself."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fast_pip.py"
spec = importlib.util.spec_from_file_location("fast_pip", SCRIPT)
fast_pip = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fast_pip)


def test_pip_settings_are_given_to_uv():
    settings = {"extra-index-url": "file:///a/simple file:///b/simple", "find-links": "/opt/wheels",
                "constraint": "/etc/c.txt", "cert": "/etc/ca.crt", "default-timeout": "180",
                "disable-pip-version-check": "1"}  # fmt: skip
    cmd, env = fast_pip.uv_command(settings, ["-q", "-e", ".[all]"])
    assert cmd[:5] == [sys.executable, "-m", "uv", "pip", "install"]
    assert "--compile-bytecode" in cmd and cmd[cmd.index("--index-strategy") + 1] == "unsafe-best-match"
    pairs = list(zip(cmd, cmd[1:]))
    assert ("--extra-index-url", "file:///a/simple") in pairs and ("--extra-index-url", "file:///b/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs and ("--constraint", "/etc/c.txt") in pairs
    assert env["SSL_CERT_FILE"] == "/etc/ca.crt" and env["UV_HTTP_TIMEOUT"] == "180"
    assert cmd[-3:] == ["-q", "-e", ".[all]"]


def test_a_setting_without_translation_leaves_the_install_to_pip():
    assert fast_pip.uv_command({"proxy": "http://p:3128"}, ["x"]) is None
    assert fast_pip.uv_command({"no-index": "false"}, ["x"])[0].count("--no-index") == 0


def test_pip_settings_read_the_environment_over_the_config_files(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/tmp/wheels-here")
    monkeypatch.setenv("PIP_CONSTRAINT", "/tmp/pins.txt")
    settings = fast_pip.pip_settings()
    assert settings["find-links"] == "/tmp/wheels-here" and settings["constraint"] == "/tmp/pins.txt"
