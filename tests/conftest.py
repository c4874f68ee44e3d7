"""Shared test helpers."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

# The files that take minutes (Ray Serve and Flower start clusters of processes), longest first.
LONGEST = ("test_peers.py", "test_flower.py")


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the files with a ``slow`` test, each file's tests in their own order:
    under pytest-xdist (``--dist loadfile``, as scripts/test.sh runs the suite) the long files start at once
    instead of leaving one worker busy alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, bool]:
        name = item.path.name
        return (LONGEST.index(name) if name in LONGEST else len(LONGEST), item.path not in slow)

    items.sort(key=rank)  # stable: the rest keeps the collection order


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture
def run_cli(capsys):
    """Run the ``cis`` CLI in-process: ``run_cli("rates", path, "--json")``."""
    from cis.cli.main import main

    def run(*argv: str) -> CliResult:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def one_torch_thread():
    """Tiny models train faster on one torch thread, and the machine is shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def paper7(tmp_path):
    """The paper's 7-node tree at 60-30-10, written as a spec file."""
    from cis.core.spec import write_spec
    from cis.core.topologies import make_spec

    path = tmp_path / "paper7.toml"
    write_spec(make_spec("paper-7", "60-30-10"), path)
    return path
