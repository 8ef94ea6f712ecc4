#!/usr/bin/env bash
# GPU check of the fast decoding path (FlashInfer attention, CUDA-graph decoding): one prepared run on one GPU
# machine, its files in OUT_DIR (results/kernels/h200/ holds the last H200 run's).
#
#   scripts/gpu_check.sh --fetch-wheels   # on a machine with PyPI access: fetch the wheels into .whl/
#   scripts/gpu_check.sh OUT_DIR          # on the GPU machine: tests + ladders, results into OUT_DIR
#   scripts/gpu_check.sh --bf16-model models/nano-s-b32   # a bf16 copy in .gpu_models/ to carry, for
#       TESTS=flashinfer TF_MODELS="nano .gpu_models/nano-s-b32" LADDERS=.gpu_models/nano-s-b32
#
# The GPU machine has python3 with torch/triton/pytest but no network: the wheels it lacks travel in
# .whl/ (flashinfer-python 0.7.0 and its one import-time extra, apache-tvm-ffi; transformers at this
# project's pin, since the machine's own is older). With the device tool: carry [".whl"] (and ".gpu_models")
# and run `bash scripts/gpu_check.sh $OUT` with timeout_s 600; with .whl's 49 MB the tracked
# models/*/model.safetensors (30 MB) exceed the tool's 64 MiB, so move them out of the tree for the call
# (nothing here reads them). Steps are ordered so that what needs no FlashInfer lands first, each under its
# own time limit, and the ladders write their JSON after every row: a step that runs out of time still leaves
# what it measured. The limits sum to under 10 min with one TF_MODELS model (on an H200: about 4 min for the
# default steps, 7 min with every step and rung; the ladders may reach their limits).
# FlashInfer JIT-compiles its kernels on first use: `python -m wam_diff_kernels.jit_warmup` builds the four
# modules the backend loads (batch and single prefill, head sizes 64 and 128) in parallel processes,
# in the background while the SDPA tests run, so no timed run pays for a build. FLASHINFER_CUDA_ARCH_LIST
# limits the builds to this GPU, and the backend keeps to the FA2 family unless
# WAM_FLASHINFER_BACKEND=auto is set.
#
# Files written (the device tool brings back at most 8):
#   env.txt      the GPU, CUDA, torch / transformers / flashinfer versions, what FlashInfer lacks here
#   jit.log      the FlashInfer kernel builds
#   tests.log    tests/test_kernels_gpu.py and the teacher-forced checks' output
#   ladder.log   the ladders' output
#   summary.txt  each step's start, exit status and last lines, with the seconds since the start
#   tf_<model>.json      per TF_MODELS: top-1 agreement of each bf16 decoder variant with the float32 decode
#   ladder_<model>.json  per LADDERS: tokens/s, ms per token and agreement per rung, block size, K and batch
# Environment: TESTS=all|flashinfer|none (GPU test selection), TF_MODELS (teacher-forced check; default
# nano), TF_STEPS, LADDERS (default "nano qwen3-vl-2b"; a checkpoint directory works too), LADDER_RUNGS,
# LADDER_STEPS.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
FLASHINFER_PIN=${FLASHINFER_PIN:-flashinfer-python==0.7.0}
TRANSFORMERS_PIN=${TRANSFORMERS_PIN:-$(grep -E '^transformers==' requirements.txt | head -1)}

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    plat=""
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
        plat="$plat --platform $p"
    done
    # shellcheck disable=SC2086
    ${PIP:-$PY -m pip} download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d .whl "$FLASHINFER_PIN" "apache-tvm-ffi>=0.1.11,<0.2" "$TRANSFORMERS_PIN" || exit 1
    ls -la .whl
    du -sh .whl
    exit 0
fi

if [ "${1:-}" = "--bf16-model" ]; then
    # a bfloat16 copy of a checkpoint in .gpu_models/ (ignored; carry it): half the bytes for the device tool's
    # 64 MiB, for TF_MODELS / LADDERS=.gpu_models/NAME (the checks run in bfloat16; the float32 reference loads
    # it widened)
    src=${2:?usage: scripts/gpu_check.sh --bf16-model CHECKPOINT_DIR}
    dst=.gpu_models/$(basename "$src")
    grep -qx '/.gpu_models/' .git/info/exclude 2>/dev/null || echo '/.gpu_models/' >> .git/info/exclude
    rm -rf "$dst" && mkdir -p "$dst" || exit 1
    find "$src" -maxdepth 1 -type f ! -name model.safetensors ! -name README.md -exec cp {} "$dst/" \;
    $PY - "$src/model.safetensors" "$dst/model.safetensors" <<'PY' || exit 1
import sys
import torch
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}, sys.argv[2],
          metadata={"format": "pt"})
PY
    du -sh "$dst"
    exit 0
fi

OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR | --fetch-wheels | --bf16-model CHECKPOINT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
step() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/summary.txt"; }

