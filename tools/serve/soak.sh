#!/usr/bin/env bash
# Soak test of `spot serve` (not run by CI): tools/serve/soak.py against the release binary,
# from the repository root. Arguments go to soak.py (--minutes, --workers, --out, ...); the
# binary is $SPOT, else $CARGO_TARGET_DIR/release/spot, else target/release/spot.
#   cargo build --release -p spot-cli && tools/serve/soak.sh --minutes 30 --out soak.json
set -euo pipefail
cd "$(dirname "$0")/../.."
SPOT="${SPOT:-${CARGO_TARGET_DIR:-target}/release/spot}"
if [ ! -x "$SPOT" ]; then
    echo "soak.sh: no binary at $SPOT; build it with: cargo build --release -p spot-cli" >&2
    exit 2
fi
exec "${PYTHON:-python3}" tools/serve/soak.py --spot "$SPOT" "$@"
