#!/bin/bash
# One campaign process: runs every line of a queue file (benchmark command lines, e.g.
# "-m bench.table1 --commit") in order from the campaign worktree; start one per core.
# Runs are shared between processes through lock files and resume from their checkpoints.
# Usage: nohup scripts/campaign.sh QUEUE [WORKTREE] > driverK.log 2>&1 &
set -u
Q=${1:?usage: campaign.sh QUEUE [WORKTREE]}
cd "${2:-/work/wt/campaign}" || exit 2
n=0
while true; do
  line=$(sed -n "$((n+1))p" "$Q")  # re-read each step: lines after the current one may be rewritten
  [ -z "$line" ] && break
  n=$((n+1))
  echo "=== $(date +%T) $line" >&2
  # shellcheck disable=SC2086
  .venv/bin/python $line
done
echo "=== $(date +%T) queue done" >&2
