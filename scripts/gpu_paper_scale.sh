#!/usr/bin/env bash
# Issue 35, item 5: make a paper-scale run faster on a lent GPU, then start equal and serving-rate at 5-15-80,
# seed 1, as far as the time allows, with checkpoints that a later lent session resumes.
#
# Paper scale: ResNet18EE at width 1, 100 rounds, 118 local steps a round (the paper's root SGD steps), 5,000
# validation images and every other training image (35,000: this project's CIFAR-10 copy, the JPEG zip in
# ../shared/data, has 40,000 training images, not the paper's 50,000). 9.5 min a run on an H100 in fp32 at
# 18,588 images/s (bench/results/gpu_check.md).
#
# Modes (each one call of the device tool; the whole call ends inside LIMIT_S seconds, default 470):
#   run      1. the CUDA-graph test (tests/test_compute_options.py -m gpu): graphs are measured only if it passes;
#            2. bench/train_device_speed.py --paper-scale: fp32, channels_last, bf16, CUDA graphs and their
#               combinations, PROBE_ROUNDS rounds of PROBE_STEPS steps each, in one process; then the fastest
#               in 2 and 4 processes sharing the GPU (runs side by side);
#            3. equal and serving-rate (STRATEGIES) as paper-scale runs at the fastest setting, side by side, each
#               stopped at the deadline (a checkpoint after every round; a kill keeps the last one);
#            4. each run dir packed (checkpoint.pt of ~92 MiB: the weights and the nodes' momentum) and split in
#               PART_SIZE parts (14M); $OUT gets paper_speed.json, paper_scale.log, manifest.json and the first
#               PARTS_PER_CALL parts (a call brings back at most 8 files, 64 MiB).
#   fetch K  the K-th batch of parts and manifest.json to $OUT. Call it right after 'run' (the machine stays
#            warm 30 s after a call; a fresh one has no parts): K = 1, 2, ... up to manifest.json's batches - 1.
#   stage    a later session, first: copies the parts carried in .gpu-parts/ (at most ~56 MiB a call) to the
#            machine; repeat with the next parts, each call within 30 s of the last.
#   resume   then: reassembles the staged runs and continues them (cis train --resume) to the deadline, packs
#            and returns them as 'run' does (fetch the rest the same way).
#   assemble SRC [DEST]   here, not on the device: checks the parts in SRC against SRC/manifest.json and unpacks
#            every complete run into DEST (default /tmp/cis-bench/paper_scale).
#
# Before the first call, in the repo root of the checkout the device tool sends (its ignored paths travel
# only when named in carry):
#   echo /.gpu/ >> .git/info/exclude; echo /.whl/ >> .git/info/exclude; echo /.gpu-parts/ >> .git/info/exclude
#   mkdir -p .gpu && cp ../shared/data/cifar10-jpeg.zip .gpu/       # 49.4 MiB: the data, unzipped there
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl tomli-w   # the one package training needs there
# Then: run(command="bash scripts/gpu_paper_scale.sh run", carry=[".gpu", ".whl"], timeout_s=540)
#       run(command="bash scripts/gpu_paper_scale.sh fetch 1") ... at once, one call per batch
# Here: bash scripts/gpu_paper_scale.sh assemble FILES_AT (each call's files_at; copy them into one folder first).
# A later session: put manifest.json and the next <= 4 parts in .gpu-parts/, run(command="bash
# scripts/gpu_paper_scale.sh stage", carry=[".gpu-parts"]), repeat, then run(command="bash
# scripts/gpu_paper_scale.sh resume", carry=[".gpu", ".whl"], timeout_s=540).
#
# Every setting has an environment override, so the script runs on a CPU with tiny settings (its smoke test):
#   DEVICE=cpu DATA=/tmp/cifar10 WIDTH=0.0625 LOCAL_STEPS=2 PROBE_STEPS=2 PROBE_ROUNDS=2 ROUNDS=3 VAL_SIZE=500 \
#   TRAIN_SUBSET=1400 PROCS_PROBE=2 PART_SIZE=64K LIMIT_S=400 OUT=/tmp/paper-out bash scripts/gpu_paper_scale.sh run
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
mode="${1:-run}"
out="${OUT:-/tmp/cis-paper-out}"
work="${WORK:-/tmp/paper-scale}"
data="${DATA:-/tmp/cifar10-paper}"
device="${DEVICE:-cuda}"
limit="${LIMIT_S:-470}"
part_size="${PART_SIZE:-14M}"
per_call="${PARTS_PER_CALL:-4}"
strategies="${STRATEGIES:-equal serving-rate}"
width="${WIDTH:-1}"
rounds="${ROUNDS:-100}"
steps="${LOCAL_STEPS:-118}"
val="${VAL_SIZE:-5000}"
subset="${TRAIN_SUBSET:-}"
probe_steps="${PROBE_STEPS:-16}"
probe_rounds="${PROBE_ROUNDS:-4}"
procs_probe="${PROCS_PROBE:-2 4}"
pack_s="${PACK_S:-40}"
train_min="${TRAIN_MIN_S:-210}"  # the probes stop short of this much training time
if [ "$device" = cuda ]; then
    variants="${VARIANTS:-fp32,channels_last,bf16,channels_last+bf16,graphs,graphs+channels_last,graphs+channels_last+bf16}"
