#!/usr/bin/env bash
# (p)'s evaluation in its rule's order (training/recipes/nano_s_p.yaml), started when the recipe ends.
#   bash training/results/report_nano_v37/eval_p.sh RECIPE_PID
# L2 + speed ((p-ar), (p), all 1,640 validation plans, forward-only bound); (p) on the suite (seed 0); (p-ar) on the
# suite; (p) on seeds 50000, 60000, 70000, 80000. Each command's wall and exit status in runs/eval_v37/<name>.log.
set -u
cd "$(dirname "$0")/../../.."
PATH="$PWD/.venv/bin:$PATH"
OUT=runs/eval_v37
mkdir -p "$OUT"
if [ $# -ge 1 ]; then
  while kill -0 "$1" 2>/dev/null; do sleep 20; done
fi
[ -f runs/fast/nano-s-b32-p/model.safetensors ] || { echo "export_p missing: the recipe did not finish" >&2; exit 1; }
timed() { local name=$1; shift; /usr/bin/time -v "$@" > "$OUT/$name.log" 2>&1; echo "$name exit $? $(date -u +%H:%M:%S)"; }
timed l2 python scripts/l2_gap.py --data runs/fast/data_plan/val.json --samples 1640 --forward-only on --out "$OUT/l2" \
  "(p-ar)=runs/fast/nano-s-ar-p" "(p)=runs/fast/nano-s-b32-p"
timed p_suite wam-diff drive --policy runs/fast/nano-s-b32-p --out "$OUT/p_suite" --seed-offsets 0 --workers 2 --frame-size 256x128
timed par_suite wam-diff drive --policy runs/fast/nano-s-ar-p --out "$OUT/par_suite" --seed-offsets 0 --workers 2 --frame-size 256x128
timed p_rest wam-diff drive --policy runs/fast/nano-s-b32-p --out "$OUT/p_rest" --seed-offsets 50000,60000,70000,80000 --workers 2 --frame-size 256x128
# Second try (rule fixed 03:57 UTC in the recipe, after the first decision): the speed pass, models taking turns.
timed speed python scripts/speed_pass.py --data runs/fast/data_plan/val.json --samples 64 --out "$OUT/speed" \
  "(p-ar)=runs/fast/nano-s-ar-p:forward" "(p)=runs/fast/nano-s-b32-p:forward"
