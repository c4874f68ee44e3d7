#!/usr/bin/env bash
# Issue 22, item 6: the 5-15-80 cell at the larger scale on a lent GPU, beside issue 17's 80-15-5 cell
# (bench/results/table1_large: width 0.25, 100 rounds, 20,000 training and 1,000 validation images of the
# carried CIFAR-10 subset, tested on its 3,000 test images, 3 seeds). Equal's runs there already hold every
# serving setting, and auto at 5-15-80 is flops (cis/training/aggregation/weights.py: auto_choice), so this trains
# flops, serving-rate and balanced-adj: 9 runs, PROCS processes sharing the GPU through the campaign's lock files.
#
# First the cost of one run at the paper's width (1.0), 3 rounds of bench/train_device_speed.py: what a
# paper-scale cell would cost. Then the cell, each process stopped after BUDGET_S seconds; a later call on the
# same warm machine resumes every unfinished run from its checkpoint in /tmp/large-runs.
#
# There, after scripts/gpu_serve_check.sh has installed the wheels (/tmp/cis-site) and the data is unpacked
# (python3 scripts/gpu_data.py unpack .gpu /tmp/cifar-gpu):
#     run(command="bash scripts/gpu_large_cell.sh", timeout_s=...)
# Writes $OUT: table1_large_runs.tgz (the finished run files; untar here in the repo root), large.log,
# train_device_speed_cuda_w1.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cis-gpu-large}"
data="${CIFAR:-/tmp/cifar-gpu}"
budget="${BUDGET_S:-400}"
procs="${PROCS:-9}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -d /tmp/cis-site ] && export PYTHONPATH="/tmp/cis-site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$data" ] || python3 scripts/gpu_data.py unpack .gpu "$data"
if [ ! -f /tmp/w1-done ] && [ "${PROBE:-1}" = 1 ]; then
    timeout 120 python3 -m bench.train_device_speed --device cuda --width 1 --train-subset 20000 \
        --val-size 1000 --rounds 3 --data "$data" --out train_device_speed_cuda_w1 2>&1 | tail -4 && touch /tmp/w1-done
    cp bench/results/train_device_speed_cuda_w1.json "$out/" 2>/dev/null
fi
for k in $(seq "$procs"); do
    timeout "$budget" python3 -m bench.table1 --large --settings 5-15-80 \
        --strategies flops,serving-rate,balanced-adj --data "$data" --val-size 1000 --threads 1 \
        --runs /tmp/large-runs > "/tmp/large-$k.log" 2>&1 &
    sleep 1
done
wait
for k in $(seq "$procs"); do tail -c 600 "/tmp/large-$k.log" | tr '\r' '\n' | tail -3; done | tee "$out/large.log"
ls bench/results/table1_large/runs/ | tee -a "$out/large.log"
tar -czf "$out/table1_large_runs.tgz" bench/results/table1_large/runs/*.json bench/results/table1_large/scale.json
