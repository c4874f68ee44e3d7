#!/bin/sh
# Install cis-inference with the extras of a tier into a new virtualenv: what the images run (deploy/Dockerfile.cpu,
# deploy/Dockerfile.gpu) and what tests/test_deploy_images.py runs in a fresh venv, so the two cannot drift.
#
#   sh deploy/install.sh EXTRAS WHEELS VENV
#
# EXTRAS: cpu or gpu, optionally with more (cpu,http,grpc); WHEELS: a folder holding one cis_inference wheel
# (pip wheel --no-deps -w WHEELS .); VENV: the virtualenv to make. Its dependencies come from the package index.
set -eu
if [ "$#" -ne 3 ]; then
    echo "usage: sh deploy/install.sh EXTRAS WHEELS VENV (e.g. cpu /wheels /opt/cis)" >&2
    exit 2
fi
extras="$1"
wheels="$2"
venv="$3"
set -- "$wheels"/cis_inference-*.whl
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then
    echo "install.sh: expected one cis_inference-*.whl in $wheels" >&2
    exit 2
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --disable-pip-version-check "$1[$extras]"
"$venv/bin/cis" --version
