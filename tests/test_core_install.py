"""The core install: every core command runs with torch, scikit-learn, onnx and pillow absent.

Each command runs as ``python -m cis.cli.main ...`` in a fresh process (and ``cis serve --all``
starts its node processes) with a ``sitecustomize`` on PYTHONPATH that makes the
optional packages unimportable, as on a ``pip install cis-inference`` tier, and logs every
attempt to import one. The core commands must succeed and never even try torch,
scikit-learn, onnx or pillow (the torch-free registries of the training package,
which name the CLI's choices, are part of every install); the commands that need
an extra must say which one in one line.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from cli_process import cis_argv, start, started_nodes, stop  # noqa: E402

# never imported by a core command (torch and what needs it; the front doors' extras)
FORBIDDEN = ("torch", "sklearn", "onnx", "onnxscript", "PIL", "flwr", "httptools", "grpc", "tritonclient")
# also absent from a core install, but a core command may look for them (plots)
OPTIONAL = ("matplotlib",)

SITECUSTOMIZE = '''\
import os
import sys

_blocked = set(os.environ.get("CIS_TEST_BLOCK", "").split(","))
_log = os.environ.get("CIS_TEST_IMPORT_LOG")


class _CoreInstall:
    """Packages of a full install that a core install lacks: importing one fails, and is logged."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _blocked:
            if _log:
                with open(_log, "a") as f:
                    f.write(f"{top} {os.getpid()}\\n")
            raise ModuleNotFoundError(f"No module named {top!r} (core install)", name=top)
        return None


