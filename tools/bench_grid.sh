#!/usr/bin/env bash
# Issue 15's benchmark grid on the shipped target: every drafter and bound side by side, one
# `spot bench` run per prompt set, then paper Spiffy (stale tokens at weight 1, no hedge) in a
# second run per set. Resumable: a set whose log says it finished is skipped, so rerun the
# script after an interruption (an unfinished set starts over).
#
#     tools/bench_grid.sh [OUT_DIR]          # default: target/bench-grid
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), LIMIT
# (prompts per set, 30), BUDGETS (8), TEMPERATURES (0,1,2), PROTOCOLS (fixed), TOKENS (128),
# SETS (GSM8K test, HumanEval and MATH-500), METHODS (every drafter and bound).
#
# Each set's folder holds bench.md, bench.json, bench.svg and samples.jsonl (one line per
# decode, with its NFE, so means over the first N prompts can be read back).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/bench-grid}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
LIMIT=${LIMIT:-30}
BUDGETS=${BUDGETS:-8}
TEMPERATURES=${TEMPERATURES:-0,1,2}
PROTOCOLS=${PROTOCOLS:-fixed}
TOKENS=${TOKENS:-128}
SETS=${SETS:-../shared/data/gsm8k_test.jsonl data/humaneval.jsonl ../shared/data/math500.jsonl}
METHODS=${METHODS:-ssd,blockspec,spiffy,mrp,spot,oracle,oracle-token,oracle-joint}

run() {
    local dir=$1
    shift
    mkdir -p "$dir"
    if grep -q '^wrote' "$dir/log" 2>/dev/null; then
        echo "== $dir: done before, skipped" >&2
        return
    fi
    echo "== $dir ($(date -u +%H:%M:%S))" >&2
    $SPOT bench --limit "$LIMIT" --budgets "$BUDGETS" --temperatures "$TEMPERATURES" \
        --protocols "$PROTOCOLS" --max-new-tokens "$TOKENS" --out "$dir" "$@" >"$dir/log" 2>&1 \
        || { echo "== $dir failed: see $dir/log" >&2; exit 1; }
}

for set in $SETS; do
    name=$(basename "$set" .jsonl)
    run "$OUT/$name" --prompts "$set" --methods "$METHODS"
    run "$OUT/$name-paper" --prompts "$set" --methods spiffy --uncalibrated-baselines
done
echo "== done: $OUT" >&2
