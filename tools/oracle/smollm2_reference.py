#!/usr/bin/env python3
"""Reference outputs of a real Llama folder (SmolLM2-135M-Instruct converted by convert_gguf.py).

    python3 tools/oracle/smollm2_reference.py --model DIR [--max-new-tokens 24]

Writes DIR/reference.json and DIR/reference.safetensors (format in tools/oracle/README.md):
for each prompt the prompt ids, the float32 logits at every prompt position from
`LlamaForCausalLM` (float32, eager attention, one full causal forward), and the greedy
continuation from `model.generate(do_sample=False, use_cache=True)` with the folder's EOS
(ids, decoded text, the per-step logits and the smallest top1 - top2 logit gap on the path).
It prints the greedy texts so one can see the model is sane.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

torch.set_num_threads(1)

# name, kind, content: chat prompts are rendered with the folder's chat template
# (add_generation_prompt=True, the template's default system message); text prompts are raw.
PROMPTS = [
    ("chat_capital", "chat", "What is the capital of France?"),
    ("text_code", "text", "def is_prime(n):\n"),
    ("chat_arithmetic", "chat", "What is 15 + 27?"),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args(argv)

    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    folder = args.model
    t0 = time.time()
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(folder)
    gen = oc.load_json(os.path.join(folder, "generation_config.json"))
    eos = gen["eos_token_id"]
    stop_ids = eos if isinstance(eos, list) else [eos]
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    model64 = None

    tensors, cases = {}, []
    for i, (name, kind, content) in enumerate(PROMPTS):
        if kind == "chat":
            messages = [{"role": "user", "content": content}]
            text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_hf = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            if isinstance(ids_hf, dict):
                ids_hf = ids_hf["input_ids"]
            assert ids == list(ids_hf), (ids, ids_hf)
        else:
            messages = None
            text = content
            ids = tok.encode(text, add_special_tokens=False).ids
        logits = oc.hf_causal_logits(model, ids)
        new, steps = oc.hf_greedy(model, ids, args.max_new_tokens, stop_ids, gen.get("pad_token_id", stop_ids[0]))
        stopped = bool(new) and new[-1] in stop_ids
        # The same continuation from one full no-cache forward over prompt + continuation.
        full = oc.hf_causal_logits(model, ids + new)
        full_steps = full[len(ids) - 1 : len(ids) - 1 + len(new)]
        assert [int(np.argmax(r)) for r in full_steps] == new, "cached and full-forward greedy paths differ"
        cache_diff = float(np.abs(full_steps - steps).max())
        # float32 noise floor: the same forward in float64.
        if model64 is None:
            model64 = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
        with torch.inference_mode():
            l64 = model64(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].numpy()
        f64_diff = float(np.abs(l64 - logits).max())
        gap = min(oc.top_gap(r) for r in steps)
        greedy_text = tok.decode(new, skip_special_tokens=False)
        tensors[f"logits.{i}"] = torch.from_numpy(np.ascontiguousarray(logits))
        tensors[f"steps.{i}"] = torch.from_numpy(np.ascontiguousarray(steps))
        cases.append(
            dict(
                name=name,
                kind=kind,
                messages=messages,
                prompt_text=text,
                prompt_ids=ids,
                logits_key=f"logits.{i}",
                steps_key=f"steps.{i}",
                max_new_tokens=args.max_new_tokens,
                greedy_ids=new,
                greedy_text=greedy_text,
                stopped=stopped,
                min_logit_gap=gap,
                f32_vs_f64_max_abs_diff=f64_diff,
                cached_vs_full_max_abs_diff=cache_diff,
            )
        )
        print(f"[{name}] {len(ids)} prompt ids, {len(new)} new{' (stopped at EOS)' if stopped else ''}, "
              f"min gap {gap:.4g}, f32 vs f64 {f64_diff:.3g}, cached vs full {cache_diff:.3g}")
        print(f"    prompt: {text!r}")
        print(f"    greedy: {greedy_text!r}")

    weights_sha = oc.sha256_file(os.path.join(folder, "model.safetensors"))
    save_file(tensors, os.path.join(folder, "reference.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(folder, "reference.safetensors"), 0o644)
    ref = dict(
        generator=dict(
            tool="tools/oracle/smollm2_reference.py",
            oracle="LlamaForCausalLM float32 eager; greedy via generate(do_sample=False, use_cache=True)",
            **oc.versions(with_numpy=False),
        ),
        model_sha256=weights_sha,
        vocab_size=model.config.vocab_size,
        stop_ids=stop_ids,
        cases=cases,
    )
    oc.write_json(os.path.join(folder, "reference.json"), ref, indent=1, ensure_ascii=False)
    print(f"wrote {folder}/reference.json and reference.safetensors ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
