"""The container images (deploy/Dockerfile.cpu, deploy/Dockerfile.gpu) as far as they can be checked without
a container engine: no base image can be pulled here, so no image is built. Their instructions go through
Docker's own parser (the ``dockerfile`` package wraps BuildKit's), they agree with what ``cis deploy kubernetes``
runs (user, entry point, ports), everything they copy is in the build context, and the install they run,
deploy/install.sh, installs a tier into a fresh virtualenv from the wheel and the package index."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cis.cli.commands.deploy.kubernetes import IMAGE_UID
from cis.cli.commands.deploy.plan import DEFAULT_METRICS_PORT

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"cpu": "Dockerfile.cpu", "gpu": "Dockerfile.gpu"}


def _stages(tier: str) -> list[list]:
    """The Dockerfile's instructions, split into build stages (each from its FROM)."""
    dockerfile = pytest.importorskip("dockerfile")
    stages: list[list] = []
    for cmd in dockerfile.parse_file(str(ROOT / "deploy" / TIERS[tier])):
        if cmd.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(cmd)
    return stages


def _one(stage: list, name: str):
    (cmd,) = [c for c in stage if c.cmd == name]
    return cmd


@pytest.mark.parametrize("tier", TIERS)
def test_the_image_serves_as_cis_deploy_expects(tier):
    stages = _stages(tier)
    final = stages[-1]
    assert final[0].value == ("docker.io/library/python:${PYTHON}-slim",)  # a slim base
    assert _one(final, "USER").value == (f"{IMAGE_UID}:{IMAGE_UID}",)  # the pods' runAsUser
    entry = _one(final, "ENTRYPOINT")
    assert entry.json and entry.value == ("cis",)  # exec form: cis is PID 1 and gets SIGTERM
    assert str(DEFAULT_METRICS_PORT) in _one(final, "EXPOSE").value
    runs = " ".join(c.value[0] for c in final if c.cmd == "RUN")
    extra = "cpu" if tier == "cpu" else '"$EXTRAS"'
    assert f"sh /usr/local/share/cis/install.sh {extra} /tmp/wheels /opt/cis" in runs  # the script tested below
    assert f"useradd --system --uid {IMAGE_UID}" in runs
    if tier == "gpu":
        assert any(c.cmd == "ARG" and c.value == ("EXTRAS=gpu",) for c in final)
        assert "onnxruntime-gpu[cuda,cudnn]" in runs
    known = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}
    assert {c.cmd for s in stages for c in s} <= known, "an instruction BuildKit would not run"


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern that matches the path (or a folder above it) decides."""
    out = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), bare) for i in range(len(parts))):
            out = not negate
    return out


@pytest.mark.parametrize("tier", TIERS)
def test_everything_the_image_copies_is_in_the_build_context(tier):
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [c for stage in _stages(tier) for c in stage if c.cmd == "COPY" and not c.flags]
    assert copies
    for cmd in copies:
        for source in cmd.value[:-1]:
            assert (ROOT / source).exists(), source
            assert not _ignored(source, patterns), f"{source} is left out of the build context by .dockerignore"
    assert _ignored(".venv/bin/python", patterns) and _ignored("benchmarks/results/x.json", patterns)


@pytest.mark.slow
def test_the_install_script_makes_a_cpu_tier_in_a_fresh_venv(tmp_path):
    """What the CPU image runs: the wheel of this checkout with the 'cpu' extra into a new virtualenv, its
    dependencies from the package index. The tier serves (onnxruntime there, cis deploy and serve run) without
    torch."""
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
             str(ROOT)]  # fmt: skip
    res = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "opt-cis"
    res = subprocess.run(["sh", str(ROOT / "deploy" / "install.sh"), "cpu", str(wheels), str(venv)],
                         capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.strip().endswith("cis 0.1.0")
    code = "import importlib.util as u, onnxruntime; print(onnxruntime.__version__, u.find_spec('torch') is None)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout.split()[1] == "True", out.stderr
    for command in (["serve", "--help"], ["deploy", "--help"]):
        ran = subprocess.run([str(venv / "bin" / "cis"), *command], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=120)  # fmt: skip
        assert ran.returncode == 0, ran.stderr


def test_the_install_script_refuses_a_folder_without_one_wheel(tmp_path):
    res = subprocess.run(["sh", str(ROOT / "deploy" / "install.sh"), "cpu", str(tmp_path), str(tmp_path / "v")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2 and "expected one cis_inference-*.whl" in res.stderr
    assert not (tmp_path / "v").exists()
