#!/usr/bin/env bash
# The text example end to end: a small transformer with an exit after each encoder layer, on int64 token
# ids from a .npz with its own node column; trained federated on paper-7, exported, served as 7 processes,
# asked, and simulated.
#
#   bash examples/text/run.sh [OUT]       # everything goes under OUT (default: ./cis-text)
#
# Scale (environment): N training sentences (1200), QUERIES (200), ROUNDS (10).
# Needs the train, export and cpu extras (pip install torch==2.13.0 '.[all]').
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-cis-text}
mkdir -p "$OUT"

# 1. the data: OUT/data/topics.npz (x int64 (N, 16), y, classes, node) and OUT/data/queries.npz (x, y)
python3 "$HERE/make_data.py" "$OUT/data" --n "${N:-1200}" --queries "${QUERIES:-200}"

# 2. the system: paper-7 (a cloud, 2 edges, 4 devices); the devices' exit serves 60 % of the requests
cis spec new --topology paper-7 --serving 60-30-10 --classes 4 -o "$OUT/spec.toml"

# 3. federated training; each node trains on the sentences its node column gives it
cis train --spec "$OUT/spec.toml" --model "$HERE/model.py:make" --model-arg dim=32 \
    --data "$OUT/data/topics.npz" --partition node --rounds "${ROUNDS:-10}" --out "$OUT/run" --no-progress

# 4. one ONNX graph per stage (stage 1 takes int64 ids), verified against torch, thresholds calibrated
cis export "$OUT/run" --out "$OUT/bundle"

# 5. every node of the spec as its own process (free loopback ports; the addresses in serve.json)
cis serve "$OUT/bundle" --all --free-ports --log-dir "$OUT/logs" --json > "$OUT/serve.json" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
until [ -s "$OUT/serve.json" ]; do kill -0 "$SERVE"; sleep 0.5; done
DEVICE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["nodes"]["device0"]["address"])' \
    "$OUT/serve.json")

# 6. the queries as requests to device0: token ids of any integer dtype that fits the model's int64
cis infer --connect "$DEVICE" --dataset "$OUT/data/queries.npz" --bundle "$OUT/bundle" --out "$OUT/infer.csv"
kill "$SERVE"
wait "$SERVE" || true

# 7. the same system simulated (SimPy) with the bundle's measured stage times and confidences
cis simulate --spec "$OUT/spec.toml" --bundle "$OUT/bundle" --requests 1000 --out "$OUT/sim"
