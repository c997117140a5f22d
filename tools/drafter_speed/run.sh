#!/usr/bin/env bash
# The drafter networks' time per call, ours beside PyTorch's, at 1, 4, 8 and 20 block states,
# in one run on this machine (not used by CI): the order network (packed host path with int8
# products, the default, and in f32; burn), the MRP token module's step (int8, f32) and
# SPOT-Sets' set network.
#
#   tools/drafter_speed/run.sh [SPOT_BINARY] [PYTHON]
#
# SPOT_BINARY defaults to target/release/spot (build it with `cargo build --release -p
# spot-cli`); PYTHON to python3 and needs torch (a CPU run). Prints the two JSON lines and,
# per network and batch size, ours / PyTorch's median.
set -euo pipefail
cd "$(dirname "$0")/../.."
spot="${1:-target/release/spot}"
python="${2:-python3}"
ours=$("$spot" bench-drafter --nodes 1,4,8,20 --reps 100)
theirs=$("$python" tools/drafter_speed/torch_drafters.py --nodes 1,4,8,20 --reps 100 --threads 2)
echo "$ours"
echo "$theirs"
"$python" - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for net, paths in (("order", ("int8", "host", "burn")), ("mrp", ("mrp-int8", "mrp-host", "mrp-burn")),
                   ("sets", ("sets-net",))):
    for n in (1, 4, 8, 20):
        t = theirs[f"torch_{net}_n{n}_median_ms"]
        cells = ", ".join(f"{p} {ours[f'n{n}_{p}_median_ms']:.3f} ms ({ours[f'n{n}_{p}_median_ms'] / t:.2f}x)"
                          for p in paths)
        print(f"{net:5s} n={n:2d}: torch {t:.3f} ms; {cells}")
PY
