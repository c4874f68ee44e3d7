#!/usr/bin/env bash
# Set up a virtualenv in .venv with the project and every extra but tensorrt (training,
# export, Flower, plots, metrics, test tools). An edge tier that only serves needs the
# core and an onnxruntime: pip install ".[cpu]" (README, "Install").
# torch is installed first at the pinned CPU build, which lies on local disk on these
# machines; the project's own range (<2.14) then installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# uv (from the same registry) installs what pip would in a fraction of the time; pip does it where uv cannot be had
.venv/bin/python -m pip install -q uv >/dev/null 2>&1 || .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
bash scripts/install_torch.sh .venv/bin/python  # torch's CPU build, then torchvision's where reachable
.venv/bin/python scripts/fast_pip.py -q -e ".[all]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import torch, onnx, sklearn, PIL, onnxruntime, zmq, simpy, cis" # fail loudly if the install is incomplete
echo "ready: activate with 'source .venv/bin/activate', then run 'cis --help'"
