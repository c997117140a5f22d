#!/usr/bin/env bash
# Starts `spot serve` (binary $1) on a free port with the ChatML template of this folder,
# waits for it, runs the openai-client check with Python $2, and stops the server. Used by
# .ci/run; prints the server's log when anything fails.
set -euo pipefail
SPOT="$1"
PYTHON="$2"
here="$(cd "$(dirname "$0")" && pwd)"
log="$(mktemp)"
# shellcheck source=tools/serve/start_server.sh
. "$here/start_server.sh"
start_spot_serve "$log" "$SPOT" serve --port 0 --method df --max-new-tokens 64 \
    --chat-template "$here/chat_template.jinja"
if ! "$PYTHON" "$here/openai_check.py" --url "$url" --model sdar-tiny-code; then
    echo "--- spot serve log"; cat "$log"; exit 1
fi
