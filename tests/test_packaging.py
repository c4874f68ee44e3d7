"""What an operator installs (docs/runtime.md, *Install on a tier*): a wheel built from the sources holds every
file beside the code that a command needs (the Flower app that ``--flower-mode deployment`` submits, py.typed),
installs non-editable into a fresh environment where ``cis --version`` and the package metadata report the one
version (cis/__init__.py), and its extras give each tier exactly one onnxruntime distribution: ``cpu``
(onnxruntime) or ``gpu`` (onnxruntime-gpu), never both; without either, ``cis serve`` says so in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from cis import __version__

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cis",)  # one import root
DISTRIBUTION = "cis-inference"  # the name on the package index ("cis" there is another project)
packaging_requirements = pytest.importorskip("packaging.requirements")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel`` of a clean copy of the sources (offline: the build uses this environment's setuptools)."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (built,) = out.glob("cis_inference-*.whl")
    return built


def _data_files() -> set[str]:
    """Every file of the packages that is not Python source: what the wheel must carry beside the code."""
    return {
        str(p.relative_to(ROOT))
        for name in PACKAGES
        for p in (ROOT / name).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }


def test_the_wheel_holds_every_file_a_command_needs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = _data_files()
    assert {"cis/training/flower/app/pyproject.toml", "cis/py.typed"} <= wanted
    assert wanted <= names, wanted - names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert f"cis_inference-{__version__}-" in wheel.name  # the version comes from cis/core/version.py


def test_a_non_editable_install_runs_from_its_own_files(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the fresh environment's own paths
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed",
               "-q", str(wheel)]  # fmt: skip
    res = subprocess.run(install, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    fresh = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                         text=True).strip())  # fmt: skip
    # the dependencies (numpy, pyzmq, ...) from this environment, after the fresh site-packages: cis is the wheel's
    (fresh / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    code = (
        "import json, importlib.metadata as m, cis, cis.training.flower.deploy as d\n"
        "print(json.dumps({'file': cis.__file__, 'app': (d.APP_DIR / 'pyproject.toml').is_file(),"
        " 'version': cis.__version__, 'dist': m.version('cis-inference'),"
        " 'license': m.metadata('cis-inference')['License-Expression']}))"
    )
    got = json.loads(subprocess.check_output([str(python), "-c", code], text=True, cwd=tmp_path, env=env))
    assert Path(got["file"]).is_relative_to(fresh) and got["app"]  # the Flower app file is installed
    assert got["version"] == got["dist"] == __version__ and got["license"] == "Apache-2.0"
    version = subprocess.run([str(python), "-m", "cis.cli.main", "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=60)  # fmt: skip
    assert version.returncode == 0 and version.stdout.strip() == f"cis {__version__}"


def _requirements(wheel: Path) -> list:
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(f"cis_inference-{__version__}.dist-info/METADATA").decode())
    return [packaging_requirements.Requirement(r) for r in meta.get_all("Requires-Dist")]


def _distributions(requirements: list, extras: set[str]) -> set[str]:
    """The distributions ``pip install 'cis-inference[EXTRAS]'`` asks for (cis's own extras followed)."""
    names, todo, seen = set(), set(extras) | {""}, set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for r in requirements:
            if r.marker is not None and not r.marker.evaluate({"extra": extra, "python_version": "3.11"}):
                continue
            if r.marker is None and extra:
                continue
            if r.name == DISTRIBUTION:
                todo |= set(r.extras) - seen
            else:
                names.add(r.name)
    return names


@pytest.mark.parametrize(
    "extras, runtime",
    [
        (set(), set()),  # the core names neither: a GPU tier must be able to leave the CPU build out
        ({"metrics"}, set()),
        ({"cpu"}, {"onnxruntime"}),
        ({"all"}, {"onnxruntime"}),
        ({"export", "cpu"}, {"onnxruntime"}),
        ({"gpu"}, {"onnxruntime-gpu"}),
        ({"gpu", "tensorrt"}, {"onnxruntime-gpu"}),
        ({"gpu", "export", "flower", "plot", "metrics"}, {"onnxruntime-gpu"}),
    ],
)
def test_each_tier_gets_exactly_one_onnxruntime(wheel, extras, runtime):
    names = _distributions(_requirements(wheel), extras)
    assert {n for n in names if n.startswith("onnxruntime")} == runtime
    assert {"numpy", "pyzmq", "prometheus-client"} <= names


BLOCK_ONNXRUNTIME = """\
import sys
class _NoOnnxruntime:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "onnxruntime":
            raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")
sys.meta_path.insert(0, _NoOnnxruntime())
"""


def test_serve_without_an_onnxruntime_names_both_extras_in_one_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_ONNXRUNTIME)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "cis.cli.main", "serve", "bundle", "--node", "a"], capture_output=True,
                         text=True, env=env, timeout=60)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "cis serve: needs the 'cpu' extra: pip install 'cis-inference[cpu]' (or 'cis-inference[gpu]' for "
        "onnxruntime-gpu on an NVIDIA "
        "GPU) (not installed: onnxruntime)"
    ]
