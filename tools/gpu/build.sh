#!/usr/bin/env bash
# Builds what tools/gpu/run.sh runs on a GPU machine (which has CUDA, PyTorch and transformers
# but no Rust), into gpu-bin/ at the repository root (ignored through .git/info/exclude):
#
#     tools/gpu/build.sh            # release spot with --features cuda, the CUDA test binary
#     tools/gpu/build.sh --cpu      # the same with the default CPU backend, for run.sh --dry-run
#
# Both binaries are stripped and xz-compressed (the device tool carries at most 64 MiB with the
# checkout); the PyTorch yardstick (make_model.py, torch_bench.py) is copied from
# ../shared/gpu/ next to them. Then: device run, carry ["gpu-bin"], command
# `tools/gpu/run.sh` (see its header).
set -euo pipefail
cd "$(dirname "$0")/../.."
features=(--no-default-features --features cuda)
if [ "${1:-}" = "--cpu" ]; then
    features=()
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME}/.cache/spot-gpu-target}"
rm -rf gpu-bin && mkdir -p gpu-bin
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx "gpu-bin/" "$exclude" 2>/dev/null || echo "gpu-bin/" >> "$exclude"
cargo build --release -p spot-cli "${features[@]}"
cp "$CARGO_TARGET_DIR/release/spot" gpu-bin/spot
# The CUDA integration tests (tests/cuda.rs) as one binary, found in cargo's JSON.
tests=$(cargo test --release -p spot-models "${features[@]}" --test cuda --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "cuda" and m.get("executable"):
        print(m["executable"])
')
cp "$tests" gpu-bin/cuda-tests
strip gpu-bin/spot gpu-bin/cuda-tests
xz -T0 -6 gpu-bin/spot gpu-bin/cuda-tests
shared=../shared/gpu
[ -d "$shared" ] || shared=/work/shared/gpu
cp "$shared/make_model.py" "$shared/torch_bench.py" gpu-bin/
du -sh gpu-bin/*
echo "gpu-bin ready (features: ${features[*]:-default CPU})"
