#!/usr/bin/env bash
# Run HERE (the CPU machine), from anywhere: gathers what the GPU run of tools/train_target/gpu/run.sh
# needs and git does not track into gpu-train/ at the repository root (ignored through
# .git/info/exclude, carried to the device machine with carry ["gpu-train"]):
#
#   gsm8k_train.jsonl, gsm8k_LICENSE  GSM8K train split (MIT), copied from ../shared/data
#   mbpp.jsonl                        MBPP tasks 601-974 only (CC-BY-4.0)
#   orig_val_docs.jsonl               the CPU recipe's held-out split (corpus.original_split() with
#                                     this interpreter's standard library: the committed model used
#                                     CPython 3.11.7), so both models can be scored on it there
#   tokenizer.json                    models/sdar-tiny-code/tokenizer.json (the shipped tokenizer)
#   manifest.json                     sizes, sha256, the Python version used
#
#     tools/train_target/gpu/prepare.sh            # PY=python3 by default: needs only the stdlib;
#                                                  # with `tokenizers` it also checks the split
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-python3}
DST=gpu-train
shared=${SPOT_SHARED_DATA:-../shared/data}
[ -f "$shared/gsm8k_train.jsonl" ] || shared=/work/shared/data
[ -f "$shared/gsm8k_train.jsonl" ] || { echo "no shared/data with gsm8k_train.jsonl (set SPOT_SHARED_DATA)" >&2; exit 1; }
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx "gpu-train/" "$exclude" 2>/dev/null || echo "gpu-train/" >> "$exclude"
rm -rf "$DST" && mkdir -p "$DST"
cp "$shared/gsm8k_train.jsonl" "$DST/"
[ -f "$shared/gsm8k_LICENSE" ] && cp "$shared/gsm8k_LICENSE" "$DST/"
cp models/sdar-tiny-code/tokenizer.json "$DST/"
SPOT_SHARED_DATA="$(cd "$shared" && pwd)" nice -n 19 "$PY" - "$DST" <<'EOF'
import hashlib, json, os, platform, sys
dst = sys.argv[1]
sys.path.insert(0, "tools/train_target")
import corpus  # reads SPOT_SHARED_DATA

with open(os.path.join(corpus.SHARED, "mbpp.jsonl"), encoding="utf-8") as fi, \
        open(os.path.join(dst, "mbpp.jsonl"), "w", encoding="utf-8") as fo:
    kept = 0
    for line in fi:
        if 601 <= int(json.loads(line)["task_id"]) <= 974:
            fo.write(line if line.endswith("\n") else line + "\n")
            kept += 1
assert kept == 374, kept
_, val = corpus.original_split()
with open(os.path.join(dst, "orig_val_docs.jsonl"), "w", encoding="utf-8") as fh:
    for d in val:
        fh.write(json.dumps(d) + "\n")
by = {}
for d in val:
    by[d["src"].split(":")[0]] = by.get(d["src"].split(":")[0], 0) + 1
man = {"python": platform.python_version(), "stdlib": os.path.dirname(os.__file__),
       "orig_val_documents": len(val), "orig_val_by_source": by, "mbpp_tasks": kept}
ref = json.load(open("tools/train_target/logs/corpus_stats.json"))["val"]
try:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(dst, "tokenizer.json"))
    n = sum(len(e.ids) + 1 for e in tok.encode_batch([d["text"] for d in val], add_special_tokens=False))
    man["orig_val_tokens"] = n
    same = n == ref["tokens"] and len(val) == ref["documents"]
    print(f"held-out split: {len(val)} docs, {n} tokens; committed run: {ref['documents']} docs, "
          f"{ref['tokens']} tokens -> {'same split' if same else 'DIFFERENT (another Python?)'}")
except ImportError:
    same = len(val) == ref["documents"]
    print(f"held-out split: {len(val)} docs (committed run: {ref['documents']}); install `tokenizers` "
          "to compare token counts too")
man["orig_val_matches_committed_run"] = same
man["files"] = {f: {"bytes": os.path.getsize(os.path.join(dst, f)),
                    "sha256": hashlib.sha256(open(os.path.join(dst, f), "rb").read()).hexdigest()}
                for f in sorted(os.listdir(dst))}
json.dump(man, open(os.path.join(dst, "manifest.json"), "w"), indent=1)
if not same:
    print("WARNING: orig_val_docs.jsonl is not the committed model's held-out split; run prepare.sh "
          "with CPython 3.11.7 (PY=...) for a like-for-like comparison", file=sys.stderr)
EOF
du -sh "$DST"
ls -l "$DST"
# what the device tool sends: tracked + untracked-not-ignored files + the carried gpu-train/ (<= 64 MiB)
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
echo "device payload: working tree $((tree / 1048576)) MiB + gpu-train $(( $(du -sb "$DST" | cut -f1) / 1048576 )) MiB (limit 64 MiB)"
size=$(du -sb "$DST" | cut -f1)
[ "$size" -lt $((32 * 1024 * 1024)) ] || { echo "gpu-train/ is over 32 MiB" >&2; exit 1; }
echo "gpu-train ready: device run with carry [\"gpu-train\"], command: OUT=\$OUT tools/train_target/gpu/run.sh"
