#!/usr/bin/env bash
# Set up a fresh virtualenv in .venv and run the test suite.
# torch is installed first at the pinned CPU build, which lies on local disk on
# these machines; the project's own range (<2.14) then installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e ".[test,flower]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import torch, onnxruntime, zmq, simpy, cis" # fail loudly if the install is incomplete
exec .venv/bin/python -m pytest "$@"
