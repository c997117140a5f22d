#!/usr/bin/env bash
# The order network's time per call, ours (packed host path and burn) beside PyTorch's, at
# 1, 4, 8 and 20 block states, in one run on this machine (not used by CI).
#
#   tools/drafter_speed/run.sh [SPOT_BINARY] [PYTHON]
#
# SPOT_BINARY defaults to target/release/spot (build it with `cargo build --release -p
# spot-cli`); PYTHON to python3 and needs torch (a CPU build). Prints the two JSON lines and
# the ratio host / torch per batch size.
set -euo pipefail
cd "$(dirname "$0")/../.."
spot="${1:-target/release/spot}"
python="${2:-python3}"
ours=$("$spot" bench-drafter --nodes 1,4,8,20 --reps 100)
theirs=$("$python" tools/drafter_speed/torch_order_net.py --nodes 1,4,8,20 --reps 100 --threads 2)
echo "$ours"
echo "$theirs"
"$python" - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for n in (1, 4, 8, 20):
    h, t = ours[f"n{n}_host_median_ms"], theirs[f"torch_n{n}_median_ms"]
    print(f"n={n:2d}: host {h:.3f} ms, burn {ours[f'n{n}_burn_median_ms']:.3f} ms, "
          f"torch {t:.3f} ms, host / torch {h / t:.2f}")
PY
