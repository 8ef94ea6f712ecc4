#!/usr/bin/env bash
# v36, third part (added after test 1-4's results, before any result of these runs; README.md here, rule 5):
# R25, R26: F25, F26 with one torch thread (rounding only), run side by side, then scored like the others.
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
run R25 25 & run R26 26 & wait
common=(--data runs/fast/data_v1/val.json --samples 403 --out runs/ab_v36/l2 --resume)
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R25=$OUT/R25/ar/model > $OUT/eval_r25.log 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R26=$OUT/R26/ar/model > $OUT/eval_r26.log 2>&1 &
wait
