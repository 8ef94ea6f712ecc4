#!/usr/bin/env bash
# GPU check of the fast decoding path (FlashInfer attention, CUDA-graph decoding) in stages, each of which fits
# one 10-minute device call and writes one self-contained JSON, OUT_DIR/stage_<name>.json (its steps' exit
# status and seconds, the results its tools wrote, its log's last lines). A stage whose JSON exists is skipped,
# so a check cut off (or spread over several calls) resumes where it stopped; delete a stage's JSON, or name it
# in --redo, to run it again. results/kernels/h200/ holds the last H200 run's files.
#
#   scripts/gpu_check.sh --fetch-wheels   # on a machine with PyPI access: fetch the wheels into .whl/
#   scripts/gpu_check.sh [--budget S] [--stages A,B] [--redo A,B] [--resume-from DIR] [--dry-run] OUT_DIR
#   scripts/gpu_check.sh --bf16-model models/nano-s-b32   # a bf16 copy in .gpu_models/ to carry, for
#       TESTS=flashinfer TF_MODELS="nano .gpu_models/nano-s-b32" LADDER_NANO=.gpu_models/nano-s-b32
#
# Stages, in order, with their time limits on an H200 (seconds; a step that runs out of time still leaves what it
# measured, and the ladders write their rows as they go):
#   env            60  wheels, the GPU, CUDA, torch / transformers / flashinfer versions, what FlashInfer lacks
#   sdpa          135  tests/test_kernels_gpu.py -k "not flashinfer" (80), teacher-forced SDPA variants (55 per TF model)
#   flashinfer    275  FlashInfer's JIT build (150; cached on a warm machine), its GPU tests (70), teacher-forced
#                      FlashInfer variants (55 per TF model)
#   ladder-nano   240  the JIT build where FlashInfer runs (150, cached after the flashinfer stage) + nano's ladder (90)
#   ladder-2b-k8  370  the JIT build + the 2B architecture's ladder at K = 8 (220, torch.compile included)
#   ladder-2b-k16 370  the same at K = 16
# One call runs the pending stages in order while their limits fit in --budget (default 540 s: a 600 s call
# less the wheel install); the first pending stage always runs. With the device tool: carry [".whl",
# "runs/gpu_check"], run `bash scripts/gpu_check.sh $OUT --resume-from runs/gpu_check` with timeout_s 600, then
# copy the files that came back into runs/gpu_check/ for the next call. Back come at most 8 files: OUT_DIR holds
# the stage JSONs and summary.txt alone; full logs and the tools' own JSON stay in GPU_CHECK_WORK
# (default /tmp/gpu_check) on the machine. --dry-run prints what a call would run and skip, and runs nothing.
#
# The GPU machine has python3 with torch/triton/pytest but no network: the wheels it lacks travel in .whl/
# (flashinfer-python 0.7.0 and its one import-time extra, apache-tvm-ffi; transformers at this project's pin,
# since the machine's own is older). With .whl's 49 MB the tracked models/*/model.safetensors (30 MB) exceed
# the tool's 64 MiB, so move them out of the tree for the call (nothing here reads them).
# FlashInfer JIT-compiles its kernels on first use: `python -m wam_diff_kernels.jit_warmup` builds the four
# modules the backend loads (batch and single prefill, head sizes 64 and 128) in parallel processes, before any
# timed run. FLASHINFER_CUDA_ARCH_LIST limits the builds to this GPU, and the backend keeps to the FA2 family
# unless WAM_FLASHINFER_BACKEND=auto is set.
# Environment: TESTS=all|flashinfer|none (GPU test selection), TF_MODELS (teacher-forced check; default nano),
# TF_STEPS, LADDER_NANO (default nano), LADDER_2B (default qwen3-vl-2b; a checkpoint directory works too),
# LADDER_RUNGS, GPU_CHECK_WORK.
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

STAGES=(env sdpa flashinfer ladder-nano ladder-2b-k8 ladder-2b-k16)
TF_LIST=${TF_MODELS:-nano}
N_TF=$(echo "$TF_LIST" | wc -w)
JIT_LIMIT=${JIT_LIMIT:-150}
JIT_CACHED=15  # a JIT warm-up whose kernels an earlier stage of the same call built

stage_limit() {  # stage_limit NAME [JIT_SECONDS]: the stage's time limit, the sum of its steps' limits
    local jit=${2:-$JIT_LIMIT}
    case $1 in
        env) echo 60 ;;
        sdpa) echo $((80 + 55 * N_TF)) ;;
        flashinfer) echo $((jit + 70 + 55 * N_TF)) ;;
        ladder-nano) echo $((jit + 90)) ;;
        ladder-2b-k8 | ladder-2b-k16) echo $((jit + 220)) ;;
    esac
}

