#!/usr/bin/env bash
# torch first, at the pinned CPU build (it lies on local disk on these machines; a bare 'torch' requirement may
# pull a multi-GB CUDA build), then torchvision's CPU build beside a CPU torch. PyPI's torchvision for torch 2.13
# (0.28) is a CUDA build, and beside a CPU torch a plain 'import torchvision' fails ("operator torchvision::nms
# does not exist"); PyTorch's CPU index has the matching CPU build (0.28.0+cpu). Where that index cannot be
# reached (offline machines whose wheels are local: none of them is a CPU torchvision), the 'vision' extra
# installs PyPI's build and cis imports it through its fallback (cis/training/models/vision.py;
# docs/your-model.md, 'torchvision beside a CPU torch'). Usage: bash scripts/install_torch.sh PYTHON
set -uo pipefail
py="${1:-.venv/bin/python}"
"$py" "$(dirname "$0")/fast_pip.py" -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location'
if "$py" -W ignore -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then  # numpy may come later
  "$py" -m pip install -q --no-deps --timeout 10 --retries 0 --index-url https://download.pytorch.org/whl/cpu \
    "torchvision==0.28.0+cpu" >/dev/null 2>&1 \
    && echo "torchvision 0.28.0+cpu (CPU build) installed" \
    || echo "torchvision's CPU build is not reachable here: the 'vision' extra's PyPI build is imported through cis's fallback"
fi
exit 0
