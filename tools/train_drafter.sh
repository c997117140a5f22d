#!/usr/bin/env bash
# Regenerates the shipped order drafter (models/sdar-tiny-code/spot-drafter.*) from scratch:
# training prompts, draft-free trajectories of the shipped target at T = 0, 1 and 2, then
# Algorithm 1, then the rank tilt per temperature (tools/tune_tilt.sh) and the rank-path
# prior per temperature (tools/tune_prior.sh, over models/sdar-tiny-code/spiffy-graph.json), then the token source per temperature. Every step resumes: `spot collect` skips samples already on disk, so rerun the
# script after an interruption. Trajectories are not committed (about 0.3 MB each).
#
#     tools/train_drafter.sh [WORK_DIR]        # default: target/drafter-work
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), N (prompts
# per temperature, default 500), TOKENS (128), EPOCHS (8), EXAMPLES (examples per epoch,
# default 60000), HELDOUT (held-out examples per evaluation, 12000), LR (1e-3), OUT (the
# checkpoint, default WORK_DIR/spot-drafter.safetensors).
#
# Prompts come only from the training side: MBPP tasks 601-974 written as a signature plus a
# docstring and GSM8K train questions (tools/drafter_prompts.py over ../shared/data). T = 0 and
# T = 2 decode the first N prompts, T = 1 the last N, each temperature with its own seed.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/drafter-work}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
N=${N:-500}
TOKENS=${TOKENS:-128}
EPOCHS=${EPOCHS:-8}
EXAMPLES=${EXAMPLES:-60000}
HELDOUT=${HELDOUT:-12000}
LR=${LR:-1e-3}
OUT=${OUT:-$WORK/spot-drafter.safetensors}
mkdir -p "$WORK"

python3 tools/drafter_prompts.py --data ../shared/data --out "$WORK/train.jsonl"
head -n "$N" "$WORK/train.jsonl" > "$WORK/train-first.jsonl"
tail -n "$N" "$WORK/train.jsonl" > "$WORK/train-last.jsonl"

for spec in "0 first 0" "1 last 1" "2 first 2"; do
    set -- $spec
    echo "== collecting T = $1 ($N prompts, $TOKENS tokens)" >&2
    $SPOT collect --prompts "$WORK/train-$2.jsonl" --field prompt --out "$WORK/t$1" \
        --max-new-tokens "$TOKENS" --no-early-stop --temperature "$1" --seed "$3"
done

echo "== training" >&2
$SPOT train-drafter --trajectories "$WORK/t0" "$WORK/t1" "$WORK/t2" --out "$OUT" \
    --epochs "$EPOCHS" --max-examples "$EXAMPLES" --max-heldout "$HELDOUT" --lr "$LR" \
    --batch-size 256

echo "== rank tilt per temperature (tuning prompts, not evaluation sets)" >&2
SPOT="$SPOT" DRAFTER="$OUT" tools/tune_tilt.sh "$WORK/tilt"

echo "== rank-path prior per temperature (tuning prompts, by replay)" >&2
SPOT="$SPOT" DRAFTER="$OUT" tools/tune_prior.sh "$WORK/prior"

# The token module's tokens at T = 0 only, as measured on the tuning prompts with the shipped
# MRP module (docs/notes/2026-12-05-benchmarks-log.md, "SPOT with the token module at T = 0"); a folder without
# mrp.json drafts stale tokens whatever this says.
echo "== token source per temperature" >&2
$SPOT calibrate-order --drafter "$OUT" --module-tokens 0:on,1:off,2:off
