#!/usr/bin/env bash
# v36: is v34's "compile alone plans worse" a cost of the compiled step or rounding scatter?
# 500 AR steps on v34's smaller mix (../report_nano_v34/ab_config.yaml), each run one stage; see README.md here.
#   F<seed>: float32 eager, 2 torch threads (v34's float32 runs were seeds 23, 24)
#   R<seed>: float32 eager, 1 torch thread: the same run as F<seed> with only the rounding changed
#            (matrix products split over a different thread count; 5 steps: weights within 2.3e-6)
#   C<seed>: train.compile=true, 2 threads (v34's compile-alone runs were seeds 23, 24)
# Usage: bash training/results/report_nano_v36/run_ab.sh   (from the repo root; skips finished runs)
set -euo pipefail
CFG=training/results/report_nano_v34/ab_config.yaml
OUT=runs/ab_v36
run() {  # name seed threads [extra --set ...]
  local name=$1 seed=$2 threads=$3; shift 3
  if [ -f "$OUT/$name/ar/summary.json" ]; then echo "[$name] done"; return; fi
  local t0=$SECONDS
  .venv/bin/wam-diff-train ar --config "$CFG" --max-steps 500 --no-progress \
    --set train.seed="$seed" --set train.threads="$threads" --set out="$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] $((SECONDS - t0)) s"
}
mkdir -p "$OUT"
run F23 23 2
run F24 24 2
run R23 23 1 & run R24 24 1 & wait
run C23 23 2 --set train.compile=true
run C24 24 2 --set train.compile=true
for s in 25 26; do run F$s $s 2; run C$s $s 2 --set train.compile=true; done
for s in 27 28; do run F$s $s 2; done
echo all done
