#!/usr/bin/env bash
# The GPU recipe of tools/train_target: trains a stronger SDAR target (<= 15M parameters, same
# tokenizer, block size and special ids as models/sdar-tiny-code), exports it, and scores it
# against the shipped model on the same held-out text. Run on the device machine from the
# repository root, after tools/train_target/gpu/prepare.sh here, with carry ["gpu-train"]:
#
#     OUT=$OUT tools/train_target/gpu/run.sh             # H200: everything in about 9.5 minutes
#     tools/train_target/gpu/run.sh --dry-run            # here, on the CPU, toy sizes, niced, 1 thread
#
# Stages, each with its own time limit, each appending its output to $OUT/run.log as it goes and
# its exit status to $OUT/stages.jsonl as soon as it ends (a run cut short returns what finished):
#   env      versions, GPU (stops the run if torch/CUDA/transformers-with-Qwen3 are missing)
#   corpus   gpu/corpus_gpu.py: site-packages + stdlib .py, GSM8K train, MBPP 601-974 -> tokens
#   train    train.py --device cuda --amp bf16 --attn sdpa --model <15M shape>, cosine over the
#            wall clock, budget = what the deadline leaves (at most TRAIN_MAX_S); validation every
#            EVAL_S seconds -> $OUT/train/{train_log.csv,val_log.csv,train_summary.json}
#   export   export.py --dtype bfloat16 (reload check) + gpu/card.py model card, packed
#   compare  gpu/compare.py: bits per byte of new and current model -> $OUT/compare.json
#            (replace: true/false), then the card again with the comparison, packed again
# $OUT holds at most 8 files (the device tool returns no more, each at most 16 MiB): stages.jsonl,
# run.log, train/{3 files}, compare.json, sdar-gpu.tar.NN (tar of sdar-tiny-code/ and logs/,
# split in 15 MiB parts; here: cat sdar-gpu.tar.* | tar -x).
set -uo pipefail
cd "$(dirname "$0")/../../.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
IN=gpu-train
start=$(date +%s)
if [ $DRY = 1 ]; then
    OUT=${OUT:-${TMPDIR:-/tmp}/tt-gpu-dry-out}
    PY=${PY:-/tmp/tt-venv/bin/python}
    THREADS=1
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAYON_NUM_THREADS=1
    DEVICE=cpu CHECK=
    MODEL='{"hidden_size":128,"intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":64}'
    MAX_PARAMS=1500000
    CORPUS_ARGS=(--cap-mb 4 --max-heldout-mb 0.5 --small-repeat 1)
    TRAIN_ARGS=(--batch 8 --warmup 20 --eval-every-s 20 --val-seqs 8 --final-val-seqs 16)
    TRAIN_MAX_S=${TRAIN_MAX_S:-60} TOTAL_S=${TOTAL_S:-1200} RESERVE_S=200
    COMPARE_ARGS=(--max-windows 4 --batch 16)
else
    OUT=${OUT:-/tmp/tt-gpu-out}
    PY=${PY:-python3}
    THREADS=$(nproc)
    export RAYON_NUM_THREADS=$THREADS
    DEVICE=cuda CHECK=--cuda
    # 14,949,760 parameters (bf16: 28.5 MiB)
    MODEL='{"hidden_size":384,"intermediate_size":1024,"num_hidden_layers":8,"num_attention_heads":6,"num_key_value_heads":2,"head_dim":64}'
    MAX_PARAMS=15000000
    CORPUS_ARGS=(--cap-mb "${CAP_MB:-300}" --max-heldout-mb 4 --small-repeat 4)
    TRAIN_ARGS=(--batch 256 --warmup 200 --eval-every-s 45 --val-seqs 128 --final-val-seqs 512 --log-every 10)
    # the device tool runs one command for at most 600 s: everything ends by TOTAL_S
    TRAIN_MAX_S=${TRAIN_MAX_S:-480} TOTAL_S=${TOTAL_S:-585} RESERVE_S=${RESERVE_S:-150}
    COMPARE_ARGS=(--max-windows 256 --batch 128)
fi
DEADLINE=$((start + TOTAL_S))
WORK=${TMPDIR:-/tmp}/tt-gpu-work
rm -rf "$WORK" && mkdir -p "$WORK/pack/logs"
mkdir -p "$OUT/train"
MODEL_DIR=$WORK/pack/sdar-tiny-code

stage() { # stage NAME LIMIT_S COMMAND... : output appended to $OUT/run.log, status to stages.jsonl
    local name=$1 limit=$2 t0 rc left
    shift 2
    t0=$(date +%s)
    left=$((DEADLINE - t0))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        rc=125
        echo "=== $name: skipped, no time left before the deadline" >> "$OUT/run.log"
    else
        echo "=== $name (limit ${limit} s, at $((t0 - start)) s): $*" >> "$OUT/run.log"
        timeout "$limit" "$@" >> "$OUT/run.log" 2>&1
        rc=$?
    fi
    printf '{"stage": "%s", "rc": %d, "seconds": %d, "at": %d}\n' "$name" "$rc" \
        "$(( $(date +%s) - t0 ))" "$(( $(date +%s) - start ))" | tee -a "$OUT/stages.jsonl"
    return $rc
}

