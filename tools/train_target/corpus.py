#!/usr/bin/env python3
"""Training corpus for the tiny SDAR model (never committed; written to tools/train_target/data/).

Sources (all permissively licensed, all local):
  (a) CPython standard-library .py sources of this interpreter (PSF licence), skipping
      test/, tests/, idlelib/ and site-packages/;
  (b) GSM8K *train* split (MIT): "Question: ...\\nAnswer: ..." documents;
  (c) MBPP tasks with task_id 601..974 only (CC-BY-4.0): "# <text>\\n<code>" documents.
Nothing from GSM8K test, MBPP 11-510 (or 511-600), MATH-500 or HumanEval is used.

Subcommands:
  docs      collect documents, seeded 2% hold-out -> data/train_docs.jsonl, data/val_docs.jsonl
  tokenize  encode with data/tokenizer.json, join documents with <|endoftext|>
            -> data/train.bin, data/val.bin (uint16) + data/corpus_stats.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
# The project's shared/ folder lies beside the repository (SPOT_SHARED_DATA overrides).
SHARED = os.environ.get("SPOT_SHARED_DATA") or os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data"))
SEED = 1234
VAL_FRACTION = 0.02
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}


def stdlib_docs():
    root = os.path.dirname(os.__file__)
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            p = os.path.join(d, f)
            try:
                with open(p, encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            if text.strip():
                out.append({"src": "cpython:" + os.path.relpath(p, root), "text": text})
    return out


def gsm8k_docs():
    out = []
    with open(os.path.join(SHARED, "gsm8k_train.jsonl"), encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            r = json.loads(line)
            out.append({"src": f"gsm8k_train:{i}", "text": f"Question: {r['question']}\nAnswer: {r['answer']}\n"})
    return out


def mbpp_docs():
    out = []
    with open(os.path.join(SHARED, "mbpp.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            tid = int(r["task_id"])
            if not (601 <= tid <= 974):
                continue
            code = r["code"].replace("\r\n", "\n").replace("\t", "    ")
            out.append({"src": f"mbpp:{tid}", "text": f"# {r['text'].strip()}\n{code.rstrip()}\n"})
    return out


def original_split():
    """(train, val) document lists of the CPU recipe: seeded shuffle, first 2% held out.
    Also used by gpu/prepare.sh to carry this held-out split to the GPU machine."""
    docs = stdlib_docs() + gsm8k_docs() + mbpp_docs()
    rng = random.Random(SEED)
    rng.shuffle(docs)
    n_val = max(1, round(VAL_FRACTION * len(docs)))
    return docs[n_val:], docs[:n_val]


def cmd_docs(_args):
    os.makedirs(DATA, exist_ok=True)
    train, val = original_split()
    for name, part in (("train_docs.jsonl", train), ("val_docs.jsonl", val)):
        with open(os.path.join(DATA, name), "w", encoding="utf-8") as fh:
            for d in part:
                fh.write(json.dumps(d) + "\n")
    by = {}
    for name, part in (("train", train), ("val", val)):
        for d in part:
            k = (name, d["src"].split(":")[0])
            by[k] = by.get(k, 0) + 1
    print(f"documents: train {len(train)}, val {len(val)}; by source: {by}")


def read_docs(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def cmd_tokenize(_args):
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(DATA, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    stats = {"endoftext_id": eot}
    for split in ("train", "val"):
        docs = read_docs(f"{split}_docs.jsonl")
        encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
        ids = []
        per_src = {}
        for d, e in zip(docs, encs):
            ids.extend(e.ids)
            ids.append(eot)
            s = d["src"].split(":")[0]
            per_src[s] = per_src.get(s, 0) + len(e.ids) + 1
        arr = np.asarray(ids, dtype=np.uint16)
        assert arr.max() < 65536
        arr.tofile(os.path.join(DATA, f"{split}.bin"))
        stats[split] = {"documents": len(docs), "tokens": int(arr.size), "tokens_by_source": per_src,
                        "chars": sum(len(d["text"]) for d in docs)}
        print(f"{split}: {len(docs)} docs, {arr.size} tokens, by source {per_src}")
    with open(os.path.join(DATA, "corpus_stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1)
    os.makedirs(os.path.join(HERE, "logs"), exist_ok=True)
    with open(os.path.join(HERE, "logs", "corpus_stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["docs", "tokenize"])
    a = ap.parse_args(argv)
    {"docs": cmd_docs, "tokenize": cmd_tokenize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
