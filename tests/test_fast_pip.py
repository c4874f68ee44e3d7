"""scripts/fast_pip.py, through which scripts/test.sh and setup.sh install: uv gets pip's own settings (where pip
finds releases, its constraints and certificate), the environment's over the config files', and any pip setting
without a translation sends the install to pip itself."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import pytest

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


def _tiny_wheel(folder: Path) -> Path:
    """A one-module wheel built by hand (no build backend, no index)."""
    import zipfile

    info = "tinypkg-0.1.dist-info"
    files = {
        "tinypkg/__init__.py": "ANSWER = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    wheel = folder / "tinypkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_it_installs_through_uv_byte_compiled_and_through_pip_without_uv(tmp_path):
    import subprocess
    import venv

    wheel = _tiny_wheel(tmp_path)
    # only the venv's own packages: no path from this run's environment, no user site, not this checkout's folder
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")}
    env["PYTHONNOUSERSITE"] = "1"
    for name, with_uv in (("with-uv", True), ("without-uv", False)):
        venv.create(tmp_path / name, with_pip=True)
        py = str(tmp_path / name / "bin" / "python")
        run = functools.partial(subprocess.run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        if with_uv:
            got = run([py, "-m", "pip", "install", "-q", "uv"])
            assert got.returncode == 0, got.stderr[-2000:]
        else:
            seen = run([py, "-c", "import importlib.util as u; s = u.find_spec('uv'); print(s and s.origin)"])
            if seen.stdout.strip() != "None":  # this machine puts uv on every interpreter's path: nothing to test
                pytest.skip(f"a fresh venv imports uv from {seen.stdout.strip()}")
        done = run([py, str(SCRIPT), "-q", str(wheel)])
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("fast_pip: uv is not installed here; pip installs" in done.stderr) != with_uv, done.stderr
        check = "import tinypkg as t, pathlib as p; print(t.ANSWER, any(p.Path(t.__file__).parent.glob('*/*.pyc')))"
        out = subprocess.run([py, "-c", check], capture_output=True, text=True, env={"PYTHONDONTWRITEBYTECODE": "1"})
        assert out.stdout.split() == ["42", "True"], out.stderr  # compiled at install, not at import
