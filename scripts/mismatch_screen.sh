#!/bin/bash
# The FP8-engine screen of docs/results/small-mismatch (beyond the paper): the small preset's natural
# regime with rollout.dtype=fp8, GMPO / RSPO / GMPO+TIS / R3 / RSPO+TIS x seeds 0-2, 60 steps, two
# runs side by side with one thread each. Needs the small base: make main (or its pretrain job)
# first. A finished run is skipped on a rerun. Then:
#   python scripts/mismatch_screen_table.py OUT > table.md
set -u
OUT=${1:-results/small/mismatch-screen}
mkdir -p "$OUT"
run() {  # name base-run seed overrides...
  local name=$1 base=$2 seed=$3; shift 3
  [ -f "$OUT/$name/done" ] && return
  python -m rspo train --preset configs/small.yaml --run-name "$base-s$seed" --base-model results/small/models/base \
    --train-data results/small/data/countdown/train.jsonl --val val=results/small/data/countdown/val.jsonl \
    --out "$OUT/$name" --set rollout.dtype=fp8 --set schedule.total_steps=60 --set schedule.val_every=30 \
    --no-mlflow --quiet --threads 1 "$@" > "$OUT/$name.log" 2>&1 && touch "$OUT/$name/done"
  echo "$(date +%T) $name rc=$?" >> "$OUT/progress.txt"
}
runs=()
for s in 0 1 2; do
  runs+=("gmpo-s$s gmpo $s")
  runs+=("rspo-s$s gmpo-rs0.8 $s")
  runs+=("tis-s$s gmpo $s --set algorithm.rollout_correction=token_truncate")
  runs+=("r3-s$s gmpo $s --set algorithm.routing=rollout_replay")
  runs+=("rstis-s$s gmpo-rs0.8 $s --set algorithm.rollout_correction=token_truncate")
done
i=0
for r in "${runs[@]}"; do
  # shellcheck disable=SC2086
  run $r &
  i=$((i + 1))
  if [ $((i % 2)) = 0 ]; then wait; fi
done
wait
