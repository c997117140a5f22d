"""Write a random-weight LLaDA2.0-MoE folder for timing the mixture-of-experts forward.

    python3 tools/make_moe_bench_model.py --out DIR [--experts 256] [--width 64] [--hidden 512]

LLaDA2.0-mini's routing shape (256 experts, top-8, 8 groups keep 4, one shared expert, layer 0
dense) at a smaller width, so that `spot bench-forward --model DIR` measures what computing only
the selected experts costs on a CPU. The weights are random (numpy, seeded): for timing only.
Needs numpy and safetensors; the tokenizer is absent (`--prompt-ids` / bench-forward only).
"""

import argparse
import json
import os

import numpy as np
from safetensors.numpy import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    h, heads, kv, d = a.hidden, 8, 2, a.hidden // 8
    cfg = {
        "model_type": "llada2_moe", "vocab_size": a.vocab, "hidden_size": h,
        "intermediate_size": 2 * h, "num_hidden_layers": a.layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": d, "rms_norm_eps": 1e-6, "rope_theta": 600000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "num_experts": a.experts,
        "num_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "moe_intermediate_size": a.width, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
        "score_function": "sigmoid", "norm_topk_prob": True, "use_qk_norm": True,
        "partial_rotary_factor": 0.5, "mask_token_id": a.vocab - 1, "eos_token_id": a.vocab - 2,
    }
    rng = np.random.default_rng(0)

    def mat(o, i):
        return (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float32)

    w = {"model.word_embeddings.weight": mat(a.vocab, h), "lm_head.weight": mat(a.vocab, h),
         "model.norm.weight": np.ones(h, np.float32)}
    for n in range(a.layers):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "attention.query_key_value.weight"] = mat((heads + 2 * kv) * d, h)
        w[p + "attention.dense.weight"] = mat(h, heads * d)
        w[p + "attention.query_layernorm.weight"] = np.ones(d, np.float32)
        w[p + "attention.key_layernorm.weight"] = np.ones(d, np.float32)
        if n == 0:
            for s, (o, i) in {"gate_proj": (2 * h, h), "up_proj": (2 * h, h), "down_proj": (h, 2 * h)}.items():
                w[p + f"mlp.{s}.weight"] = mat(o, i)
            continue
        w[p + "mlp.gate.weight"] = mat(a.experts, h)
        w[p + "mlp.gate.expert_bias"] = (rng.random(a.experts, dtype=np.float32) * 0.05).astype(np.float32)
        shapes = {"gate_proj": (a.width, h), "up_proj": (a.width, h), "down_proj": (h, a.width)}
        for e in range(a.experts):
            for s, (o, i) in shapes.items():
                w[p + f"mlp.experts.{e}.{s}.weight"] = mat(o, i)
        for s, (o, i) in shapes.items():
            w[p + f"mlp.shared_experts.{s}.weight"] = mat(o, i)
    os.makedirs(a.out, exist_ok=True)
    save_file(w, os.path.join(a.out, "model.safetensors"))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    total = sum(x.size for x in w.values())
    print(f"wrote {a.out}: {total:,} parameters")


if __name__ == "__main__":
    main()
