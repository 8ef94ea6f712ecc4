#!/usr/bin/env bash
# v36: score every A/B run on the 403 dev plans (runs/fast/data_v1/val.json) with scripts/l2_gap.py, two processes
# of one torch thread each (decoding at batch 1 leaves the second core idle), then one table from the predictions.
set -euo pipefail
OUT=runs/ab_v36/l2
spec() { for n in "$@"; do printf '%s=runs/ab_v36/%s/ar/model ' "$n" "$n"; done; }
A=$(spec F23 F24 F25 F26 F27 F28 R23 R24)
B=$(spec C23 C24 C25 C26 S23 S24 S25 S26)
common=(--data runs/fast/data_v1/val.json --samples 403 --out "$OUT" --resume)
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" $A > runs/ab_v36/eval_a.log 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" $B > runs/ab_v36/eval_b.log 2>&1 &
wait
OMP_NUM_THREADS=1 .venv/bin/python scripts/l2_gap.py "${common[@]}" $A $B
.venv/bin/python scripts/run_groups.py "$OUT/l2_gap.json" --out runs/ab_v36/groups \
  "float32=F23,F24,F25,F26,F27,F28" "compile=C23,C24,C25,C26" "all three=S23,S24,S25,S26" "float32, 1 thread=R23,R24"
