#!/usr/bin/env bash
# Set up a virtualenv in .venv with the project and its dependencies (no tests).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e ".[plot]" 2>&1 | grep -v '^WARNING: Location' || true
echo "ready: activate with 'source .venv/bin/activate', then run 'cis --help'"