usage() {
    echo "usage: scripts/gpu_check.sh [--budget SECONDS] [--stages A,B] [--redo A,B] [--resume-from DIR] [--dry-run]" \
         "OUT_DIR | --fetch-wheels | --bf16-model CHECKPOINT_DIR" >&2
    exit 2
}
fail() { echo "gpu_check.sh: error: $*" >&2; exit 2; }
DRY=0; BUDGET=${GPU_CHECK_BUDGET:-540}; ONLY=""; REDO=""; FROM=""; OUT=""
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY=1 ;;
        --budget) BUDGET=${2:-}; shift ;;
        --stages) ONLY=${2:-}; shift ;;
        --redo) REDO=${2:-}; shift ;;
        --resume-from) FROM=${2:-}; shift ;;
        -*) usage ;;
        *) [ -z "$OUT" ] || usage; OUT=$1 ;;
    esac
    shift
done
[ -n "$OUT" ] || usage
case $BUDGET in '' | *[!0-9]*) fail "--budget '$BUDGET': expected whole seconds" ;; esac
for s in ${ONLY//,/ } ${REDO//,/ }; do
    case " ${STAGES[*]} " in *" $s "*) ;; *) fail "unknown stage '$s'; expected some of: ${STAGES[*]}" ;; esac
done
[ -z "$FROM" ] || [ -d "$FROM" ] || fail "--resume-from $FROM: not a directory"
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
if [ -n "$FROM" ]; then  # what earlier calls finished (their stage JSONs) counts as done here
    for f in "$FROM"/stage_*.json "$FROM"/summary.txt; do
        [ -f "$f" ] && [ ! -e "$OUT/$(basename "$f")" ] && cp "$f" "$OUT/"
    done
