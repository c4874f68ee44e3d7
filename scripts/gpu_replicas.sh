#!/usr/bin/env bash
# On a lent GPU machine (16 cores, python3 with torch and onnxruntime, no registry): the GPU tests, then the
# replicas benchmark with a core per process (issue 41's capacity check, which 2 cores cannot show).
#
#   bash scripts/gpu_replicas.sh tests     # the GPU tests and a replicas smoke run (~3 min)
#   bash scripts/gpu_replicas.sh replicas  # python -m bench.replicas on every core (~8 min)
#
# Carried (both in .git/info/exclude): .whl/ (pyzmq msgspec simpy tomli-w cryptography cffi pycparser httptools,
# downloaded for cp312 as scripts/gpu_check.sh says) and .gpu/ (.gpu/cifar: `python scripts/gpu_data.py pack
# CIFAR_DIR .gpu/cifar --train-per-class 100 --test-per-class 100`; .gpu/work: the benchmark's cached bundles,
# /tmp/cis-bench/replicas/{vit64-5-15-80,digits}, so that nothing is exported there). Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cis-gpu}"
mkdir -p "$out"
[ -d /tmp/site/zmq ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
[ -d /tmp/cifar-gpu ] || python3 scripts/gpu_data.py unpack .gpu/cifar /tmp/cifar-gpu || exit 1
mkdir -p /tmp/cis-bench/replicas && cp -rn .gpu/work/* /tmp/cis-bench/replicas/
case "${1:-tests}" in
tests)
    { nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; command -v taskset; uptime; } \
        2>&1 | tee "$out/machine.txt"
    timeout 170 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_device.py tests/test_export.py \
        tests/test_serve_tiers.py tests/test_compute_options.py 2>&1 | tee "$out/gpu-tests.log"
    timeout 120 python3 -m bench.replicas --quick --cifar /tmp/cifar-gpu --name replicas-16 2>&1 \
        | tail -25 | tee "$out/replicas-quick.log"
    cp bench/results/replicas-16-quick.md "$out/" 2>/dev/null
    ;;
replicas)
    timeout 560 python3 -m bench.replicas --cifar /tmp/cifar-gpu --name replicas-16 --repeats 2 --seconds 4 \
        --rates 100,200,400,600,800,1000,1200,1500,2000,2500 --chaos-seconds 20 2>&1 | tee "$out/replicas.log" | tail -40
    cp bench/results/replicas-16.json bench/results/replicas-16.md "$out/"
    ;;
esac
