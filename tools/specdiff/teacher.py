#!/usr/bin/env python3
"""Writes SmolLM2's own greedy continuations of training-side prompts (the SpecDiff-2
drafter's teacher data): GSM8K *train* questions and MBPP 601-974 tasks, each in the target's
chat template, as JSONL lines `{"id", "ids", "prompt_len"}` (prompt plus continuation ids).

Resumes: ids already in --out are skipped. Never add evaluation prompts (GSM8K test,
HumanEval, MBPP 11-510, MATH-500).

    python tools/specdiff/teacher.py --target ~/.cache/spot-smollm2 --data ../shared/data \
        --out work/teacher.jsonl --limit 600 --max-new-tokens 192
"""

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def prompts(data: Path):
    gsm = [json.loads(line) for line in (data / "gsm8k_train.jsonl").open()]
    mbpp = [json.loads(line) for line in (data / "mbpp.jsonl").open()][600:974]
    for i in range(max(len(gsm), len(mbpp))):
        if i < len(gsm):
            yield f"gsm8k-train/{i}", gsm[i]["question"]
        if i < len(mbpp):
            r = mbpp[i]
            yield f"mbpp/{r.get('task_id', 601 + i)}", r["text"].strip() + " Write a Python function."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.target)
    model = AutoModelForCausalLM.from_pretrained(a.target, torch_dtype=torch.float32).eval()
    done = set()
    if a.out.exists():
        done = {json.loads(line)["id"] for line in a.out.open()}
    todo = [(i, p) for i, p in prompts(a.data) if i not in done][: max(0, a.limit - len(done))]
    tok.padding_side = "left"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    t0 = time.time()
    with a.out.open("a") as f:
        for b in range(0, len(todo), a.batch):
            chunk = todo[b : b + a.batch]
            texts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
                )
                for _, p in chunk
            ]
            ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            width = max(len(x) for x in ids)
            pad = tok.pad_token_id if tok.pad_token_id is not None else eos
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            with torch.no_grad():
                out = model.generate(
                    input_ids=inp,
                    attention_mask=att,
                    max_new_tokens=a.max_new_tokens,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
            for (pid, _), x, row in zip(chunk, ids, out):
                cont = row[width:].tolist()
                if eos in cont:
                    cont = cont[: cont.index(eos) + 1]
                f.write(json.dumps({"id": pid, "ids": x + cont, "prompt_len": len(x)}) + "\n")
            f.flush()
            n = b + len(chunk)
            print(f"{len(done) + n}/{len(done) + len(todo)} prompts, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