sys.meta_path.insert(0, _CoreInstall())
'''


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """A runner of ``cis`` commands as on a core install, and the log of blocked import attempts."""
    root = tmp_path_factory.mktemp("core")
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = root / "imports.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["CIS_TEST_BLOCK"] = ",".join(FORBIDDEN + OPTIONAL)
    env["CIS_TEST_IMPORT_LOG"] = str(log)

    class Core:
        def __init__(self) -> None:
            self.env, self.log, self.cwd = env, log, root

        def run(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
            return subprocess.run(cis_argv(*args), env=env, cwd=root, capture_output=True, text=True, timeout=timeout)

        def start(self, *args) -> subprocess.Popen:
            return start(*args, env=env, cwd=root)

        def clear_log(self) -> None:
            log.unlink(missing_ok=True)

        def attempted(self) -> set[str]:
            return {line.split()[0] for line in log.read_text().splitlines()} if log.exists() else set()

    return Core()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A paper-7 digits bundle exported with the full install (as on the machine that trains)."""
    from cis.exporter.fixture_bundle import make_demo_bundle

    return make_demo_bundle(tmp_path_factory.mktemp("core-bundle"), steps=150)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """The digits test split as a .npz of model inputs and as a PNG folder per class (pixels)."""
    Image = pytest.importorskip("PIL.Image")
    from cis.training.data.loading import load_dataset

    root = tmp_path_factory.mktemp("core-data")
    test = load_dataset("digits", seed=0).test
    np.savez(root / "digits.npz", x=test.x[:60], y=test.y[:60])
    pixels = np.rint((test.x[:30, 0] * test.std[0] + test.mean[0]) * 255).clip(0, 255).astype(np.uint8)
    for i, (img, label) in enumerate(zip(pixels, test.y[:30])):
        (root / "images" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, "L").save(root / "images" / str(label) / f"{i:03d}.png")
    return root


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def test_core_commands_run_without_torch(core, bundle, tmp_path):
    core.clear_log()
    _ok(core.run("--help"))
    _ok(core.run("train", "--help"))
    _ok(core.run("spec", "new", "--topology", "paper-7", "--serving", "60-30-10", "-o", tmp_path / "spec.toml"))
    assert json.loads(_ok(core.run("rates", tmp_path / "spec.toml", "--json")).stdout)["exits"]
    manifest = json.loads(_ok(core.run("inspect", bundle, "--json")).stdout)
    assert len(manifest["stages"]) == 3
    sim = json.loads(
        _ok(
            core.run(
                "simulate",
                "--spec",
                tmp_path / "spec.toml",
                "--bundle",
                bundle,
                "--requests",
                "300",
                "--out",
                tmp_path / "sim",
                "--json",
            )
        ).stdout
    )
    assert sim["requests"]["served"] == 300
    assert (tmp_path / "sim" / "result.json").is_file()
    measured = json.loads(
        _ok(core.run("rates", tmp_path / "spec.toml", "--measured", tmp_path / "sim" / "requests.csv", "--json")).stdout
    )
    assert measured["measurement"]["served"] == 300
    _ok(core.run("spec", "update", tmp_path / "spec.toml", "--rates-from", tmp_path / "sim" / "requests.csv"))
    _ok(core.run("report", tmp_path / "sim", "--json"))
    _ok(core.run("report", bundle, "--out", tmp_path / "bundle-report.md"))
    _ok(core.run("keys", tmp_path / "keys", "--name", "edge"))
    assert (tmp_path / "keys" / "edge.key").is_file()
    from cis.core.bundle import load_bundle
    from cis.core.spec import write_spec

    write_spec(load_bundle(bundle).spec, tmp_path / "addressed.toml")  # the bundle's spec has every node's address
    k8s = json.loads(_ok(core.run("deploy", "kubernetes", tmp_path / "addressed.toml", bundle, "-o", tmp_path / "k8s",
                                  "--json")).stdout)
    assert len(k8s["nodes"]) == 7 and all(os.path.isfile(f) for f in k8s["files"])
    _ok(core.run("deploy", "systemd", tmp_path / "addressed.toml", "-o", tmp_path / "units"))
    tried = core.attempted() & set(FORBIDDEN)
    assert not tried, f"a core command tried to import {sorted(tried)}"


def test_serve_all_and_infer_on_arrays_and_images_without_torch(core, bundle, digits_files, tmp_path):
    core.clear_log()
    proc = core.start("serve", bundle, "--all", "--free-ports", "--metrics-port", "0", "--json")
    try:
        nodes = started_nodes(proc)
        for node in nodes.values():  # every node's Prometheus endpoint and health probe
            with urllib.request.urlopen(node["metrics"], timeout=10) as r:
                text = r.read().decode()
            assert all(f"# TYPE {name} " in text for name in ("cis_requests_total", "cis_parent_up")), text[:500]
            with urllib.request.urlopen(node["metrics"].replace("/metrics", "/healthz"), timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["state"] == "serving"
        root = next(a["address"] for a in nodes.values() if a["parent"] is None)
        leaf = next(a["address"] for n, a in nodes.items() if a["exit"] == 1)
        out = json.loads(
            _ok(
                core.run(
                    "infer",
                    "--connect",
                    root,
                    "--dataset",
                    digits_files / "digits.npz",
                    "--out",
                    tmp_path / "rows.csv",
                    "--json",
                )
            ).stdout
        )
        assert out["samples_answered"] == 60 and not out["errors"] and out["accuracy"] > 0.5
        rows = list(csv.DictReader(open(tmp_path / "rows.csv")))
        assert len(rows) == 60 and all(r["error"] == "" and r["class"] != "" for r in rows)
        img = json.loads(
            _ok(
                core.run("infer", "--connect", leaf, "--dataset", digits_files / "images", "--bundle", bundle, "--json")
            ).stdout
        )
        assert img["samples_answered"] == 30 and not img["errors"] and img["accuracy"] > 0.5
        status = _ok(core.run("status", "--connect", root, "--json"))
        assert status.stdout.strip()
        every = [a for node in nodes.values() for a in ("--connect", node["address"])]
        measured = json.loads(_ok(core.run("rates", *every, "--json")).stdout)
        assert measured["measurement"]["served"] == 90  # the .npz samples and the images
    finally:
        code = stop(proc)
    assert code == 0, proc.stderr.read()[-3000:]
    tried = core.attempted() & set(FORBIDDEN)
    assert not tried, f"serving or infer tried to import {sorted(tried)}"


@pytest.mark.parametrize(
    "argv, extra",
    [
        (("train", "--out", "r"), "train"),
        (("evaluate", "r"), "train"),
        (("export", "r", "--out", "b"), "export"),
        (("demo", "--quick"), "export"),
    ],
)
def test_commands_that_need_an_extra_say_which(core, argv, extra):
    res = core.run(*argv)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    want = f"cis {argv[0]}: needs the '{extra}' extra: pip install 'cis-inference[{extra}]'"
    assert lines[0].startswith(want), lines[0]


def test_infer_messages_without_pillow_or_the_train_extra(core, bundle, digits_files, tmp_path):
    res = core.run("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", "digits")
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == "cis infer: --dataset digits needs the 'train' extra: pip install 'cis-inference[train]' "
        "(not installed: torch, sklearn, PIL)"
    )
    (tmp_path / "jpg").mkdir()
    (tmp_path / "jpg" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    res = core.run("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", tmp_path / "jpg", "--bundle", bundle)
    assert (
        res.returncode == 2
        and "needs pillow (pip install pillow)" in res.stderr
        and len(res.stderr.strip().splitlines()) == 1
    )
    res = core.run("infer", "--connect", "tcp://127.0.0.1:9", "--dataset", digits_files / "images")
    assert res.returncode == 2 and "--bundle" in res.stderr


def test_tomli_fallback_reads_specs_and_configs_where_tomllib_is_missing(core, tmp_path):
    """Python 3.10 has no tomllib: cis.core.spec and cis.training.config fall back to tomli (the test extra
    installs it)."""
    pytest.importorskip("tomli")
    (tmp_path / "cfg.toml").write_text("rounds = 3\nseed = 7\n")
    code = (
        "import sys\n"
        "from cis.core.spec import load_spec, write_spec\n"
        "from cis.core.topologies import make_spec\n"
        "import cis.core.spec_file, cis.training.config\n"
        "assert cis.core.spec_file.tomllib.__name__ == 'tomli'\n"
        f"write_spec(make_spec('paper-7', '60-30-10'), {str(tmp_path / 's.toml')!r})\n"
        f"assert len(load_spec({str(tmp_path / 's.toml')!r}).nodes) == 7\n"
        f"assert cis.training.config.read_config_file({str(tmp_path / 'cfg.toml')!r}) == {{'rounds': 3, 'seed': 7}}\n"
    )
    env = {**core.env, "CIS_TEST_BLOCK": "tomllib", "CIS_TEST_IMPORT_LOG": str(tmp_path / "log")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "log").read_text().split()[0] == "tomllib"  # the fallback really ran


def test_metrics_port_without_prometheus_client_is_one_line(core, bundle):
    """An install without prometheus-client (pip install --no-deps) names the extra to install."""
    env = {**core.env, "CIS_TEST_BLOCK": core.env["CIS_TEST_BLOCK"] + ",prometheus_client"}
    argv = cis_argv("serve", bundle, "--node", "cloud", "--bind", "tcp://127.0.0.1:0", "--metrics-port", "0")
    res = subprocess.run(argv, env=env, cwd=core.cwd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "cis serve: --metrics-port needs the 'metrics' extra: pip install 'cis-inference[metrics]' "
        "(not installed: prometheus_client)"
    ]


@pytest.mark.parametrize("door, module", [("http", "httptools"), ("grpc", "grpc")])
def test_front_doors_without_their_extra_are_one_line(core, bundle, door, module):
    """--http-port and --grpc-port need the 'http' and 'grpc' extras; a core install says which, in one line."""
    argv = ("serve", bundle, "--node", "cloud", "--bind", "tcp://127.0.0.1:0", f"--{door}-port", "0")
    res = core.run(*argv)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"cis serve: --{door}-port needs the '{door}' extra: pip install 'cis-inference[{door}]' "
        f"(not installed: {module})"
    ]