else
    variants="${VARIANTS:-fp32,channels_last,bf16}"  # CUDA graphs need a CUDA device
fi
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
mkdir -p "$out" "$work/runs"
log="$work/paper_scale.log"
say() { echo "[$(date +%T), $(left) s left] $*" | tee -a "$log"; }
export PYTHONUNBUFFERED=1

setup() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/cis-site .whl/*.whl
        export PYTHONPATH="/tmp/cis-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import torch, tomli_w" 2>/dev/null \
        || { say "python3 lacks torch or tomli_w: carry .whl with the tomli-w wheel (see the header)"; exit 2; }
    if [ ! -d "$data/train" ]; then
        [ -f .gpu/cifar10-jpeg.zip ] || { say "no data: carry .gpu/cifar10-jpeg.zip (see the header)"; exit 2; }
        python3 -m zipfile -e .gpu/cifar10-jpeg.zip "$data"
    fi
    # decode the images once (cis/training/data/loading.py caches them) and say what the split holds
    timeout "$(( $(left) > 120 ? 120 : $(left) ))" python3 -c "
from cis.training.data.loading import load_dataset
s = load_dataset('cifar10:$data', seed=1, val_size=$val)
print('CIFAR-10 at $data:', len(s.train), 'training,', len(s.val), 'validation,', len(s.test), 'test images')
" 2>&1 | tee -a "$log"
}

scale_flags() {  # the paper-scale flags of bench/train_device_speed.py
    echo "--device $device --paper-scale --width $width --val-size $val ${subset:+--train-subset $subset} --data $data"
}

probe() {
    local graphs_ok=0 t
    if [ "$device" = cuda ]; then
        say "CUDA graphs against eager steps on this GPU (tests/test_compute_options.py -m gpu)"
        timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_compute_options.py 2>&1 | tail -3 \
            | tee -a "$log" | grep -q " passed" && graphs_ok=1
        if [ "$graphs_ok" = 0 ]; then
            variants="$(echo "$variants" | tr ',' '\n' | grep -v graphs | paste -sd, -)"
            say "the graph test did not pass: variants without graphs: $variants"
        fi
    fi
    t=$(( $(left) - pack_s - train_min )); [ "$t" -gt 150 ] && t=150
    if [ "$t" -lt 30 ]; then say "no time to probe"; echo "${TRAIN_VARIANT:-fp32}" > "$work/best"; return; fi
    say "probe: $variants, $probe_rounds rounds of $probe_steps steps each"
    # shellcheck disable=SC2046
    timeout "$t" python3 -m bench.train_device_speed $(scale_flags) --local-steps "$probe_steps" \
        --rounds "$probe_rounds" --variants "$variants" --out paper_speed 2>&1 | grep -v "^wrote" | tee -a "$log"
    python3 -c "import json; print(json.load(open('bench/results/paper_speed.json'))['best'])" \
        > "$work/best" 2>/dev/null || echo fp32 > "$work/best"
    local best n k names
    best="${TRAIN_VARIANT:-$(cat "$work/best")}"
    echo "$best" > "$work/best"
    say "fastest: $best"
    for n in $procs_probe; do
        t=$(( $(left) - pack_s - train_min )); [ "$t" -gt 50 ] && t=50
        [ "$t" -lt 25 ] && { say "no time for $n processes side by side"; break; }
        names=""
        for k in $(seq "$n"); do
            # shellcheck disable=SC2046
            timeout "$t" python3 -m bench.train_device_speed $(scale_flags) --local-steps "$probe_steps" \
                --rounds "$probe_rounds" --variants "$best" --out "paper_speed_${n}x_$k" > "$work/probe-$n-$k.log" 2>&1 &
            names="$names${names:+,}paper_speed_${n}x_$k"
        done
        wait
        python3 -m bench.train_device_speed --combine "$names" --out "paper_speed_${n}x" 2>&1 | grep -v "^wrote" \
            | tee -a "$log"
    done
    python3 - "$out/paper_speed.json" <<'EOF'
import json, sys
from pathlib import Path
results = Path("bench/results")
merged = {f.stem: json.loads(f.read_text()) for f in sorted(results.glob("paper_speed*.json"))}
Path(sys.argv[1]).write_text(json.dumps(merged, indent=1))
EOF
}

write_config() {  # the paper-scale run's settings, at the fastest variant
    python3 - "$work/paper.json" "$(cat "$work/best")" <<EOF
import json, sys
from bench.train_device_speed import variant_settings
config = {"dataset": "cifar10:$data", "serving": "5-15-80", "seed": 1, "width": float("$width"), "rounds": $rounds,
          "val_size": $val, "local_steps": $steps, "eval_every": 10, "checkpoint_every": 1, "device": "$device",
          **({"train_subset": int("$subset")} if "$subset" else {}), **variant_settings(sys.argv[2])}
open(sys.argv[1], "w").write(json.dumps(config, indent=1))
print("paper-scale config:", json.dumps(config))
EOF
}

train() {  # $1: new | resume
    local budget s
    budget=$(( $(left) - pack_s ))
    if [ "$budget" -lt 30 ]; then say "no time left to train"; return; fi
    say "training $strategies side by side for at most $budget s ($1)"
    for s in $strategies; do
        if [ "$1" = resume ] && [ -f "$work/runs/$s/config.json" ]; then
            timeout "$budget" python3 -m cis.cli.main train --out "$work/runs/$s" --resume --no-progress > "$work/train-$s.log" 2>&1 &
        elif [ "$1" = new ]; then
            timeout "$budget" python3 -m cis.cli.main train --config "$work/paper.json" --strategy "$s" --out "$work/runs/$s" \
                --no-progress > "$work/train-$s.log" 2>&1 &
        fi
    done
    wait
    for s in $strategies; do tail -n 2 "$work/train-$s.log" 2>/dev/null | sed "s/^/$s: /" | tee -a "$log"; done
}

pack() {  # every run dir that has a checkpoint: one tar, split in parts; manifest.json says which batch holds each
    rm -rf "$work/parts"; mkdir -p "$work/parts"
    local s files
    for s in $strategies; do
        [ -f "$work/runs/$s/checkpoint.pt" ] || continue
        files=$(cd "$work/runs" && ls -d "$s"/checkpoint.pt "$s"/checkpoint.json "$s"/config.json "$s"/metrics.jsonl \
            "$s"/spec.toml "$s"/weights.json "$s"/summary.json 2>/dev/null)
        # shellcheck disable=SC2086
        tar -C "$work/runs" -cf "$work/paper-$s.tar" $files
        split -b "$part_size" -d -a 2 "$work/paper-$s.tar" "$work/parts/paper-$s.tar.part-"
        rm -f "$work/paper-$s.tar"
    done
    python3 - "$work" "$per_call" <<'EOF'
import hashlib, json, sys
from pathlib import Path
work, per_call = Path(sys.argv[1]), int(sys.argv[2])
parts = sorted((work / "parts").glob("paper-*.tar.part-*"))
runs = {}
for meta in sorted((work / "runs").glob("*/checkpoint.json")):
    rounds = json.loads((meta.parent / "config.json").read_text()).get("rounds")
    runs[meta.parent.name] = {"round": json.loads(meta.read_text()).get("round"), "rounds": rounds,
                              "finished": (meta.parent / "summary.json").is_file()}