# 1. wheels, environment
SITE=/tmp/wam_site
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        > "$OUT/env.txt" 2>&1 || step "wheel install FAILED (see env.txt)"
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
CAP=$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo "")
[ -n "$CAP" ] && export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-$CAP}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    echo "nvcc: $(command -v nvcc || echo 'not on PATH') $(nvcc --version 2>/dev/null | tail -1) CUDA_HOME=${CUDA_HOME:-unset}"
    echo "cores $(nproc), MemTotal $(grep MemTotal /proc/meminfo | awk '{print $2/1048576 " GiB"}')"
    $PY - <<'EOF' 2>&1
import sys, torch, transformers, kernels
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)
print("cuda available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
print("missing for flashinfer:", wam_diff_kernels.missing_for_flashinfer() or "nothing")
if wam_diff_kernels.flashinfer_installed():
    import flashinfer
    print("flashinfer", flashinfer.__version__)
EOF
} >> "$OUT/env.txt" 2>&1
step "environment: $(grep -E '^python|^missing' "$OUT/env.txt" | tr '\n' ' ')"

run_step() {  # run_step SECONDS LOG NAME -- command...
    local limit=$1 log=$2 name=$3
    shift 4
    step "$name (limit ${limit}s)"
    timeout --signal=INT --kill-after=15 "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    step "$name: exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
    tail -n 3 "$log" | sed 's/^/    /' >> "$OUT/summary.txt"
}

PYTEST=($PY -m pytest -q -rs --tb=short -p no:cacheprovider tests/test_kernels_gpu.py)
# 2. FlashInfer's JIT kernels, built in the background (one process per module, in parallel) while the
#    GPU tests that need no FlashInfer run: nothing is timed until the build has finished
JIT_LIMIT=${JIT_LIMIT:-150}
if [ -z "$(grep '^missing for flashinfer: nothing' "$OUT/env.txt")" ]; then
    step "jit warm-up skipped: flashinfer cannot run here (see env.txt)"
    JIT_PID=""
else
    step "jit warm-up started in the background (limit ${JIT_LIMIT}s)"
    timeout --signal=INT --kill-after=15 "$JIT_LIMIT" $PY -m wam_diff_kernels.jit_warmup --head-dims 64,128 \
        > "$OUT/jit.log" 2>&1 &
    JIT_PID=$!
fi
# 3. GPU tests that need no FlashInfer (captured SDPA decoding against the eager reference, no host sync;
#    TESTS=all, the default), and the teacher-forced check's variants that need no FlashInfer, per model of
#    TF_MODELS (wam_diff_kernels.teacher_forced: bf16 steps along a float32 decode)
TESTS=${TESTS:-all}
[ "$TESTS" = all ] && run_step 80 "$OUT/tests.log" "gpu tests, SDPA + CUDA graphs" -- "${PYTEST[@]}" -k "not flashinfer"
TF=($PY -m wam_diff_kernels.teacher_forced --device cuda --dtype bfloat16 --block-size 32 --steps ${TF_STEPS:-4,8})
tf_name() { basename "$1"; }
for model in ${TF_MODELS:-nano}; do
    run_step 55 "$OUT/tests.log" "teacher-forced $model, SDPA variants" -- "${TF[@]}" --model "$model" \
        --variants sdpa,fast,compiled --out "$OUT/tf_$(tf_name "$model").json"
done
if [ -n "$JIT_PID" ]; then
    wait "$JIT_PID"
    step "jit warm-up: exit $?"
    tail -n 6 "$OUT/jit.log" | sed 's/^/    /' >> "$OUT/summary.txt"
fi
# 4. FlashInfer tests and the teacher-forced FlashInfer variants (kernels already built)
[ "$TESTS" != none ] && run_step 70 "$OUT/tests.log" "gpu tests, FlashInfer" -- "${PYTEST[@]}" -k flashinfer
for model in ${TF_MODELS:-nano}; do
    run_step 55 "$OUT/tests.log" "teacher-forced $model, FlashInfer variants" -- "${TF[@]}" --model "$model" \
        --variants flashinfer,flashinfer_graph_plan,flashinfer_fast --append --out "$OUT/tf_$(tf_name "$model").json"
done
# 5. the ladders (LADDERS picks which; nano first: its diversified random weights make greedy token
#    comparisons mean something), AR -> B=32 SDPA eager -> + FlashInfer -> + CUDA graphs, K 8 and 16,
#    batch 1 and 8
for model in ${LADDERS:-nano qwen3-vl-2b}; do
    limit=90
    [ "$model" = qwen3-vl-2b ] && limit=220  # includes torch.compile of the compiled_graphs rung
    run_step $limit "$OUT/ladder.log" "ladder $model" -- $PY -m wam_diff_kernels.ladder --model "$model" --device cuda \
        --dtype bfloat16 --block-size 32 --steps ${LADDER_STEPS:-8,16} --batch-sizes 1,8 --new-tokens 96 --repeats 3 \
        ${LADDER_RUNGS:+--rungs $LADDER_RUNGS} --out "$OUT/ladder_$(tf_name "$model").json"
done
step "done"
