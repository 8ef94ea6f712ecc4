#!/usr/bin/env bash
# Diffusion vs AR teacher (training/recipes/ablate_teacher.yaml), started when the previous job ends.
#   bash training/results/report_nano_v38/ablate_teacher.sh [PID_TO_WAIT_FOR]
set -u
cd "$(dirname "$0")/../../.."
PATH="$PWD/.venv/bin:$PATH"
OUT=runs/ablate_teacher_v38
mkdir -p "$OUT"
if [ $# -ge 1 ]; then
  while kill -0 "$1" 2>/dev/null; do sleep 10; done
fi
timed() { local name=$1; shift; /usr/bin/time -v "$@" > "$OUT/$name.log" 2>&1; echo "$name exit $? $(date -u +%H:%M:%S)"; }
timed recipe wam-diff-train recipe training/recipes/ablate_teacher.yaml --resume --only distill_tdiff,distill_tar
timed report wam-diff report --spec training/configs/report_ablate_teacher.yaml --out runs/ablate_teacher_report --no-closed-loop
