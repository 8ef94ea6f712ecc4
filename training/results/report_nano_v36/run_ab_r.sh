#!/usr/bin/env bash
# v36, third part (added after test 1-4's results, before any result of these runs; README.md here, rule 5):
# R25, R26: F25, F26 with one torch thread (rounding only), run side by side, then scored like the others.
# Usage: bash training/results/report_nano_v36/run_ab_r.sh [SEED SEED]   (default 25 26; run_ab_r2.sh: 27 28)
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
A=${1:-25} B=${2:-26}
run R$A $A & run R$B $B & wait
common=(--data runs/fast/data_v1/val.json --samples 403 --out runs/ab_v36/l2 --resume)
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R$A=$OUT/R$A/ar/model > $OUT/eval_r$A.log 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" R$B=$OUT/R$B/ar/model > $OUT/eval_r$B.log 2>&1 &
wait
