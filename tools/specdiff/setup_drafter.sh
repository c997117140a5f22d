#!/usr/bin/env bash
# Make SpecDiff-2's drafter for an autoregressive target folder, in one command:
#
#     tools/specdiff/setup_drafter.sh TARGET_DIR [WORK_DIR]
#
# writes TARGET_DIR/specdiff-drafter/ (config.json, model.safetensors, tokenizer files,
# specdiff-drafter.json), the folder `spot generate --method specdiff` and `spot bench` use by
# default for that target. For SmolLM2-135M-Instruct, make TARGET_DIR with
# tools/setup_smollm2.sh first. Steps, each resumable (run the command again after a stop):
#
#   1. a Python venv (PYTHON_VENV, default ~/.cache/spot-train-venv) with the pins below, from
#      PyPI (PyPI's torch wheel is the CUDA build: about 3 GB with its libraries; it runs on CPU);
#   2. teacher data: the target's own greedy continuations of TEACHER_LIMIT training-side
#      prompts (GSM8K train, MBPP 601-974; tools/specdiff/teacher.py) in WORK_DIR/teacher.jsonl,
#      or, when TARGET_DIR/specdiff-lookup.jsonl exists (tools/specdiff/setup_lookup.sh: the
#      same kind of continuations, decoded by spot), that file instead (TEACHER=FILE names
#      another);
#   3. training (tools/specdiff/train_drafter.py): the target's first LAYERS layers with streak
#      distillation for MINUTES minutes (resumes from WORK_DIR/drafter/train.pt), then copies
#      the drafter folder into TARGET_DIR/specdiff-drafter/.
#
# Settings (environment): MINUTES (default 240; the measured drafter in docs/specdiff.md had
# 35), TEACHER_LIMIT (600), LAYERS (4), DRAFT_TOKENS (16), THREADS (0: torch's default),
# DATA (../shared/data: gsm8k_train.jsonl and mbpp.jsonl), NO_STREAK=1 (the ablation; then
# use another WORK_DIR). WORK_DIR defaults to TARGET_DIR/../specdiff-work. Not run by CI (CI
# tests the drafter path with a tiny folder). Fails loudly: any step's error exits non-zero.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 TARGET_DIR [WORK_DIR]" >&2
    exit 2
fi
TARGET=$(cd "$1" && pwd)
WORK=${2:-$TARGET/../specdiff-work}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${PYTHON_VENV:-$HOME/.cache/spot-train-venv}
DATA=${DATA:-$HERE/../../../shared/data}
MINUTES=${MINUTES:-240}
TEACHER_LIMIT=${TEACHER_LIMIT:-600}
LAYERS=${LAYERS:-4}
DRAFT_TOKENS=${DRAFT_TOKENS:-16}
THREADS=${THREADS:-0}
# The versions the figures in docs/specdiff.md were made with.
PINS=(torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6)

fail() {
    echo "setup_drafter: error: $*" >&2
    exit 1
}

[ -f "$TARGET/config.json" ] && [ -f "$TARGET/model.safetensors" ] ||
    fail "$TARGET is not a model folder (config.json, model.safetensors)"
[ -f "$DATA/gsm8k_train.jsonl" ] && [ -f "$DATA/mbpp.jsonl" ] ||
    fail "$DATA lacks gsm8k_train.jsonl or mbpp.jsonl (set DATA)"
mkdir -p "$WORK"

echo "setup_drafter: 1/3 Python venv $VENV"
if ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
    python3 -m venv "$VENV" || fail "cannot create $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" ||
        fail "pip install ${PINS[*]} failed"
fi
PY=$VENV/bin/python

TEACHER=${TEACHER:-}
if [ -z "$TEACHER" ] && [ -f "$TARGET/specdiff-lookup.jsonl" ]; then
    TEACHER=$TARGET/specdiff-lookup.jsonl
fi
if [ -n "$TEACHER" ]; then
    [ -f "$TEACHER" ] || fail "TEACHER=$TEACHER does not exist"
    echo "setup_drafter: 2/3 teacher data: $TEACHER"
else
    TEACHER=$WORK/teacher.jsonl
    echo "setup_drafter: 2/3 teacher data $TEACHER ($TEACHER_LIMIT prompts)"
    "$PY" "$HERE/teacher.py" --target "$TARGET" --data "$DATA" --out "$TEACHER" \
        --limit "$TEACHER_LIMIT" --threads "$THREADS" || fail "teacher.py failed"
fi

echo "setup_drafter: 3/3 training $LAYERS layers for $MINUTES minutes in $WORK/drafter"
STREAK=()
if [ "${NO_STREAK:-0}" = 1 ]; then
    STREAK=(--no-streak)
fi
"$PY" "$HERE/train_drafter.py" --target "$TARGET" --teacher "$TEACHER" \
    --out "$WORK/drafter" --layers "$LAYERS" --gamma "$DRAFT_TOKENS" --minutes "$MINUTES" \
    --threads "$THREADS" "${STREAK[@]}" || fail "train_drafter.py failed"

DEST=$TARGET/specdiff-drafter
mkdir -p "$DEST"
for f in "$WORK"/drafter/*; do
    case $(basename "$f") in
    train.pt) ;;
    *) cp "$f" "$DEST/" ;;
    esac
done
[ -f "$DEST/specdiff-drafter.json" ] || fail "no specdiff-drafter.json was written"
echo "setup_drafter: wrote $DEST"
