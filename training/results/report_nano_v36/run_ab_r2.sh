#!/usr/bin/env bash
# v36, fourth part (rule 6, README.md here; fixed before any result of these runs):
# R27, R28: F27, F28 with one torch thread (rounding only), run side by side, then scored like the others.
set -euo pipefail
CFG=training/results/report_nano_v34/ab_config.yaml
OUT=runs/ab_v36
run() {
  local name=$1 seed=$2
  [ -f "$OUT/$name/ar/summary.json" ] && { echo "[$name] done"; return; }
  local t0=$SECONDS
  .venv/bin/wam-diff-train ar --config "$CFG" --max-steps 500 --no-progress --set train.seed="$seed" \
    --set train.threads=1 --set out="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "[$name] $((SECONDS - t0)) s"
}
run R27 27 & run R28 28 & wait
common=(--data runs/fast/data_v1/val.json --samples 403 --out runs/ab_v36/l2 --resume)
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R27=$OUT/R27/ar/model > $OUT/eval_r27.log 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R28=$OUT/R28/ar/model > $OUT/eval_r28.log 2>&1 &
wait
