#!/usr/bin/env bash
# Regenerates the shipped SPOT-Sets drafters (models/sdar-tiny-code/spot-sets.json, the
# calibrated tables, and spot-sets-net.json, the learned network): threshold-decoding
# trajectories of the shipped target with its hidden states on training prompts, at each
# threshold in TAUS and temperatures 0 and 1, then `spot calibrate-sets` and `spot
# train-sets`. Collection resumes (`spot collect` skips samples already on disk).
# Trajectories are not committed.
#
#     tools/train_sets.sh [WORK_DIR]        # default: target/sets-work
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), N (prompts
# per temperature and threshold, default 200), TOKENS (128), TAUS ("0.9 0.1"), STEPS (8),
# OUT (default: models/sdar-tiny-code/spot-sets.json), NET_OUT (default: spot-sets-net.json
# next to OUT), EPOCHS (10).
#
# Prompts come only from the training side (tools/drafter_prompts.py over ../shared/data, as
# tools/train_drafter.sh): T = 0 decodes the first N, T = 1 the last N.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/sets-work}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
N=${N:-200}
TOKENS=${TOKENS:-128}
TAUS=${TAUS:-0.9 0.1}
STEPS=${STEPS:-8}
OUT=${OUT:-models/sdar-tiny-code/spot-sets.json}
NET_OUT=${NET_OUT:-$(dirname "$OUT")/spot-sets-net.json}
EPOCHS=${EPOCHS:-10}
mkdir -p "$WORK"

python3 tools/drafter_prompts.py --data ../shared/data --out "$WORK/train.jsonl"
head -n "$N" "$WORK/train.jsonl" > "$WORK/train-first.jsonl"
tail -n "$N" "$WORK/train.jsonl" > "$WORK/train-last.jsonl"

dirs=()
for tau in $TAUS; do
    for spec in "0 first 0" "1 last 1"; do
        set -- $spec
        echo "== collecting tau = $tau, T = $1 ($N prompts, $TOKENS tokens)" >&2
        $SPOT collect --prompts "$WORK/train-$2.jsonl" --field prompt \
            --out "$WORK/tau$tau-t$1" --max-new-tokens "$TOKENS" --no-early-stop \
            --temperature "$1" --seed "$3" --threshold "$tau" --hidden-states
        dirs+=("$WORK/tau$tau-t$1")
    done
done

echo "== calibrating" >&2
$SPOT calibrate-sets --trajectories "${dirs[@]}" --steps "$STEPS" --out "$OUT"

echo "== training the set network" >&2
$SPOT train-sets --trajectories "${dirs[@]}" --steps "$STEPS" --epochs "$EPOCHS" --out "$NET_OUT"
