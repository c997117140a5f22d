#!/usr/bin/env bash
# Issue 15's benchmark grid by replay (`spot replay`, docs/cli.md): records draft-free
# trajectories of the first LIMIT prompts of each set at each temperature (resumable), then
# re-enacts SPOT, calibrated Spiffy, BlockSpec and the SSD chain on them at each budget, and
# paper Spiffy (--uncalibrated-baselines), without target forwards. Minutes where the live
# grid (tools/bench_grid.sh) takes hours; the counts are of a decoder without draft refresh
# (within about 1% of `spot bench` on the shipped target, docs/benchmarks.md), so quote live
# figures for results and use these to see where to look.
#
#     tools/replay_grid.sh [WORK_DIR]        # default: target/replay-grid
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), LIMIT
# (30), TEMPERATURES (0,1,2), BUDGETS (8,20), TOKENS (128), SETS (name=file pairs).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/replay-grid}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
LIMIT=${LIMIT:-30}
TEMPERATURES=${TEMPERATURES:-0,1,2}
BUDGETS=${BUDGETS:-8,20}
TOKENS=${TOKENS:-128}
SETS=${SETS:-gsm8k-test=../shared/data/gsm8k_test.jsonl humaneval=data/humaneval.jsonl math500=../shared/data/math500.jsonl}
mkdir -p "$WORK"

for pair in $SETS; do
    name=${pair%%=*}
    file=${pair#*=}
    dirs=()
    for t in ${TEMPERATURES//,/ }; do
        dir=$WORK/$name-t$t
        $SPOT collect --prompts "$file" --limit "$LIMIT" --max-new-tokens "$TOKENS" \
            --no-early-stop --temperature "$t" --out "$dir" >&2
        dirs+=("$dir")
    done
    {
        echo "## $name"
        $SPOT replay --trajectories "${dirs[@]}" --methods spot,spiffy,blockspec,ssd \
            --budgets "$BUDGETS"
        $SPOT replay --trajectories "${dirs[@]}" --methods spiffy --budgets "$BUDGETS" \
            --uncalibrated-baselines | tail -n +3 | sed 's/| spiffy |/| spiffy (paper) |/'
    } >"$WORK/replay-$name.md"
    cat "$WORK/replay-$name.md"
done
