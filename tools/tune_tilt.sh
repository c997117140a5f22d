#!/usr/bin/env bash
# Picks the SPOT drafter's rank tilt per temperature (crates/spot-drafter/src/tilt.rs) by the
# forwards SPOT needs on tuning prompts the drafter never trained on: MBPP's validation split
# (tasks 511-600, as signature plus docstring) interleaved with GSM8K train questions from
# 1000 on (tools/drafter_prompts.py --mbpp 511-600 --gsm-start 1000). Never the evaluation
# sets. For each tilt of the grid it writes a checkpoint with that tilt at every temperature,
# runs `spot bench --methods spot` on the tuning prompts, and keeps per temperature the tilt
# with the lowest mean NFE (the smaller tilt on a tie); the result goes to OUT. Resumable: a
# grid point whose log says it finished is not run again.
#
#     tools/tune_tilt.sh [WORK_DIR]          # default: target/tilt-work
#
# Environment: SPOT (the spot binary; default: cargo run --release -p spot-cli --), DRAFTER
# (default: the shipped models/sdar-tiny-code/spot-drafter.safetensors), OUT (default: over
# DRAFTER), LIMIT (tuning prompts, 20), TILTS (0,0.15,0.3,0.5), TEMPERATURES (0,1,2),
# BUDGET (8), TOKENS (128).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-target/tilt-work}
SPOT=${SPOT:-cargo run --release -q -p spot-cli --}
DRAFTER=${DRAFTER:-models/sdar-tiny-code/spot-drafter.safetensors}
OUT=${OUT:-$DRAFTER}
LIMIT=${LIMIT:-20}
TILTS=${TILTS:-0,0.15,0.3,0.5}
TEMPERATURES=${TEMPERATURES:-0,1,2}
BUDGET=${BUDGET:-8}
TOKENS=${TOKENS:-128}
mkdir -p "$WORK"

python3 tools/drafter_prompts.py --data ../shared/data --out "$WORK/tune.jsonl" \
    --mbpp 511-600 --gsm-start 1000
for tilt in ${TILTS//,/ }; do
    dir=$WORK/tilt-$tilt
    mkdir -p "$dir"
    if grep -q '^wrote' "$dir/log" 2>/dev/null; then
        continue
    fi
    spec=$(echo "$TEMPERATURES" | tr ',' '\n' | sed "s/\$/:$tilt/" | paste -sd, -)
    $SPOT calibrate-order --drafter "$DRAFTER" --tilt "$spec" --out "$dir/drafter.safetensors"
    echo "== tilt $tilt ($(date -u +%H:%M:%S))" >&2
    $SPOT bench --prompts "$WORK/tune.jsonl" --field prompt --limit "$LIMIT" --methods spot \
        --drafter "$dir/drafter.safetensors" --budgets "$BUDGET" --temperatures "$TEMPERATURES" \
        --protocols fixed --max-new-tokens "$TOKENS" --out "$dir" >"$dir/log" 2>&1 \
        || { echo "== tilt $tilt failed: see $dir/log" >&2; exit 1; }
done

# Mean NFE of spot per (temperature, tilt), every decode checked equal to draft-free.
best=$(python3 - "$WORK" "$TILTS" <<'EOF'
import json, sys
from pathlib import Path
work, tilts = Path(sys.argv[1]), sys.argv[2].split(",")
nfe = {}
for tilt in tilts:
    for line in (work / f"tilt-{tilt}" / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        if not s["equal"]:
            sys.exit(f"tilt {tilt}: {s['method']} on {s['id']} differs from draft-free")
        if s["method"] == "spot":
            nfe.setdefault(s["temperature"], {}).setdefault(tilt, []).append(s["nfe"])
picks = []
for t, by in sorted(nfe.items(), key=lambda kv: float(kv[0])):
    means = {k: sum(v) / len(v) for k, v in by.items()}
    row = ", ".join(f"{k}: {m:.2f}" for k, m in means.items())
    pick = min(means, key=lambda k: (means[k], float(k)))
    print(f"T = {t}: mean NFE by tilt {row} -> {pick}", file=sys.stderr)
    picks.append(f"{t}:{pick}")
print(",".join(picks))
EOF
)
$SPOT calibrate-order --drafter "$DRAFTER" --tilt "$best" --out "$OUT"
