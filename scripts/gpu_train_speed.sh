#!/usr/bin/env bash
# Training-step variants on a GPU machine: `wam-diff-train speed` (training/speed.py) with the step switches
# (float32, bf16 autocast, + the clean AR teacher, + compiled text layers) at B = 1 (AR) and B = 32 (distillation
# from the AR checkpoint), rows interleaved on the same batches.
#
#   scripts/gpu_train_speed.sh DATA_DIR OUT_DIR [DEVICE]
#
# DATA_DIR holds train.json (+ its images/), init/ (a checkpoint, also the teacher) and optionally whl/ (wheels the
# machine lacks, e.g. transformers at this project's pin; installed into a private target, not the system). With the
# device tool: carry ["runs/gpu_data"] and run `bash scripts/gpu_train_speed.sh runs/gpu_data $OUT` (nothing else
# travels: the tracked models' safetensors can stay out of the tree).
set -u
cd "$(dirname "$0")/.."
DATA=${1:?usage: scripts/gpu_train_speed.sh DATA_DIR OUT_DIR [DEVICE]}
OUT=${2:?usage: scripts/gpu_train_speed.sh DATA_DIR OUT_DIR [DEVICE]}
DEVICE=${3:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SITE=/tmp/wam_train_site
if ls "$DATA"/whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DATA"/whl/*.whl \
        > "$OUT/env.txt" 2>&1 || echo "wheel install FAILED (see env.txt)"
fi
export PYTHONPATH="$(pwd):$SITE${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } >> "$OUT/env.txt" 2>&1
for bs in ${BATCH_SIZES:-8 32}; do
    timeout --signal=INT --kill-after=15 "${LIMIT:-150}" $PY -m training.cli speed --device "$DEVICE" \
        --init "$DATA/init" --teacher "$DATA/init" --data "$DATA/train.json" --block-sizes 1,32 \
        --batch-size "$bs" --steps "${STEPS:-20}" --warmup "${WARMUP:-3}" \
        --variants "${VARIANTS:-float32,bf16,bf16+clean,bf16+compile+clean}" \
        --json "$OUT/train_speed_b$bs.json" 2>&1 | grep -v "Loading weights" | tee -a "$OUT/train_speed.txt"
done