pack() { # the model folder and the logs as one tar in 15 MiB parts (the tool returns <= 16 MiB a file)
    cp "$WORK/data/corpus_stats.json" "$WORK/pack/logs/" 2>/dev/null
    cp "$OUT/compare.json" "$OUT/train/train_summary.json" "$WORK/pack/logs/" 2>/dev/null
    rm -f "$OUT"/sdar-gpu.tar.*
    chmod -R a+rX "$WORK/pack"
    tar -C "$WORK/pack" -cf - sdar-tiny-code logs | split -b 15M -d -a 2 - "$OUT/sdar-gpu.tar."
}

RUNPY=("$PY")
[ $DRY = 1 ] && RUNPY=(nice -n 19 "$PY")

stage env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3;
    free -g | head -2; ${RUNPY[*]} tools/train_target/gpu/env_check.py $CHECK" || {
    echo "environment not usable: see $OUT/run.log"; exit 1; }
[ -f "$IN/tokenizer.json" ] && [ -f "$IN/gsm8k_train.jsonl" ] || {
    echo "no $IN/ (run tools/train_target/gpu/prepare.sh on the CPU machine, carry [\"$IN\"])" | tee -a "$OUT/run.log"
    exit 1; }

stage corpus 180 "${RUNPY[@]}" tools/train_target/gpu/corpus_gpu.py --in "$IN" --out "$WORK/data" "${CORPUS_ARGS[@]}" || {
    echo "corpus failed: see $OUT/run.log"; exit 1; }

train() { # train STAGE_NAME ATTENTION: budget = what the deadline leaves, at most TRAIN_MAX_S
    local budget minutes
    budget=$((DEADLINE - $(date +%s) - RESERVE_S))
    [ "$budget" -gt "$TRAIN_MAX_S" ] && budget=$TRAIN_MAX_S
    if [ "$budget" -lt 30 ]; then
        echo "only $budget s left for training: not starting $1" | tee -a "$OUT/run.log"
        return 1
    fi
    minutes=$(awk -v s="$budget" 'BEGIN { printf "%.3f", s / 60 }')
    stage "$1" $((budget + 90)) "${RUNPY[@]}" tools/train_target/train.py --device "$DEVICE" --amp bf16 \
        --attn "$2" --model "$MODEL" --max-params "$MAX_PARAMS" --max-minutes "$minutes" --threads "$THREADS" \
        --data "$WORK/data" --log-dir "$OUT/train" --ckpt "$WORK/ckpt" "${TRAIN_ARGS[@]}"
}
train train sdpa
# sdpa refused (the mask check failed, or its kernel broke) before any checkpoint: eager once more
[ -f "$WORK/ckpt/model.pt" ] || train train-eager eager
[ -f "$WORK/ckpt/model.pt" ] || { echo "no checkpoint: see $OUT/run.log"; exit 1; }

CARD=(tools/train_target/gpu/card.py --model "$MODEL_DIR" --train-dir "$OUT/train"
      --corpus-stats "$WORK/data/corpus_stats.json")
stage export 90 "${RUNPY[@]}" tools/train_target/export.py --ckpt "$WORK/ckpt/model.pt" --out "$MODEL_DIR" \
    --tokenizer "$IN/tokenizer.json" --dtype bfloat16 --no-readme --threads "$THREADS" &&
    { stage card 30 "${RUNPY[@]}" "${CARD[@]}"; pack; }

ORIG=()
[ -f "$IN/orig_val_docs.jsonl" ] && ORIG=(--orig-docs "$IN/orig_val_docs.jsonl")
if [ -f "$MODEL_DIR/model.safetensors" ]; then
    stage compare 150 "${RUNPY[@]}" tools/train_target/gpu/compare.py --new "$MODEL_DIR" --old models/sdar-tiny-code \
        --mix-docs "$WORK/data/heldout_mix_docs.jsonl" ${ORIG[@]+"${ORIG[@]}"} --out "$OUT/compare.json" \
        --device "$DEVICE" --threads "$THREADS" "${COMPARE_ARGS[@]}"
    stage card-final 30 "${RUNPY[@]}" "${CARD[@]}" --compare "$OUT/compare.json"
    pack
fi
echo "done in $(( $(date +%s) - start )) s; outputs in $OUT:"
ls -l "$OUT" "$OUT/train" | tee -a "$OUT/run.log"
grep -h '"replace"' "$OUT/compare.json" 2>/dev/null
