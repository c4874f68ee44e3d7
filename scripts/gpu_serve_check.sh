#!/usr/bin/env bash
# Issue 24, item 8: the GPU tier serving on a GPU. NOT RUN ON A GPU YET: the session that wrote it had no
# GPU lent (bench/results/gpu_check.md); rehearsed on a CPU with
#     PROVIDER=cpu OUT=/tmp/cis-gpu-rehearsal bash scripts/gpu_serve_check.sh
# (no parts: the installed onnxruntime; the GPU tests skip; no CIFAR-10: no overhead benchmark).
#
# On a lent GPU machine (python3 3.12 with torch cu130, no package registry, 64 MiB per call, /tmp kept while
# the machine stays warm, about 30 s after a call):
#   here, once (network), in the repo root:
#     printf '/.gpu-ort/\n/.whl/\n' >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .gpu-ort onnxruntime-gpu==1.31.1          # about 255 MB
#     python3 scripts/gpu_parts.py split .gpu-ort/onnxruntime_gpu-1.31.1-*.whl .gpu-ort/parts --mib 55
#   or, 4 parts instead of 5: the wheel's files less the TensorRT provider (no TensorRT there) as .tar.xz (203 MB;
#   this script unpacks either form; what ran on 2026-11-27):
#     mkdir /tmp/ortx && cd /tmp/ortx && unzip -q .../onnxruntime_gpu-1.31.1-*.whl \
#       && rm onnxruntime/capi/libonnxruntime_providers_tensorrt.so \
#       && tar -cf - onnxruntime onnxruntime_gpu-1.31.1.dist-info | xz -9 -T2 > ort-gpu-1.31.1.tar.xz
#     python3 scripts/gpu_parts.py split /tmp/ortx/ort-gpu-1.31.1.tar.xz .gpu-ort/parts --mib 48.5
#     (and .whl/ as scripts/gpu_check.sh says, plus msgspec, msgpack, cryptography, cffi, pycparser,
#      prometheus-client; CIFAR-10 for the overhead benchmark: scripts/gpu_data.py pack, carried with .gpu)
#   there, back to back on the same warm machine, one part per call (K = 000 ... 004, or 000 ... 003 for the .tar.xz; the .whl with the last):
#     run(carry=[".gpu-ort/parts/part-K", ".gpu-ort/parts/parts.json"],
#         command="mkdir -p /tmp/ort-parts && cp .gpu-ort/parts/* /tmp/ort-parts/")
#   then, at once:
#     run(carry=[".whl"], command="bash scripts/gpu_serve_check.sh", timeout_s=540)
# onnxruntime-gpu 1.31.1 is built against CUDA 13 (libcublas.so.13, libcudart.so.13): the image's torch (cu130)
# brings those libraries in its nvidia-* packages, which this script puts on the loader path. TensorRT's
# libraries cannot be brought (tensorrt-cu13-libs downloads from another index): the TensorRT path stays untested.
#
# OVERHEAD=0 skips the overhead benchmark (when the lent minutes go to training).
# Writes $OUT (default /tmp/cis-gpu-serve): onnxruntime.txt, serve.json (the cloud tier under --provider cuda and
# auto with cis infer through it, the bundle's CUDA latency profile), gpu-tests.log, runtime_overhead.json/.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cis-gpu-serve}"
parts="${PARTS:-/tmp/ort-parts}"
provider="${PROVIDER:-cuda}"
cifar="${CIFAR:-/tmp/cifar-gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then  # what the image lacks (pyzmq, msgspec, simpy, ...)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/cis-site .whl/*.whl
    export PYTHONPATH="/tmp/cis-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f "$parts/parts.json" ]; then  # onnxruntime-gpu from its parts, ahead of any onnxruntime of the image
    if [ ! -d /tmp/ort-gpu/onnxruntime ]; then  # a rerun on the same warm machine keeps the last install
        python3 scripts/gpu_parts.py join "$parts" /tmp/ort-wheel
        if compgen -G "/tmp/ort-wheel/*.whl" >/dev/null; then
            python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ort-gpu /tmp/ort-wheel/*.whl
        else  # the wheel's files as a .tar.xz (4 parts instead of 5; see the top of this file)
            mkdir -p /tmp/ort-gpu && tar -xJf /tmp/ort-wheel/*.tar.xz -C /tmp/ort-gpu
        fi
    fi
    export PYTHONPATH="/tmp/ort-gpu${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# torch's CUDA libraries (site-packages/nvidia/*/lib) on the loader path of every process started from here
cuda_libs="$(python3 - <<'EOF'
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "**", "lib"), recursive=True)})))
EOF
)"
export LD_LIBRARY_PATH="${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.__file__, o.get_available_providers())" \
    | tee "$out/onnxruntime.txt"
status=0
python3 scripts/gpu_serve_check.py --provider "$provider" --out "$out" 2>&1 | tee "$out/serve.log" || status=1
# every test marked gpu: training on CUDA, and now --provider cuda serving (TensorRT's skip: no TensorRT there)
python3 -m pytest -q -rs -m gpu tests/test_device.py tests/test_export.py tests/test_serve_tiers.py 2>&1 \
    | tee "$out/gpu-tests.log" || status=1
if [ "${OVERHEAD:-1}" = 1 ] && [ -d "$cifar" ]; then  # per-hop overhead with a core per node (--spin), quick: the budget is 15 minutes
    python3 -m bench.runtime_overhead --quick --spin --data "$cifar" --work /tmp/cis-overhead \
        --out gpu_runtime_overhead 2>&1 | tail -20 | tee "$out/overhead.log" || status=1
    cp bench/results/gpu_runtime_overhead.* "$out/" 2>/dev/null || true
else
    echo "no CIFAR-10 at $cifar: overhead benchmark skipped" | tee "$out/overhead.log"
fi
exit "$status"
