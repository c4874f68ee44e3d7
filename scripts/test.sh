#!/usr/bin/env bash
# Set up a fresh virtualenv in .venv (every extra but tensorrt), check Python 3.10
# compatibility, and run the test suite.
# torch is installed first at the pinned CPU build, which lies on local disk on
# these machines; the project's own range (<2.14) then installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# uv (from the same registry) installs what pip would in a fraction of the time; pip does it where uv cannot be had
.venv/bin/python -m pip install -q uv >/dev/null 2>&1 || .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
bash scripts/install_torch.sh .venv/bin/python  # torch's CPU build, then torchvision's where reachable
.venv/bin/python scripts/fast_pip.py -q -e ".[all]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import torch, onnx, sklearn, PIL, flwr, onnxruntime, zmq, simpy, cis" # fail loudly if the install is incomplete
# requires-python is >= 3.10: nothing in the packages may need a newer Python (tomllib has a tomli fallback)
.venv/bin/vermin --target=3.10- --violations --eval-annotations --no-tips -q cis
# the layout's rules: lint (pyproject [tool.ruff]) and the import contracts (pyproject [tool.importlinter])
.venv/bin/ruff check --quiet .
.venv/bin/lint-imports --no-cache >/dev/null || { .venv/bin/lint-imports --no-cache; exit 1; }
# types: all of cis, training included (pyproject [tool.mypy]), checked beside the tests (they leave part of a
# core idle); its errors are printed, and the run fails, once the tests are done
.venv/bin/mypy --no-error-summary > .venv/mypy.log 2>&1 &
mypy_pid=$!
# 3 workers on 2 cores: many tests wait on processes and sockets; a file stays on one worker (its module fixtures
# start once), in the collection order (xdist would put the files with the most tests first), where the longest files
# and those with a slow test come first (tests/conftest.py). CIS_TEST_WORKERS=0: one process.
tests=0
.venv/bin/python -m pytest -rfEs --durations=25 -n "${CIS_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@" || tests=$?
wait "$mypy_pid" || { cat .venv/mypy.log; echo "mypy: type errors (above)"; exit 1; }
exit "$tests"
