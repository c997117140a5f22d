#!/usr/bin/env bash
# Make SpecDiff-2's lookup store for an autoregressive target folder, in one command:
#
#     tools/specdiff/setup_lookup.sh TARGET_DIR [WORK_DIR]
#
# writes TARGET_DIR/specdiff-lookup.jsonl: the target's own greedy continuations (T = 0, up to
# 256 new tokens, stop at its end-of-turn id) of training-side prompts in its chat template,
# GSM8K *train* questions (the first GSM of them) then MBPP tasks 601 onwards (the first MBPP
# of them), one JSON object per line as `spot generate --json` writes it. `spot generate
# --method specdiff` and `spot bench` use that file by default for that target when the
# folder has no `specdiff-drafter/` (`--drafter FILE` names it explicitly): prompt lookup plus
# retrieval from these continuations, with acceptance rates measured on them
# (`spot_specdiff::LookupStore`, docs/specdiff.md). Nothing but the spot binary is needed.
#
# Resumable: prompts go in chunks of CHUNK; a finished chunk (WORK_DIR/chunk-*.jsonl) is not
# decoded again, so run the command again after a stop. Settings (environment): GSM (default
# 200), MBPP (default 100), CHUNK (20), SPOT (the spot binary; default `spot` on PATH), DATA
# (../shared/data: gsm8k_train.jsonl and mbpp.jsonl). WORK_DIR defaults to
# TARGET_DIR/../specdiff-lookup-work. On the 2-core development machine a SmolLM2-135M
# continuation takes about 5 s (200 + 100 prompts: about 25 minutes). Not run by CI.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 TARGET_DIR [WORK_DIR]" >&2
    exit 2
fi
TARGET=$(cd "$1" && pwd)
WORK=${2:-$TARGET/../specdiff-lookup-work}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=${DATA:-$HERE/../../../shared/data}
GSM=${GSM:-200}
MBPP=${MBPP:-100}
CHUNK=${CHUNK:-20}
SPOT=${SPOT:-spot}

fail() {
    echo "setup_lookup: error: $*" >&2
    exit 1
}

[ -f "$TARGET/config.json" ] && [ -f "$TARGET/model.safetensors" ] ||
    fail "$TARGET is not a model folder (config.json, model.safetensors)"
[ -f "$DATA/gsm8k_train.jsonl" ] && [ -f "$DATA/mbpp.jsonl" ] ||
    fail "$DATA lacks gsm8k_train.jsonl or mbpp.jsonl (set DATA)"
command -v "$SPOT" >/dev/null || fail "no spot binary '$SPOT' (set SPOT)"
mkdir -p "$WORK"

# decode NAME FILE FIELD FIRST COUNT: lines FIRST.. (1-based) of FILE, in chunks.
decode() {
    local name=$1 file=$2 field=$3 first=$4 count=$5 start
    for ((start = first; start < first + count; start += CHUNK)); do
        local n=$((first + count - start < CHUNK ? first + count - start : CHUNK))
        local out="$WORK/chunk-$name-$(printf %05d "$start").jsonl"
        if [ -s "$out" ]; then
            continue
        fi
        echo "setup_lookup: $name prompts $start-$((start + n - 1))"
        sed -n "${start},$((start + n - 1))p" "$file" >"$WORK/prompts.jsonl"
        "$SPOT" generate --model "$TARGET" --prompts "$WORK/prompts.jsonl" --field "$field" \
            --chat --max-new-tokens 256 --temperature 0 --method df --json \
            >"$out.part" || fail "spot generate failed on $name prompts $start-$((start + n - 1))"
        mv "$out.part" "$out"
    done
}

decode gsm8k "$DATA/gsm8k_train.jsonl" question 1 "$GSM"
decode mbpp "$DATA/mbpp.jsonl" text 601 "$MBPP"

cat "$WORK"/chunk-*.jsonl >"$TARGET/specdiff-lookup.jsonl.part"
mv "$TARGET/specdiff-lookup.jsonl.part" "$TARGET/specdiff-lookup.jsonl"
echo "setup_lookup: wrote $TARGET/specdiff-lookup.jsonl ($(wc -l <"$TARGET/specdiff-lookup.jsonl") continuations)"
