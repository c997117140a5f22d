#!/usr/bin/env python3
"""CPU baseline for block forwards: HF transformers Qwen3ForCausalLM (float32, eager) on an SDAR folder.

  make-bench-model --out DIR    write a random ~29.4M-parameter SDAR folder (config.json +
                                model.safetensors, float32, tied embeddings, no tokenizer)
  time --model DIR [--reps 10]  prefill a 256-token prefix into a DynamicCache, then time
                                forwards of B block states of 32 tokens against that cache
                                (B = 1 and 21); prints one JSON line

Runs with torch.set_num_threads(2) under torch.inference_mode().
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdar_oracle as oracle  # noqa: E402  (sets 1 thread; reset below)

torch.set_num_threads(2)

BENCH_SHAPES = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=2048,
)
BENCH_BLOCK = 32


def bench_config() -> dict:
    s = BENCH_SHAPES
    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        **{k: s[k] for k in s},
        "hidden_act": "silu",
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "block_size": BENCH_BLOCK,
        "mask_token_id": s["vocab_size"] - 1,
        "bos_token_id": None,
        "eos_token_id": s["vocab_size"] - 2,
        "use_cache": False,
    }


def cmd_make(args):
    from safetensors.torch import save_file

    os.makedirs(args.out, exist_ok=True)
    cfg = bench_config()
    tensors = oracle.store_tensors(oracle.random_weights(cfg, args.seed), "float32")
    save_file(tensors, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [cfg["eos_token_id"]]}, f)
        f.write("\n")
    n = sum(t.numel() for t in tensors.values())
    print(json.dumps({"out": args.out, "parameters": n, "bytes": os.path.getsize(os.path.join(args.out, "model.safetensors"))}))


def rect_block_causal_mask(batch: int, q_start: int, q_len: int, k_len: int, block: int) -> torch.Tensor:
    """Additive [B, 1, q_len, k_len] mask for queries at q_start.. against keys at 0..k_len."""
    qb = torch.arange(q_start, q_start + q_len) // block
    kb = torch.arange(k_len) // block
    m = torch.zeros(q_len, k_len)
    m.masked_fill_(~(kb[None, :] <= qb[:, None]), float("-inf"))
    return m[None, None].expand(batch, 1, q_len, k_len).contiguous()


@torch.inference_mode()
def cmd_time(args):
    from safetensors.torch import load_file
    from transformers import DynamicCache

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_file(os.path.join(args.model, "model.safetensors"))
    model = oracle.load_hf_model(cfg, tensors)
    del tensors
    L = cfg.get("block_size", BENCH_BLOCK)
    P = args.prefix
    mask_id = cfg["mask_token_id"]
    rng = np.random.default_rng(0)
    vocab = cfg["vocab_size"]
    prefix = torch.tensor(rng.integers(0, vocab - 2, size=P))[None]

    # (a) prefill
    cache = DynamicCache()
    t0 = time.perf_counter()
    model(
        input_ids=prefix,
        attention_mask=rect_block_causal_mask(1, 0, P, P, L),
        position_ids=torch.arange(P)[None],
        past_key_values=cache,
        use_cache=True,
    )
    prefill_ms = (time.perf_counter() - t0) * 1e3
    base = [(layer.keys, layer.values) for layer in cache.layers]
    assert base[0][0].shape[-2] == P

    def states(batch):
        s = rng.integers(0, vocab - 2, size=(batch, L))
        s[rng.random((batch, L)) < 0.6] = mask_id
        return torch.tensor(s)

    def forward(ids):
        b = ids.shape[0]
        # The cached prefix is broadcast to the batch as a view (expand, no copy). Note that
        # DynamicLayer.update then torch.cat's it with the block's K/V, which materializes
        # [B, kv_heads, P + L, head_dim] per layer on every forward (and eager attention's
        # repeat_kv copies again for GQA): that copying is part of the timed forward.
        for layer, (k, v) in zip(cache.layers, base):
            layer.keys = k.expand(b, -1, -1, -1)
            layer.values = v.expand(b, -1, -1, -1)
        out = model(
            input_ids=ids,
            attention_mask=rect_block_causal_mask(b, P, L, P + L, L),
            position_ids=torch.arange(P, P + L)[None].expand(b, L),
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits

    # Sanity: the cached block forward equals a full forward over prefix + state.
    s1 = states(1)
    cached = forward(s1)[0]
    full_ids = torch.cat([prefix, s1], 1)
    full = model(
        input_ids=full_ids,
        attention_mask=rect_block_causal_mask(1, 0, P + L, P + L, L),
        position_ids=torch.arange(P + L)[None],
        use_cache=False,
    ).logits[0, P:]
    check = float((cached - full).abs().max())

    result = {
        "model": os.path.abspath(args.model),
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "prefix": P,
        "block": L,
        "reps": args.reps,
        "prefill_ms": round(prefill_ms, 2),
        "cached_vs_full_max_abs_diff": check,
        "kv_expand": "view (expand) per forward; DynamicCache.update's cat copies it to [B,kv,P+L,d]",
    }
    for b in args.batches:
        ids = states(b)
        for _ in range(args.warmup):
            forward(ids)
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            forward(ids)
            times.append((time.perf_counter() - t0) * 1e3)
        result[f"b{b}_median_ms"] = round(statistics.median(times), 2)
        result[f"b{b}_min_ms"] = round(min(times), 2)
    for layer, (k, v) in zip(cache.layers, base):
        layer.keys, layer.values = k, v
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-bench-model")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(func=cmd_make)
    p = sub.add_parser("time")
    p.add_argument("--model", required=True)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prefix", type=int, default=256)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 21])
    p.set_defaults(func=cmd_time)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