manifest = {
    "runs": runs,
    "parts": [{"name": p.name, "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
               "batch": k // per_call} for k, p in enumerate(parts)],
    "batches": (len(parts) + per_call - 1) // per_call,
}
(work / "manifest.json").write_text(json.dumps(manifest, indent=1))
print("packed:", json.dumps(runs), f"{len(parts)} parts in {manifest['batches']} batches")
EOF
}

emit() {  # batch $1 of the parts and the manifest to $OUT
    [ -f "$work/manifest.json" ] || { say "nothing packed on this machine (a fresh one?)"; return 1; }
    local batches
    batches=$(python3 -c "import json; print(json.load(open('$work/manifest.json'))['batches'])")
    if [ "$1" -ge "$batches" ] && [ "$1" -gt 0 ]; then say "no batch $1: the parts are in batches 0..$(( batches - 1 ))"; return 1; fi
    cp "$work/manifest.json" "$out/"
    python3 - "$work" "$1" <<'EOF' | while read -r f; do cp "$work/parts/$f" "$out/"; done
import json, sys
from pathlib import Path
m = json.loads((Path(sys.argv[1]) / "manifest.json").read_text())
for p in m["parts"]:
    if p["batch"] == int(sys.argv[2]):
        print(p["name"])
EOF
    say "batch $1 (of batches 0..$(( batches - 1 ))) in \$OUT"
}

assemble() {  # $1: folder with manifest.json and parts; $2: where the run dirs go
    python3 - "$1" "$2" <<'EOF'
import hashlib, json, subprocess, sys
from pathlib import Path
src, dest = Path(sys.argv[1]), Path(sys.argv[2])
m = json.loads((src / "manifest.json").read_text())
dest.mkdir(parents=True, exist_ok=True)
by_run = {}
for p in m["parts"]:
    by_run.setdefault(p["name"].split(".tar.part-")[0].removeprefix("paper-"), []).append(p)
for run, parts in by_run.items():
    missing = [p["name"] for p in parts if not (src / p["name"]).is_file()]
    if missing:
        print(f"{run}: {len(missing)} of {len(parts)} parts missing ({', '.join(missing)})")
        continue
    bad = [p["name"] for p in parts if hashlib.sha256((src / p["name"]).read_bytes()).hexdigest() != p["sha256"]]
    if bad:
        print(f"{run}: parts with another sha256 than the manifest's: {', '.join(bad)}")
        continue
    tar = dest / f"paper-{run}.tar"
    with tar.open("wb") as f:
        for p in sorted(parts, key=lambda p: p["name"]):
            f.write((src / p["name"]).read_bytes())
    subprocess.run(["tar", "-C", str(dest), "-xf", str(tar)], check=True)
    tar.unlink()
    print(f"{run}: round {m['runs'].get(run, {}).get('round')} of {m['runs'].get(run, {}).get('rounds')} in {dest / run}")
EOF
}

finish() { cp "$log" "$out/paper_scale.log" 2>/dev/null; }

case "$mode" in
    run)
        trap finish EXIT
        say "paper-scale speed and runs on $device (limit $limit s)"
        setup
        probe
        write_config 2>&1 | tee -a "$log"
        train new
        pack 2>&1 | tee -a "$log"
        emit 0
        ;;
    resume)
        trap finish EXIT
        setup
        if compgen -G "$work/in/*.part-*" >/dev/null; then assemble "$work/in" "$work/runs" 2>&1 | tee -a "$log"; fi
        train resume
        pack 2>&1 | tee -a "$log"
        emit 0
        ;;
    fetch) emit "${2:?fetch K: which batch}" ;;
    stage)
        mkdir -p "$work/in"
        cp .gpu-parts/* "$work/in/" && echo "staged: $(ls "$work/in" | wc -l) files in $work/in"
        ;;
    assemble) assemble "${2:?assemble SRC [DEST]}" "${3:-/tmp/cis-bench/paper_scale}" ;;
    *) echo "usage: $0 run | fetch K | stage | resume | assemble SRC [DEST]" >&2; exit 2 ;;
esac
