#!/usr/bin/env bash
# The peers of bench/peers/run.py (issue 34), installed where each fits:
#   .venv            the project's venv (scripts/setup.sh) + the 'peers' extra: ray[serve] (the same ray that
#                    flwr[simulation] pins), tritonclient[http] (the one HTTP client of every comparison), py-spy
#   .venv-kserve     kserve + onnxruntime + cis's core (it pins its own fastapi, uvicorn and pydantic)
#   .venv-mlserver   mlserver + onnxruntime + cis's core (likewise; no mlserver-onnx on the package index)
# The load generator, cis.Client, tritonclient and the Ray driver run in .venv; bench/peers/run.py starts the
# KServe and MLServer servers from their venvs as subprocesses. Rerunning it is cheap (pip skips what is there).
#     bash scripts/peers_setup.sh            # all three
#     PEERS_ONLY=kserve bash scripts/peers_setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
only="${PEERS_ONLY:-all}"
if [ "$only" = all ] || [ "$only" = ray ]; then
    [ -x .venv/bin/python ] || { echo "peers_setup: no .venv; run scripts/setup.sh first" >&2; exit 2; }
    .venv/bin/pip install -q -e '.[all,peers]'
fi
for peer in kserve mlserver; do
    if [ "$only" = all ] || [ "$only" = "$peer" ]; then
        [ -x ".venv-$peer/bin/python" ] || "$py" -m venv ".venv-$peer"
        # mlserver 1.7.1's parallel workers fail on uvloop >= 0.22 ("no current event loop"): the last that works
        extra=""; [ "$peer" = mlserver ] && extra="uvloop<0.22"
        ".venv-$peer/bin/pip" install -q "$peer" onnxruntime $extra
        ".venv-$peer/bin/pip" install -q -e .   # cis's core: the bundle reader and the stage runner
        ".venv-$peer/bin/python" -c "import $peer, onnxruntime, cis.core.stages.runner; print('$peer', $peer.__version__ if hasattr($peer, '__version__') else '')"
    fi
done
echo "peers_setup: ready (python -m bench.peers --quick to smoke)"
