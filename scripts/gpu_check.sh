#!/usr/bin/env bash
# The GPU checks, in one run, for a machine with an NVIDIA GPU whose python3 already has
# torch with CUDA (a lent device machine: no package registry there). Writes its logs to
# $OUT (or /tmp/cis-gpu) and prints a summary; about 3 minutes.
#
# Packages that machine lacks travel as wheels in .whl/ (ignored by git). Prepare them here,
# in the repo root, for its Python (3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pyzmq simpy tomli-w
# then run this script there with .whl carried. The Flower GPU test skips without flwr.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cis-gpu}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/cis-site .whl/*.whl
    export PYTHONPATH="/tmp/cis-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$out/device.txt"
# every test marked gpu (training on CUDA, TensorRT engines where TensorRT is installed), then the device tests' CPU half
# (serving: tests/test_serve_tiers.py, onnxruntime's CUDA provider with onnxruntime-gpu, the engines with
# tensorrt and cuda-python; add their wheels to .whl/ with prometheus-client)
python3 -m pytest -q -rs -m gpu tests/test_device.py tests/test_export.py tests/test_serve_tiers.py 2>&1 \
    | tee "$out/gpu-tests.log"
python3 -m pytest -q -rs tests/test_device.py -m "not gpu" 2>&1 | tail -3 | tee -a "$out/gpu-tests.log"
# the same short digits run on the CPU and on the GPU: seconds per round from metrics.jsonl
for device in cpu cuda; do
    python3 -m cis.cli.main train --device "$device" --rounds 5 --out "$out/run-$device" --no-progress --json > "$out/train-$device.json"
done
python3 - "$out" <<'EOF' | tee "$out/train-seconds.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for device in ("cpu", "cuda"):
    lines = [json.loads(l) for l in (out / f"run-{device}" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / f"train-{device}.json").read_text())
    secs = [l["train_seconds"] for l in lines[1:]]  # round 1 pays the warm-up
    print(f"{summary['device']}: {sum(secs) / len(secs):.3f} s/round (rounds 2-5), final-exit test acc {summary['final_exit_accuracy']:.3f}")
EOF