fi
[ $DRY = 1 ] || for s in ${REDO//,/ }; do rm -f "$OUT/stage_$s.json"; done

# The plan: pending stages in order while their limits fit in the budget (the first pending one always runs);
# after the first stage that does not fit, every later one waits for the next call too.
PLAN=(); LEFT=$BUDGET; DEFER=0; JIT_BUILT=0
for s in "${STAGES[@]}"; do
    [ -n "$ONLY" ] && case ",$ONLY," in *",$s,"*) ;; *) continue ;; esac
    if [ -f "$OUT/stage_$s.json" ] && ! { [ $DRY = 1 ] && case ",$REDO," in *",$s,"*) true ;; *) false ;; esac; }; then
        echo "plan: $s done (stage_$s.json), skipped"
        continue
    fi
    limit=$(stage_limit "$s" "$([ $JIT_BUILT = 1 ] && echo $JIT_CACHED || echo $JIT_LIMIT)")
    if [ $DEFER = 1 ] || { [ ${#PLAN[@]} -gt 0 ] && [ "$limit" -gt $LEFT ]; }; then
        DEFER=1
        echo "plan: $s left for the next call (limit $(stage_limit "$s")s, ${LEFT}s of the budget left)"
        continue
    fi
    PLAN+=("$s"); LEFT=$((LEFT - limit))
    case $s in flashinfer | ladder-*) JIT_BUILT=1 ;; esac
    echo "plan: $s runs (limit ${limit}s)"
done
[ $DRY = 1 ] && exit 0
[ ${#PLAN[@]} -gt 0 ] || { echo "every stage asked for is done: $OUT/stage_*.json"; exit 0; }

WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
mkdir -p "$WORK"
START=$(date +%s)
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
note() { echo "== [$(elapsed) s] $*" | tee -a "$OUT/summary.txt"; }

# the machine: wheels (once per machine), the paths, this GPU's architecture for FlashInfer's builds
SITE=/tmp/wam_site
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f "$SITE/.installed" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        > "$WORK/wheels.log" 2>&1 && touch "$SITE/.installed" || note "wheel install FAILED ($WORK/wheels.log)"
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
CAP=$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo "")
[ -n "$CAP" ] && export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-$CAP}
FI_MISSING=$($PY -c "import wam_diff_kernels as k; print(' and '.join(k.missing_for_flashinfer()))" 2>&1 | tail -n 1)

print_env() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    echo "nvcc: $(command -v nvcc || echo 'not on PATH') $(nvcc --version 2>/dev/null | tail -1) CUDA_HOME=${CUDA_HOME:-unset}"
    echo "cores $(nproc), MemTotal $(grep MemTotal /proc/meminfo | awk '{print $2/1048576 " GiB"}')"
    $PY - <<'EOF' 2>&1
import sys, torch, transformers, wam_diff_kernels
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)
print("cuda available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
print("missing for flashinfer:", " and ".join(wam_diff_kernels.missing_for_flashinfer()) or "nothing")
if wam_diff_kernels.flashinfer_installed():
    import flashinfer
    print("flashinfer", flashinfer.__version__)
EOF
}
export -f print_env
export PY

run_step() {  # run_step SECONDS NAME -- command...: into the stage's log, its exit status and seconds recorded
    local limit=$1 name=$2 t0 rc
    shift 3
    note "  $name (limit ${limit}s)"
    t0=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\t\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$STEPS"
    note "  $name: exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
}
skip_step() {  # skip_step NAME WHY
    printf '%s\tskipped\t0\t0\t%s\n' "$1" "$2" >> "$STEPS"
    note "  $1: skipped ($2)"
}
jit() {
    if [ -z "$FI_MISSING" ]; then
        run_step "$JIT_LIMIT" "jit warm-up" -- $PY -m wam_diff_kernels.jit_warmup --head-dims 64,128
    else
        skip_step "jit warm-up" "flashinfer cannot run here: $FI_MISSING"
    fi
}
PYTEST=($PY -m pytest -q -rs --tb=short -p no:cacheprovider tests/test_kernels_gpu.py)
TF=($PY -m wam_diff_kernels.teacher_forced --device cuda --dtype bfloat16 --block-size 32 --steps ${TF_STEPS:-4,8})
tf() {  # tf VARIANTS SUFFIX: the teacher-forced check of every TF model
    local model out
    for model in $TF_LIST; do
        out="$WORK/tf_$(basename "$model")_$2.json"
        run_step 55 "teacher-forced $model, $2 variants" -- "${TF[@]}" --model "$model" --variants "$1" --out "$out"
        RESULTS+=("$out")
    done
}
ladder() {  # ladder MODEL STEPS LIMIT FILE
    run_step "$3" "ladder $1, K = $2" -- $PY -m wam_diff_kernels.ladder --model "$1" --device cuda --dtype bfloat16 \
        --block-size 32 --steps "$2" --batch-sizes 1,8 --new-tokens 96 --repeats 3 ${LADDER_RUNGS:+--rungs $LADDER_RUNGS} \
        --out "$WORK/$4"
    RESULTS+=("$WORK/$4")
}

stage_env() { run_step 60 "environment" -- bash -c print_env; }
stage_sdpa() {
    if [ "${TESTS:-all}" = all ]; then
        run_step 80 "gpu tests, SDPA + CUDA graphs" -- "${PYTEST[@]}" -k "not flashinfer"
    else
        skip_step "gpu tests, SDPA + CUDA graphs" "TESTS=${TESTS}"
    fi
    tf sdpa,fast,compiled sdpa
}
stage_flashinfer() {
    jit
    if [ "${TESTS:-all}" != none ]; then
        run_step 70 "gpu tests, FlashInfer" -- "${PYTEST[@]}" -k flashinfer
    else
        skip_step "gpu tests, FlashInfer" "TESTS=none"
    fi
    tf flashinfer,flashinfer_graph_plan,flashinfer_fast flashinfer
}
# the ladders: AR -> B = 32 SDPA eager -> + FlashInfer -> + CUDA graphs -> fast / compiled layers, batch 1 and 8;
# nano first (its random weights make greedy token comparisons mean something)
stage_ladder_nano() { jit; ladder "${LADDER_NANO:-nano}" 8,16 90 "ladder_$(basename "${LADDER_NANO:-nano}").json"; }
stage_ladder_2b_k8() { jit; ladder "${LADDER_2B:-qwen3-vl-2b}" 8 220 ladder_2b_k8.json; }
stage_ladder_2b_k16() { jit; ladder "${LADDER_2B:-qwen3-vl-2b}" 16 220 ladder_2b_k16.json; }

finish_stage() {  # finish_stage NAME START LIMIT [RESULT FILES]: OUT/stage_NAME.json, written whole or not at all
    $PY - "$OUT/stage_$1.json" "$@" "$STEPS" "$LOG" "${RESULTS[@]}" <<'PY'
import json, os, sys, time

out, name, start, limit, *rest = sys.argv[1:]
steps_file, log, results = rest[0], rest[1], rest[2:]
steps = []
for line in open(steps_file).read().splitlines():
    step, rc, seconds, step_limit, why = line.split("\t")
    steps.append({"step": step, "exit": None if rc == "skipped" else int(rc), "seconds": int(seconds),
                  "limit_s": int(step_limit), "timed_out": rc == "124", "skipped": why or None})
ran = [s for s in steps if s["exit"] is not None]
status = "timed out" if any(s["timed_out"] for s in ran) else "ok" if all(s["exit"] == 0 for s in ran) else "failed"


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        return {"missing": f"{type(exc).__name__}: {exc}"}


record = {"stage": name, "status": status, "seconds": int(time.time()) - int(start), "limit_s": int(limit),
          "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": steps,
          "results": {os.path.basename(p): read(p) for p in results},
          "log_tail": open(log, errors="replace").read().splitlines()[-80:]}
with open(out + ".tmp", "w") as f:
    json.dump(record, f, indent=1)
os.replace(out + ".tmp", out)
print(status)
PY
}

note "gpu check: stages ${PLAN[*]} (budget ${BUDGET}s); missing for flashinfer: ${FI_MISSING:-nothing}"
for s in "${PLAN[@]}"; do
    LOG="$WORK/stage_$s.log"; STEPS="$WORK/stage_$s.steps"; RESULTS=()
    : > "$LOG"; : > "$STEPS"
    t0=$(date +%s)
    note "stage $s"
    "stage_${s//-/_}"
    note "stage $s: $(finish_stage "$s" "$t0" "$(stage_limit "$s")") -> stage_$s.json"
done
note "done"
