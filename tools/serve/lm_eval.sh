#!/usr/bin/env bash
# Slow check, not part of .ci/run: lm-evaluation-harness (its `local-completions` model)
# against `spot serve`, on GSM8K from ../shared/data/gsm8k_test.jsonl through a local task file
# (5-shot from gsm8k_train.jsonl; no dataset download, no hub tokenizer). Prints the score and
# the wall time.
#
#     tools/serve/lm_eval.sh [SPOT_BINARY]      # default: the release build's spot
#
# Environment: LIMIT (questions, default all 1,319), METHOD (decoding method, default the
# server's default, blockspec), MODEL (folder, default the shipped model), CONCURRENT (client
# requests in flight, default 16), MAX_TOKENS (default 256), LM_EVAL_VENV (the venv, created
# from tools/serve/requirements-lm-eval.txt), OUT (results folder, default a temp folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPOT="${1:-${CARGO_TARGET_DIR:-target}/release/spot}"
VENV="${LM_EVAL_VENV:-$HOME/.cache/spot-lm-eval-venv}"
DATA="$(cd ../shared/data && pwd)"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
if ! "$VENV/bin/python" -c "import lm_eval" 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r tools/serve/requirements-lm-eval.txt
fi
tasks="$(mktemp -d)"
cat > "$tasks/gsm8k_local.yaml" <<YAML
task: gsm8k_local
dataset_path: json
dataset_kwargs:
  data_files:
    train: $DATA/gsm8k_train.jsonl
    test: $DATA/gsm8k_test.jsonl
output_type: generate_until
training_split: train
fewshot_split: train
test_split: test
doc_to_text: "Question: {{question}}\nAnswer:"
doc_to_target: "{{answer}}"
num_fewshot: 5
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\\$", "(?s).*#### ", "\\\\.\$"]
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[\$0-9.,]{2,})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1.0
YAML
log="$OUT/serve.log"
serve_args=(serve --port 0 --max-new-tokens "${MAX_TOKENS:-256}" --served-model-name spot)
[ -n "${MODEL:-}" ] && serve_args+=(--model "$MODEL")
[ -n "${METHOD:-}" ] && serve_args+=(--method "$METHOD")
# shellcheck source=tools/serve/start_server.sh
. tools/serve/start_server.sh
start_spot_serve "$log" "$SPOT" "${serve_args[@]}"
limit=()
[ -n "${LIMIT:-}" ] && limit=(--limit "$LIMIT")
start=$(date +%s)
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$VENV/bin/lm_eval" --model local-completions \
    --model_args "model=spot,base_url=$url/v1/completions,tokenized_requests=False,tokenizer_backend=None,num_concurrent=${CONCURRENT:-16},max_retries=1,max_gen_toks=${MAX_TOKENS:-256}" \
    --tasks gsm8k_local --include_path "$tasks" "${limit[@]}" --output_path "$OUT" \
    2>&1 | tee "$OUT/lm_eval.log"
echo "lm_eval: $(( $(date +%s) - start )) s wall; results in $OUT"
curl -s "$url/stats" && echo
