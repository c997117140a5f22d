#!/usr/bin/env python3
"""Draft-free greedy block decoding of an exported SDAR folder with transformers.

Block size 32. The prompt's whole blocks are context; the first decoded block starts with the
prompt tail and is otherwise fully masked; later blocks start fully masked. Each step runs the
model on prefix + current block with the block-causal mask (no KV cache), sets the mask logit
to -inf, softmax in float64, confidence = float32 probability of the argmax token, and commits
the most confident masked position (ties: lowest index). Decoding stops after a block that
contains a stop id (generation_config eos ids) or after --max-new-tokens (rounded up to blocks).
Writes logs/samples.txt and logs/decode_stats.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block_causal_mask  # noqa: E402
from export import load_folder  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CODE_PROMPTS = [
    "def fibonacci(n):",
    "def is_prime(n):",
    "class Stack:",
    "import os\ndef list_files(path):",
    "def reverse_string(s):",
]


@torch.inference_mode()
def block_logits(model, ids, L):
    n = len(ids)
    out = model(input_ids=torch.tensor([ids]), attention_mask=block_causal_mask(n, L),
                position_ids=torch.arange(n)[None], use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def decode(model, prompt, max_new, stop_ids, mask_id, L):
    P = len(prompt)
    first = (P // L) * L
    end = -(-(P + max_new) // L) * L
    done = list(prompt[:first])
    generated, steps = [], []
    for start in range(first, end, L):
        tail = list(prompt[start:min(P, start + L)])
        state = tail + [mask_id] * (L - len(tail))
        while mask_id in state:
            lg = block_logits(model, done + state, L)[start:start + L]
            masked = [s for s in range(L) if state[s] == mask_id]
            best = None
            for s in masked:
                row = lg[s].copy()
                row[mask_id] = -np.inf
                tok = int(np.argmax(row))
                r64 = row.astype(np.float64)
                e = np.exp(r64 - r64.max())
                conf = float(np.float32(e[tok] / e.sum()))
                if best is None or conf > best[1]:
                    best = (s, conf, tok)
            s, conf, tok = best
            state[s] = tok
            steps.append({"pos": start + s, "token": tok, "conf": conf, "leftmost": s == masked[0],
                          "masked_left": len(masked)})
        new = state[len(tail):]
        generated.extend(new)
        done.extend(state)
        if any(t in stop_ids for t in new):
            break
    return generated, steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "sdar-tiny-code"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--log-dir", default=os.path.join(HERE, "logs"))
    shared = os.environ.get("SPOT_SHARED_DATA") or os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--gsm8k-test", default=os.path.join(shared, "gsm8k_test.jsonl"))
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    model, cfg = load_folder(a.model)
    L = cfg["block_size"]
    mask_id = cfg["mask_token_id"]
    stop_ids = json.load(open(os.path.join(a.model, "generation_config.json")))["eos_token_id"]
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    math_prompts = []
    with open(a.gsm8k_test) as fh:
        for line in fh:
            math_prompts.append("Question: " + json.loads(line)["question"] + "\nAnswer:")
            if len(math_prompts) == 5:
                break
    prompts = [("code", p) for p in CODE_PROMPTS] + [("math", p) for p in math_prompts]
    os.makedirs(a.log_dir, exist_ok=True)
    all_steps, out_lines, per_sample = [], [], []
    t0 = time.time()
    for kind, p in prompts:
        ids = tok.encode(p, add_special_tokens=False).ids
        ts = time.time()
        gen, steps = decode(model, ids, a.max_new_tokens, stop_ids, mask_id, L)
        cut = gen[:a.max_new_tokens]
        for i, t in enumerate(cut):
            if t in stop_ids:
                cut = cut[:i + 1]
                break
        text = tok.decode(cut, skip_special_tokens=False)
        all_steps.extend(steps)
        confs = [s["conf"] for s in steps]
        per_sample.append({"kind": kind, "prompt": p, "prompt_tokens": len(ids), "new_tokens": len(cut),
                           "blocks": -(-len(gen) // L) if gen else 0, "steps": len(steps),
                           "stopped": any(t in stop_ids for t in gen),
                           "mean_conf": float(np.mean(confs)),
                           "non_leftmost_fraction": float(np.mean([not s["leftmost"] for s in steps])),
                           "seconds": round(time.time() - ts, 2), "completion": text})
        block = f"===== [{kind}] prompt: {p!r}\n{p}{text}\n"
        print(block, flush=True)
        out_lines.append(block)
    confs = np.array([s["conf"] for s in all_steps])
    qs = [1, 5, 10, 25, 50, 75, 90, 95, 99]
    hist_edges = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0]
    hist, _ = np.histogram(confs, bins=hist_edges)
    nl = np.array([not s["leftmost"] for s in all_steps])
    # steps with more than one masked position (the only ones where the order is a choice)
    choice = np.array([s["masked_left"] > 1 for s in all_steps])
    stats = {
        "model": os.path.relpath(a.model, ROOT) if a.model.startswith(ROOT) else a.model,
        "samples": len(prompts), "steps": int(len(all_steps)), "block_size": L,
        "max_new_tokens": a.max_new_tokens, "stop_ids": stop_ids,
        "committed_confidence": {
            "mean": float(confs.mean()), "std": float(confs.std()),
            "min": float(confs.min()), "max": float(confs.max()),
            "quantiles": {str(q): float(np.percentile(confs, q)) for q in qs},
            "histogram": {"edges": hist_edges, "counts": [int(c) for c in hist]},
            "fraction_ge_0.9": float((confs >= 0.9).mean()),
            "fraction_lt_0.5": float((confs < 0.5).mean()),
        },
        "non_leftmost_fraction": float(nl.mean()),
        "non_leftmost_fraction_excluding_last_masked": float(nl[choice].mean()) if choice.any() else None,
        "per_sample": per_sample,
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(a.log_dir, "decode_stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1)
    with open(os.path.join(a.log_dir, "samples.txt"), "w") as fh:
        fh.write("\n".join(out_lines))
    print(json.dumps({k: v for k, v in stats.items() if k != "per_sample"}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
