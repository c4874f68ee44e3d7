#!/usr/bin/env bash
# The vision example end to end: MobileNetV3-Small with three exits on a folder of drawn shapes,
# trained federated on paper-7, exported, served as 7 processes, asked, and simulated.
#
#   bash examples/vision/run.sh [OUT]      # everything goes under OUT (default: ./cis-vision)
#
# Scale (environment): TRAIN and TEST images per shape (100, 25), ROUNDS (8), LOCAL_STEPS (8), WIDTH (0.5).
# Needs the train, export, cpu and vision extras (pip install torch==2.13.0 '.[all]').
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-cis-vision}
mkdir -p "$OUT"

# 1. the data: OUT/shapes/{train,test}/<shape>/*.png, an image folder (cis reads its layout as splits)
python3 "$HERE/make_data.py" "$OUT/shapes" --train "${TRAIN:-100}" --test "${TEST:-25}"

# 2. the system: paper-7 (a cloud, 2 edges, 4 devices), each exit serving a third of the requests
cis spec new --topology paper-7 --serving 33-33-33 --classes 4 -o "$OUT/spec.toml"

# 3. federated training of your model on your data (Algorithm 1, weights from the spec's serving rates)
cis train --spec "$OUT/spec.toml" --model "$HERE/model.py:make" --model-arg width="${WIDTH:-0.5}" \
    --data "$OUT/shapes" --rounds "${ROUNDS:-8}" --local-steps "${LOCAL_STEPS:-8}" --out "$OUT/run" --no-progress

# 4. one ONNX graph per stage, verified against torch, thresholds calibrated on the validation split
cis export "$OUT/run" --out "$OUT/bundle"

# 5. every node of the spec as its own process (free loopback ports; the addresses in serve.json)
cis serve "$OUT/bundle" --all --free-ports --log-dir "$OUT/logs" --json > "$OUT/serve.json" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
until [ -s "$OUT/serve.json" ]; do kill -0 "$SERVE"; sleep 0.5; done
DEVICE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["nodes"]["device0"]["address"])' \
    "$OUT/serve.json")

# 6. the test images as requests to device0: its exit answers or forwards to edge0, then the cloud
cis infer --connect "$DEVICE" --dataset "$OUT/shapes/test" --bundle "$OUT/bundle" --out "$OUT/infer.csv"
kill "$SERVE"
wait "$SERVE" || true

# 7. the same system simulated (SimPy) with the bundle's measured stage times and confidences
cis simulate --spec "$OUT/spec.toml" --bundle "$OUT/bundle" --requests 1000 --out "$OUT/sim"
