#!/usr/bin/env python3
"""Byte-level BPE (GPT-2/Qwen style) with 6144 ids in total, trained on data/train_docs.jsonl.

6141 BPE ids (256 byte symbols + merges), then the special tokens appended:
<|endoftext|> = 6141, <|im_end|> = 6142, <|MASK|> = 6143 (asserted). Writes data/tokenizer.json.
"""
from __future__ import annotations

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
VOCAB = 6144
SPECIAL = ["<|endoftext|>", "<|im_end|>", "<|MASK|>"]


def main():
    docs = []
    with open(os.path.join(DATA, "train_docs.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            docs.append(json.loads(line)["text"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB - len(SPECIAL), tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL)
    assert tok.get_vocab_size() == VOCAB
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    assert ids == {"<|endoftext|>": 6141, "<|im_end|>": 6142, "<|MASK|>": 6143}, ids
    path = os.path.join(DATA, "tokenizer.json")
    tok.save(path)
    t2 = Tokenizer.from_file(path)
    s = "def f(x):\n    return x + 1  # ok\n<|endoftext|>"
    assert t2.decode(t2.encode(s).ids, skip_special_tokens=False) == s
    print(f"tokenizer: {t2.get_vocab_size()} ids, special {ids} -> {path}")


if __name__ == "__main__":
    sys.exit(main())
