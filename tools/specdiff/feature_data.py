#!/usr/bin/env python3
"""Builds the feature drafter's training set (issue 47): the target's own greedy continuations
of training-side prompts in its chat template, and the target's hidden states at the tapped
layers for every position of each (prompt + continuation), in float16.

Prompts: GSM8K *train* questions, MBPP task texts, and MBPP tasks written as a Python stub
(the task's first `def` line and its text as a docstring, the shape of HumanEval's prompts);
none of them is a GSM8K-test or HumanEval prompt. Continuations: greedy (T = 0), up to
`--max-new` tokens, ending at the end-of-turn id, generated in batches by the plain-PyTorch
Llama of `llama_torch.py` (the definition `spot_models::CausalLm` runs) in `--dtype` (float32
by default; bfloat16 is faster only where the CPU has AMX, and a bfloat16 continuation may
differ from `spot generate`'s after a near tie); then one
teacher-forced float32 pass per sequence gives the tapped features and the float32 target's own
argmax at every position (`greedy`: the labels, what verification accepts). Output, resumable
by chunk: `OUT/chunk-NNNN.jsonl` (`{"id", "ids", "prompt_len", "greedy"}` per line) and
`OUT/chunk-NNNN.pt` (id -> [len, taps x d] float16).

    python tools/specdiff/feature_data.py --target ~/.cache/spot-smollm2 \
        --out ~/.cache/spot-feature-data --gsm 1200 --mbpp 400 --stubs 400

About 10 minutes per 1,000 prompts on the 2-core development machine (batches of 32).
"""

import argparse
import json
import re
import time
from pathlib import Path

import torch
from llama_torch import Llama
from tokenizers import Tokenizer

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(q: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def stub(task) -> str | None:
    m = re.search(r"^def [^\n]*:", task["code"].replace("\r", ""), re.M)
    if not m:
        return None
    return f'{m.group(0)}\n    """ {task["text"]}\n    """\n'


def prompts(data: Path, gsm: int, mbpp: int, stubs: int):
    out = []
    with (data / "gsm8k_train.jsonl").open() as f:
        for k, line in enumerate(f):
            if k >= gsm:
                break
            out.append((f"gsm-train-{k}", json.loads(line)["question"]))
    tasks = [json.loads(line) for line in (data / "mbpp.jsonl").open()]
    for k, t in enumerate(tasks[:mbpp]):
        out.append((f"mbpp-text-{k}", t["text"]))
    # Stubs from the other end of MBPP, so that texts and stubs are different tasks.
    for k, t in enumerate(reversed(tasks)):
        if k >= stubs:
            break
        s = stub(t)
        if s:
            out.append((f"mbpp-stub-{k}", s))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gsm", type=int, default=1200)
    ap.add_argument("--mbpp", type=int, default=400)
    ap.add_argument("--stubs", type=int, default=400)
    ap.add_argument("--taps", type=int, nargs="+", default=[8, 18, 28])
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="generation's")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample the continuations at this temperature (0: greedy); ids get a -tT suffix, so a --out may hold both",
    )
    ap.add_argument("--offset", type=int, default=0, help="skip this many prompts of each source (another part of the set)")
    ap.add_argument(
        "--tag",
        help="name the chunks chunk-TAG-NNNN (default: from --temperature and --offset); prompts whose id "
        "(with its -tT suffix) some chunk of --out already holds are skipped, so runs with other source "
        "counts can share an --out",
    )
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"taps": a.taps, "max_new": a.max_new, "target": str(a.target)}
    mp = a.out / "meta.json"
    if mp.exists() and json.loads(mp.read_text())["taps"] != a.taps:
        raise SystemExit(f"{mp}: made with other taps; use another --out")
    mp.write_text(json.dumps(meta))
    tok = Tokenizer.from_file(str(a.target / "tokenizer.json"))
    model = Llama(a.target)
    fast = model if a.dtype == "float32" else model.to(torch.bfloat16)
    stops = {2, 0}
    todo = prompts(a.data, a.gsm + a.offset, a.mbpp + a.offset, a.stubs + a.offset)
    if a.offset:
        by_source = {}
        for pid, q in todo:
            by_source.setdefault(pid.rsplit("-", 1)[0], []).append((pid, q))
        todo = [e for group in by_source.values() for e in group[a.offset :]]
    if a.temperature > 0:
        todo = [(f"{pid}-t{a.temperature:g}", q) for pid, q in todo]
    if a.tag:
        # Other tags' chunks only: this tag's own must not shift its chunk numbering on resume.
        mine = f"chunk-{a.tag}-"
        have = {
            json.loads(line)["id"]
            for p in a.out.glob("chunk-*.jsonl")
            if not p.name.startswith(mine)
            for line in p.open()
        }
        todo = [(pid, q) for pid, q in todo if pid not in have]
    # Similar lengths together: less padding per batch.
    enc = [(pid, tok.encode(chat(q), add_special_tokens=False).ids) for pid, q in todo]
    enc.sort(key=lambda e: len(e[1]))
    if a.tag:
        tag = f"-{a.tag}"
    else:
        tag = f"-t{a.temperature:g}" if a.temperature > 0 else ""
        tag += f"-o{a.offset}" if a.offset else ""
    t0 = time.time()
    for c in range(0, len(enc), a.chunk):
        name = a.out / f"chunk{tag}-{c // a.chunk:04d}"
        if name.with_suffix(".pt").exists():
            continue
        part = enc[c : c + a.chunk]
        conts = fast.generate([p for _, p in part], a.max_new, stops, a.temperature, seed=c)
        rows, feats = [], {}
        for s in range(0, len(part), 8):
            seqs = [p + cont for (_, p), cont in zip(part[s : s + 8], conts[s : s + 8])]
            outs = model.hidden_states_batch(seqs, a.taps)
            for (pid, p), ids, (h, arg) in zip(part[s : s + 8], seqs, outs):
                feats[pid] = h
                # greedy[i]: the float32 target's argmax after ids[: i + 1] (the label of
                # position i + 1; generation in bfloat16 can make it differ from ids[i + 1]).
                rows.append({"id": pid, "ids": ids, "prompt_len": len(p), "greedy": arg.tolist()})
        torch.save(feats, name.with_suffix(".pt.part"))
        name.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        name.with_suffix(".pt.part").rename(name.with_suffix(".pt"))
        gen = sum(len(r["ids"]) - r["prompt_len"] for r in rows)
        print(f"chunk {c // a.chunk}: {len(rows)} prompts, {gen} tokens, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
