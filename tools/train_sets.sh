#!/usr/bin/env bash
# Regenerates the shipped SPOT-Sets drafters (models/sdar-tiny-code/spot-sets.json, the
# calibrated tables, and spot-sets-net.json, the learned network): threshold-decoding
# trajectories of the shipped target with its hidden states on training prompts, at each
# threshold in TAUS at temperature 0 and in T1_TAUS at temperature 1, then `spot
# calibrate-sets` and `spot train-sets`. Collection resumes (`spot collect` skips samples
# already on disk). Trajectories are not committed. The shipped spot-sets-net.json is this
# script's network (748 prompts at T = 0, 200 at T = 1, tau 0.1 only); the shipped
# spot-sets.json tables came from the earlier 200-prompt run (N0=200 T1_TAUS="0.9 0.1").
#
#     tools/train_sets.sh [WORK_DIR]        # default: target/sets-work
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), N0 (prompts
# at T = 0, the first N0 of the training file, default all 748), N1 (prompts at T = 1, the
# last N1, default 200), TOKENS (128), TAUS ("0.9 0.1"), T1_TAUS ("0.1"), STEPS (8),
# OUT (default: models/sdar-tiny-code/spot-sets.json), NET_OUT (default: spot-sets-net.json
# next to OUT), EPOCHS (10).
#
# Prompts come only from the training side (tools/drafter_prompts.py over ../shared/data, as
# tools/train_drafter.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/sets-work}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
N0=${N0:-100000}
N1=${N1:-200}
TOKENS=${TOKENS:-128}
TAUS=${TAUS:-0.9 0.1}
T1_TAUS=${T1_TAUS:-0.1}
STEPS=${STEPS:-8}
OUT=${OUT:-models/sdar-tiny-code/spot-sets.json}
NET_OUT=${NET_OUT:-$(dirname "$OUT")/spot-sets-net.json}
EPOCHS=${EPOCHS:-10}
mkdir -p "$WORK"

python3 tools/drafter_prompts.py --data ../shared/data --out "$WORK/train.jsonl"
head -n "$N0" "$WORK/train.jsonl" > "$WORK/train-first.jsonl"
tail -n "$N1" "$WORK/train.jsonl" > "$WORK/train-last.jsonl"

dirs=()
collect() { # tau, temperature, prompt file suffix
    echo "== collecting tau = $1, T = $2 ($3 prompts, $TOKENS tokens)" >&2
    $SPOT collect --prompts "$WORK/train-$3.jsonl" --field prompt \
        --out "$WORK/tau$1-t$2" --max-new-tokens "$TOKENS" --no-early-stop \
        --temperature "$2" --seed "$2" --threshold "$1" --hidden-states
    dirs+=("$WORK/tau$1-t$2")
}
for tau in $TAUS; do collect "$tau" 0 first; done
for tau in $T1_TAUS; do collect "$tau" 1 last; done

echo "== calibrating" >&2
$SPOT calibrate-sets --trajectories "${dirs[@]}" --steps "$STEPS" --out "$OUT"

echo "== training the set network" >&2
$SPOT train-sets --trajectories "${dirs[@]}" --steps "$STEPS" --epochs "$EPOCHS" --out "$NET_OUT"
