#!/usr/bin/env bash
# Starts `spot serve` (binary $1) on a free port with the ChatML template of this folder,
# waits for it, runs the openai-client check with Python $2, and stops the server. Used by
# .ci/run; prints the server's log when anything fails.
set -euo pipefail
SPOT="$1"
PYTHON="$2"
here="$(cd "$(dirname "$0")" && pwd)"
log="$(mktemp)"
"$SPOT" serve --port 0 --method df --max-new-tokens 64 \
    --chat-template "$here/chat_template.jinja" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 600); do
    url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log")
    [ -n "$url" ] && break
    if ! kill -0 $pid 2>/dev/null; then
        echo "spot serve exited:"; cat "$log"; exit 1
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "spot serve did not start within 60 s:"; cat "$log"; exit 1
fi
if ! "$PYTHON" "$here/openai_check.py" --url "$url" --model sdar-tiny-code; then
    echo "--- spot serve log"; cat "$log"; exit 1
fi
