#!/usr/bin/env bash
# v36, second part (rule fixed before any result, README.md here): S<seed>, all three switches as the quick recipe
# runs them (train.cpu_bf16, train.compile, distill.ar_teacher_clean_only; v34's "fast" runs were seeds 23, 24).
# Usage: bash training/results/report_nano_v36/run_ab_fast.sh   (after run_ab.sh; skips finished runs)
set -euo pipefail
CFG=training/results/report_nano_v34/ab_config.yaml
OUT=runs/ab_v36
mkdir -p "$OUT"
for s in 23 24 25 26; do
  name=S$s
  if [ -f "$OUT/$name/ar/summary.json" ]; then echo "[$name] done"; continue; fi
  t0=$SECONDS
  .venv/bin/wam-diff-train ar --config "$CFG" --max-steps 500 --no-progress --set train.seed=$s --set train.threads=2 \
    --set train.cpu_bf16=true --set train.compile=true --set distill.ar_teacher_clean_only=true \
    --set out="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "[$name] $((SECONDS - t0)) s"
done
echo all done
