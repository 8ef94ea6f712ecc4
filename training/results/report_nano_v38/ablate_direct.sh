#!/usr/bin/env bash
# Progressive vs direct (training/recipes/ablate_direct.yaml), in its reading's order, started when the report ends.
#   bash training/results/report_nano_v38/ablate_direct.sh [PID_TO_WAIT_FOR]
# Each command's wall and exit status in runs/ablate_v38/<name>.log.
set -u
cd "$(dirname "$0")/../../.."
PATH="$PWD/.venv/bin:$PATH"
OUT=runs/ablate_v38
mkdir -p "$OUT"
if [ $# -ge 1 ]; then
  while kill -0 "$1" 2>/dev/null; do sleep 20; done
fi
timed() { local name=$1; shift; /usr/bin/time -v "$@" > "$OUT/$name.log" 2>&1; echo "$name exit $? $(date -u +%H:%M:%S)"; }
timed recipe wam-diff-train recipe training/recipes/ablate_direct.yaml --resume --only adapt_direct,distill_direct
[ -f runs/fast/nano_s_b32_direct/distill/model/config.json ] || { echo "distill_direct missing" >&2; exit 1; }
timed l2_distill python scripts/l2_gap.py --data runs/fast/data_plan/val.json --samples 1640 --forward-only on \
  --out "$OUT/l2_distill" "(a)+distill=runs/fast/nano_s_b32/distill/model" "(b)+distill=runs/fast/nano_s_b32_direct/distill/model"
timed l2_adapt python scripts/l2_gap.py --data runs/fast/data_plan/val.json --samples 1640 --forward-only on \
  --out "$OUT/l2_adapt" "(a) progressive=runs/fast/nano_s/block32/model" "(b) direct=runs/fast/nano_s_direct/block32/model"
for m in a:runs/fast/nano_s_b32 b:runs/fast/nano_s_b32_direct; do
  timed "${m%%:*}_suite" wam-diff drive --policy "${m#*:}/distill/model" --out "$OUT/${m%%:*}_suite" --seed-offsets 0 \
    --workers 2 --frame-size 256x128 --steps 4 --forward-only on
done
