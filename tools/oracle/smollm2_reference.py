#!/usr/bin/env python3
"""Compact PyTorch reference of a real Llama folder (SmolLM2-135M-Instruct from tools/setup_smollm2.sh).

    python3 tools/oracle/smollm2_reference.py --model DIR [--out FIXTURE_DIR] [--max-new-tokens 24]

DIR is the folder tools/setup_smollm2.sh (tools/convert_gguf.py) made, outside the repository.
Writes FIXTURE_DIR/reference.json and FIXTURE_DIR/reference.safetensors (default FIXTURE_DIR:
crates/spot-models/tests/fixtures/smollm2 of this repository; format in tools/oracle/README.md),
which are committed: the Rust test compares against them without torch. For each prompt:
the prompt ids; at every prompt position the top-64 float32 logits with their ids, the logits
at a fixed seeded subset of 1,024 vocabulary ids and the float64 logsumexp over the whole
vocabulary, from `LlamaForCausalLM` (float32, eager attention, one full causal forward); the
greedy continuation from `model.generate(do_sample=False, use_cache=True)` with the folder's
EOS (ids, decoded text, stop flag, the top-64 logits and logsumexp of every step, the smallest
top1 - top2 gap on the path); the float32-vs-float64 noise floor. The sha256 of the folder's
model.safetensors (checked here against conversion.json) and of the GGUF, and the versions of
the libraries used, are recorded. It prints the greedy texts so one can see the model is sane.

Needs tools/oracle/requirements.txt (torch, transformers 4.57 or 5.x, tokenizers, safetensors,
numpy).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Mapping

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

torch.set_num_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "..", "crates", "spot-models", "tests", "fixtures", "smollm2"))

# name, kind, content: chat prompts are rendered with the folder's chat template
# (add_generation_prompt=True, the template's default system message); text prompts are raw.
PROMPTS = [
    ("chat_capital", "chat", "What is the capital of France?"),
    ("text_code", "text", "def is_prime(n):\n"),
    ("chat_arithmetic", "chat", "What is 15 + 27?"),
]
TOP_K = 64
SAMPLE_SIZE = 1024
SAMPLE_SEED = 20251201


def chat_ids(hf_tok, messages) -> list[int]:
    """`apply_chat_template(tokenize=True)` as a plain list of ids: transformers 4.x returns a
    list, 5.x a `BatchEncoding` (a Mapping with "input_ids")."""
    out = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):  # a batch of one
        assert len(out) == 1, len(out)
        out = list(out[0])
    return [int(x) for x in out]


def top_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the k largest float32 logits, descending (ties: lower id first), and their ids."""
    order = np.argsort(-rows, axis=-1, kind="stable")[:, :k]
    return order.astype(np.int32), np.take_along_axis(rows, order, -1).astype(np.float32)


def logsumexp64(rows: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) over the whole vocabulary, in float64, from float32 logits."""
    r = rows.astype(np.float64)
    m = r.max(-1, keepdims=True)
    return (m[:, 0] + np.log(np.exp(r - m).sum(-1))).astype(np.float64)


def library_versions() -> dict:
    from importlib.metadata import version

    v = {"python": platform.python_version(), **oc.versions(with_numpy=True)}
    for name in ("safetensors", "huggingface_hub", "jinja2"):
        v[name] = version(name)
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the converted folder (tools/setup_smollm2.sh DIR)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="where reference.json / reference.safetensors go (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args(argv)

    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder = args.model
    t0 = time.time()
    conversion = oc.load_json(os.path.join(folder, "conversion.json"))
    weights_sha = oc.sha256_file(os.path.join(folder, "model.safetensors"))
    if weights_sha != conversion.get("model_sha256"):
        raise SystemExit(f"{folder}/model.safetensors has sha256 {weights_sha}, conversion.json records {conversion.get('model_sha256')}")
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(folder)
    gen = oc.load_json(os.path.join(folder, "generation_config.json"))
    eos = gen["eos_token_id"]
    stop_ids = eos if isinstance(eos, list) else [eos]
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    model64 = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
    vocab = model.config.vocab_size
    sample_ids = np.sort(np.random.default_rng(SAMPLE_SEED).choice(vocab, SAMPLE_SIZE, replace=False)).astype(np.int32)

    tensors: dict[str, np.ndarray] = {"sample_ids": sample_ids}
    cases = []
    for i, (name, kind, content) in enumerate(PROMPTS):
        if kind == "chat":
            messages = [{"role": "user", "content": content}]
            text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_hf = chat_ids(hf_tok, messages)
            assert ids == ids_hf, (ids, ids_hf)
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
        assert [int(np.argmax(r)) for r in steps] == new
        cache_diff = float(np.abs(full_steps - steps).max())
        # float32 noise floor: the same forward in float64.
        with torch.inference_mode():
            l64 = model64(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].numpy()
        f64_diff = float(np.abs(l64 - logits).max())
        gap = min(oc.top_gap(r) for r in steps)
        greedy_text = tok.decode(new, skip_special_tokens=False)

        p_ids, p_top = top_k(logits, TOP_K)
        s_ids, s_top = top_k(steps, TOP_K)
        assert int(s_ids[0, 0]) == new[0] and int(p_ids[-1, 0]) == new[0]
        tensors[f"prompt.{i}.top_ids"] = p_ids
        tensors[f"prompt.{i}.top_logits"] = p_top
        tensors[f"prompt.{i}.sample_logits"] = np.ascontiguousarray(logits[:, sample_ids]).astype(np.float32)
        tensors[f"prompt.{i}.logsumexp"] = logsumexp64(logits)
        tensors[f"steps.{i}.top_ids"] = s_ids
        tensors[f"steps.{i}.top_logits"] = s_top
        tensors[f"steps.{i}.logsumexp"] = logsumexp64(steps)
        cases.append(
            dict(
                name=name,
                kind=kind,
                messages=messages,
                prompt_text=text,
                prompt_ids=ids,
                prompt_key=f"prompt.{i}",
                steps_key=f"steps.{i}",
                max_new_tokens=args.max_new_tokens,
                greedy_ids=new,
                greedy_text=greedy_text,
                greedy_text_skip_special=tok.decode(new, skip_special_tokens=True),
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

    os.makedirs(args.out, exist_ok=True)
    st_path = os.path.join(args.out, "reference.safetensors")
    save_file(tensors, st_path, metadata={"format": "np"})
    os.chmod(st_path, 0o644)
    ref = dict(
        generator=dict(
            tool="tools/oracle/smollm2_reference.py",
            oracle="LlamaForCausalLM float32 eager, one torch thread; greedy via generate(do_sample=False, use_cache=True)",
            **library_versions(),
        ),
        model=conversion.get("general.name"),
        gguf_file=conversion["gguf_file"],
        gguf_sha256=conversion["gguf_sha256"],
        model_sha256=weights_sha,
        model_bytes=os.path.getsize(os.path.join(folder, "model.safetensors")),
        tokenizer_sha256=oc.sha256_file(os.path.join(folder, "tokenizer.json")),
        conversion_versions=conversion.get("versions"),
        parameters=conversion.get("parameters"),
        vocab_size=vocab,
        stop_ids=stop_ids,
        top_k=TOP_K,
        sample_size=SAMPLE_SIZE,
        sample_seed=SAMPLE_SEED,
        cases=cases,
    )
    json_path = os.path.join(args.out, "reference.json")
    oc.write_json(json_path, ref, indent=1, ensure_ascii=False)
    size = os.path.getsize(json_path) + os.path.getsize(st_path)
    print(f"wrote {json_path} and reference.safetensors ({size} bytes) in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
