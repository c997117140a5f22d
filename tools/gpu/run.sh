#!/usr/bin/env bash
# The GPU check of issue 13, run on the device machine from the repository root with gpu-bin/
# (tools/gpu/build.sh) carried. Builds nothing. Each stage has its own time limit and writes its
# JSON (or log) under $OUT as soon as it ends, with its exit status in $OUT/stages.jsonl, so a
# lease that runs out still returns the finished stages. All stages fit in about 8 minutes.
#
#     tools/gpu/run.sh              # on the GPU machine
#     tools/gpu/run.sh --dry-run    # on CPU with `build.sh --cpu` binaries and the `test` size
#
# Stages: env (driver, torch); cuda-tests (tests/cuda.rs); models (random SDAR-1.7B and 8B
# shapes, bf16, made on the GPU by ../shared/gpu/make_model.py); torch (the PyTorch peer,
# bf16 and f32, TF32 off); forward (spot bench-forward at B = 1..32 on the same weights in bf16
# and f32, head on the device and on the host); bench (spot bench on the shipped target: 20 HumanEval prompts,
# T 0 and 1, draft-free vs SPOT D 8 and 20, same tokens, wall time); batch (spot generate
# --batch 1 vs 16 on 16 prompts: same lines, tokens/s).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/spot-gpu-out}
mkdir -p "$OUT"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BIN=gpu-bin
WORK=${TMPDIR:-/tmp}/spot-gpu-work
mkdir -p "$WORK"
start=$(date +%s)

stage() { # stage NAME LIMIT_S COMMAND... : stdout -> $OUT/NAME.out, stderr -> $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0 rc
    t0=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.log"
    rc=$?
    printf '{"stage": "%s", "rc": %d, "seconds": %d, "at": %d}\n' "$name" "$rc" \
        "$(( $(date +%s) - t0 ))" "$(( $(date +%s) - start ))" | tee -a "$OUT/stages.jsonl"
    return 0
}

for f in spot cuda-tests; do
    if [ -f "$BIN/$f.xz" ]; then
        xz -dc "$BIN/$f.xz" > "$WORK/$f" && chmod +x "$WORK/$f"
    fi
done
SPOT=$WORK/spot
# CubeCL reads cubecl.toml from the working directory: compiled kernels (PTX) are cached on disk
# and autotune results kept beside them, so each kernel compiles once per machine and the
# figures' first calls (b*_first_ms) show what compilation costs. Removed at exit.
cat > cubecl.toml <<EOF
[compilation]
cache = { file = "$WORK/cubecl" }
[autotune]
cache = { file = "$WORK/cubecl" }
EOF
trap 'rm -f cubecl.toml' EXIT

if [ $DRY = 1 ]; then
    SIZES=(test) DTYPES=(bfloat16 float32) BATCHES=1,21 REPS=3 LIMIT=2 TOKENS=32
else
    SIZES=(1.7b 8b) DTYPES=(bfloat16 float32) BATCHES=1,2,4,8,16,21,32 REPS=10 LIMIT=20 TOKENS=128
fi

stage env 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1;
    python3 -c "import torch, transformers; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__)" 2>&1;
    '"$SPOT"' --version 2>&1; nproc; free -g | head -2'
SPOT_FIXTURES=$PWD/crates/spot-models/tests/fixtures \
    stage cuda-tests 180 "$WORK/cuda-tests" --test-threads 1 --nocapture
for size in "${SIZES[@]}"; do
    stage "model-$size" 120 python3 "$BIN/make_model.py" --out "$WORK/sdar-$size" --size "$size" \
        --dtype "${DTYPES[0]}"
done
for size in "${SIZES[@]}"; do
    for dtype in "${DTYPES[@]}"; do
        [ "$size" = 8b ] && [ "$dtype" = float32 ] && continue
        batches=$BATCHES
        [ "$size" = 8b ] && batches=1,21
        stage "torch-$size-$dtype" 150 python3 "$BIN/torch_bench.py" --model "$WORK/sdar-$size" \
            --dtype "$dtype" --batches "$batches" --prefix 256 --reps "$REPS"
    done
    # Our forward on the same weights in the same types, head on the device and on the host,
    # side by side in one process per type.
    for dtype in "${DTYPES[@]}"; do
        [ "$size" = 8b ] && [ "$dtype" = float32 ] && continue
        ours=$([ "$dtype" = bfloat16 ] && echo bf16 || echo f32)
        stage "forward-$size-$ours" 150 "$SPOT" bench-forward --model "$WORK/sdar-$size" \
            --prefix 256 --batches "$([ "$size" = 8b ] && echo 1,21 || echo "$BATCHES")" \
            --reps "$REPS" --heads device,host --dtype "$ours"
    done
done
stage bench 180 "$SPOT" bench --prompts data/humaneval.jsonl --limit "$LIMIT" \
    --methods ssd,spot --budgets 8,20 --temperatures 0,1 --protocols fixed \
    --max-new-tokens "$TOKENS" --out "$OUT/bench"
# Several requests per forward (issue 14): 16 HumanEval prompts one at a time and 16 at a time
# through one model, draft-free; the lines must be identical, the summary gives tokens/s.
for b in 1 16; do
    stage "batch-$b" 90 "$SPOT" generate --prompts data/humaneval.jsonl --limit 16 \
        --max-new-tokens 64 --no-early-stop --method df --batch "$b"
done
echo "done in $(( $(date +%s) - start )) s; outputs in $OUT"
