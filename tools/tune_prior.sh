#!/usr/bin/env bash
# Picks the SPOT drafter's rank-path prior weight per temperature (crates/spot-drafter/src/
# prior.rs) by the forwards SPOT needs on tuning prompts the drafter never trained on (the
# prompts of tools/tune_tilt.sh: MBPP 511-600 and GSM8K train questions from 1000 on), counted
# by `spot replay` on their draft-free trajectories (no target forward per configuration). It
# collects LIMIT tuning trajectories per temperature (resumable), replays SPOT with each
# weight of the grid, keeps per temperature the weight with the fewest forwards (the smaller
# on a tie) and writes the weights with the rank paths of GRAPH into OUT.
#
#     tools/tune_prior.sh [WORK_DIR]          # default: target/prior-work
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), DRAFTER
# (default: the shipped models/sdar-tiny-code/spot-drafter.safetensors), OUT (default: over
# DRAFTER), GRAPH (the rank paths; default: models/sdar-tiny-code/spiffy-graph.json), LIMIT
# (60), WEIGHTS (0,0.3,0.5,0.7,0.85), TEMPERATURES (0,1,2), BUDGET (8), TOKENS (128).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/prior-work}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
DRAFTER=${DRAFTER:-models/sdar-tiny-code/spot-drafter.safetensors}
OUT=${OUT:-$DRAFTER}
GRAPH=${GRAPH:-models/sdar-tiny-code/spiffy-graph.json}
LIMIT=${LIMIT:-60}
WEIGHTS=${WEIGHTS:-0,0.3,0.5,0.7,0.85}
TEMPERATURES=${TEMPERATURES:-0,1,2}
BUDGET=${BUDGET:-8}
TOKENS=${TOKENS:-128}
mkdir -p "$WORK"

python3 tools/drafter_prompts.py --data ../shared/data --out "$WORK/tune.jsonl" \
    --mbpp 511-600 --gsm-start 1000
# The drafter with the graph attached (weights as they are), so replay reads these rank paths.
$SPOT calibrate-order --drafter "$DRAFTER" --prior 0:0 --rank-paths "$GRAPH" \
    --out "$WORK/drafter.safetensors"
picks=()
for t in ${TEMPERATURES//,/ }; do
    dir=$WORK/t$t
    $SPOT collect --prompts "$WORK/tune.jsonl" --field prompt --limit "$LIMIT" \
        --max-new-tokens "$TOKENS" --no-early-stop --temperature "$t" --out "$dir" >&2
    $SPOT replay --trajectories "$dir" --methods spot --drafter "$WORK/drafter.safetensors" \
        --budgets "$BUDGET" --prior-weights "$WEIGHTS" --json >"$WORK/replay-t$t.jsonl"
    pick=$(python3 - "$WORK/replay-t$t.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {float(r["method"].split("prior ")[1].rstrip(")")): r["forwards_per_trajectory"] for r in rows}
row = ", ".join(f"{w}: {f:.2f}" for w, f in sorted(by.items()))
pick = min(by, key=lambda w: (by[w], w))
print(f"forwards per prompt by prior weight {row} -> {pick}", file=sys.stderr)
print(pick)
PY
)
    echo "== T = $t: prior weight $pick" >&2
    picks+=("$t:$pick")
done
spec=$(IFS=,; echo "${picks[*]}")
$SPOT calibrate-order --drafter "$DRAFTER" --prior "$spec" --rank-paths "$GRAPH" --out "$OUT"
