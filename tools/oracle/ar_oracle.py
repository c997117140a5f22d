#!/usr/bin/env python3
"""AR oracle: tiny random Llama and Qwen2 model folders plus golden outputs from transformers.

Both are plain causal (autoregressive) LMs with standard HuggingFace configs and weight names:

  llama-tiny  LlamaForCausalLM, tied embeddings (no lm_head.weight, like SmolLM2), no biases,
              rope_theta 1e5, rms_norm_eps 1e-5
  qwen2-tiny  Qwen2ForCausalLM, untied, q/k/v projections with (non-trivial) biases,
              rope_theta 1e6, rms_norm_eps 1e-6

The oracle is the transformers model class itself in float32 with eager attention: full causal
forwards for the logits cases and `model.generate(do_sample=False, use_cache=True)` for the
greedy decode cases. The tokenizer is the SDAR fixture tokenizer (sdar_oracle.build_tokenizer)
with only <|endoftext|> (370) and <|im_end|> (371) as special tokens.

Subcommands:
  make-fixtures --out DIR   write DIR/llama-tiny and DIR/qwen2-tiny (model + golden files)
  self-check    --out DIR   reload the folders and check them (see README.md)
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch

from sdar_oracle import BPE_VOCAB, MIN_GAP, PROMPT_TEXT, build_tokenizer

torch.set_num_threads(1)

# The SDAR fixture tokenizer's 370 BPE tokens plus these (ids 370, 371); no mask token.
AR_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>"]

SHAPES = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)

# name, family, weight seed, case seed, eos alignment strength (see align_eos_row)
FIXTURES = [
    ("llama-tiny", "llama", 20250101, 8101, 2.0),
    ("qwen2-tiny", "qwen2", 20250102, 8102, 1.6),
]

# (prompt length, max_new_tokens, early_stop, what the case must show)
#   "free":  no constraint beyond the logit gap
#   "stop":  early_stop and an EOS ends generation before max_new_tokens
#   "nostop": early_stop but no EOS within max_new_tokens (runs to the limit)
#   "through": early_stop false and an EOS is generated before the end, followed by other
#              tokens (decoding goes on past it)
DECODE_SPECS = [
    (1, 16, False, "free"),
    (7, 24, True, "nostop"),
    (12, 40, True, "stop"),
    (20, 32, False, "through"),
    (33, 20, True, "free"),
]

# logits cases: sequence lengths (the first two use the tokenized PROMPT_TEXT)
LOGITS_LENGTHS = [1, 9, 24, 40, 64]


# --------------------------------------------------------------------------------------------
# Config and weights
# --------------------------------------------------------------------------------------------


def ar_config(family: str, ids: dict) -> dict:
    """config.json as transformers writes it for the family (fields in alphabetical order)."""
    import transformers

    s = SHAPES
    bos, eos = ids["<|endoftext|>"], ids["<|im_end|>"]
    common = {
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": s["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": s["intermediate_size"],
        "max_position_embeddings": s["max_position_embeddings"],
        "num_attention_heads": s["num_attention_heads"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_key_value_heads": s["num_key_value_heads"],
        "rope_scaling": None,
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "vocab_size": s["vocab_size"],
    }
    if family == "llama":
        cfg = dict(
            common,
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            attention_bias=False,
            head_dim=s["head_dim"],  # Llama configs written by recent transformers carry it
            mlp_bias=False,
            pretraining_tp=1,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        )
    elif family == "qwen2":
        # Qwen2 configs have no head_dim field: hidden_size / num_attention_heads (= 16).
        assert s["hidden_size"] // s["num_attention_heads"] == s["head_dim"]
        cfg = dict(
            common,
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            max_window_layers=s["num_hidden_layers"],
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            use_sliding_window=False,
        )
    else:
        raise ValueError(family)
    return dict(sorted(cfg.items()))


def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights with HF Llama/Qwen2 names, scaled so the model is peaked.

    Much as the SDAR fixtures: projections std 1/sqrt(fan_in); output matrix std 0.55 (tied
    embedding, or untied lm_head whose input embedding then has std 1); every norm weight
    1 + 0.1 N(0,1). Qwen2's q/k/v biases are N(0, 0.5^2) (q, k) and N(0, 0.3^2) (v): large
    enough that dropping one (or adding it after RoPE instead of before) changes the logits.

    Tied embeddings: the final norm weight also gets random signs. Otherwise the current
    token's own embedding, still in the residual stream, scores itself highest (e_x . e_x =
    |e_x|^2 beats e_x . e_t) and greedy decoding of a random model just repeats the last token
    (about 90% of steps); with signed gains the self term has mean zero (about 5% repeats).
    """
    rng = np.random.default_rng(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // nh
    v = cfg["vocab_size"]
    tie = cfg["tie_word_embeddings"]
    bias = cfg["model_type"] == "qwen2"

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = normal((v, h), 0.55 if tie else 1.0)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = normal((nh * d, h), 1.0 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = normal((nkv * d, h), 1.0 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = normal((nkv * d, h), 1.0 / math.sqrt(h))
        if bias:
            w[p + "self_attn.q_proj.bias"] = normal(nh * d, 0.5)
            w[p + "self_attn.k_proj.bias"] = normal(nkv * d, 0.5)
            w[p + "self_attn.v_proj.bias"] = normal(nkv * d, 0.3)
        w[p + "self_attn.o_proj.weight"] = normal((h, nh * d), 1.0 / math.sqrt(nh * d))
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = normal((i, h), 1.0 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = normal((i, h), 1.0 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = normal((h, i), 1.0 / math.sqrt(i))
    w["model.norm.weight"] = norm(h)
    if tie:
        w["model.norm.weight"] *= np.where(rng.random(h) < 0.5, -1.0, 1.0).astype(np.float32)
    if not tie:
        w["lm_head.weight"] = normal((v, h), 0.55)
    return w


def to_tensors(w: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in w.items()}


def load_hf_model(cfg: dict, tensors: dict[str, torch.Tensor]):
    """LlamaForCausalLM / Qwen2ForCausalLM (float32, eager) holding exactly `tensors`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls_cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[cfg["model_type"]]
    kw = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "transformers_version", "torch_dtype")}
    hcfg = cls_cfg(**kw)
    hcfg._attn_implementation = "eager"
    model = cls(hcfg).to(torch.float32).eval()
    sd = {k: t.to(torch.float32) for k, t in tensors.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    if cfg["tie_word_embeddings"]:
        assert list(missing) == ["lm_head.weight"], missing
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert not missing, missing
    params = dict(model.named_parameters(remove_duplicate=False))
    assert set(params) == set(sd) | ({"lm_head.weight"} if cfg["tie_word_embeddings"] else set()), sorted(params)
    for k, t in sd.items():
        assert torch.equal(params[k].detach(), t), k
    return model


@torch.inference_mode()
def align_eos_row(model, cfg: dict, w: dict[str, np.ndarray], eos_id: int, strength: float, seed: int):
    """Make <|im_end|> a token the model sometimes predicts (as sdar_oracle.align_eos_row).

    The output row of the EOS token becomes 0.5 * (its random row) + strength * u, where u is
    the unit mean of the final normed hidden states on 16 seeded random 40-token sequences.
    """
    captured = []
    hook = model.model.norm.register_forward_hook(lambda mod, inp, out: captured.append(out.detach().clone()))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, BPE_VOCAB, size=(16, 40)).tolist()
    model(input_ids=torch.tensor(rows), use_cache=False)
    hook.remove()
    u = captured[-1].reshape(-1, cfg["hidden_size"]).to(torch.float64).mean(0).numpy()
    u /= np.linalg.norm(u)
    key = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    w[key][eos_id] = (0.5 * w[key][eos_id].astype(np.float64) + strength * u).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Oracle computations
# --------------------------------------------------------------------------------------------


@torch.inference_mode()
def hf_logits(model, ids: list[int]) -> np.ndarray:
    """float32 logits [n, V] of a full causal forward (no cache, positions 0..n-1)."""
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def top_gap(row: np.ndarray) -> float:
    top2 = np.sort(np.asarray(row, dtype=np.float32))[-2:]
    return float(top2[1]) - float(top2[0])


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | None, pad_id: int):
    """`model.generate(do_sample=False, use_cache=True)`; returns (new tokens, per-step logits).

    stop_ids None disables EOS stopping (generation runs to max_new_tokens even through EOS).
    """
    from transformers import GenerationConfig

    gc = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        bos_token_id=None,
        temperature=None,
        top_p=None,
        top_k=None,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=True,
    )
    ids = torch.tensor([prompt], dtype=torch.long)
    # generate() fills an unset eos_token_id from model.generation_config (whatever
    # use_model_defaults says), so EOS stopping is switched off there for the call.
    saved = model.generation_config.eos_token_id
    if stop_ids is None:
        model.generation_config.eos_token_id = None
    try:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc, use_model_defaults=False)
    finally:
        model.generation_config.eos_token_id = saved
    new = out.sequences[0, len(prompt) :].tolist()
    steps = np.stack([lg[0].to(torch.float32).numpy() for lg in out.logits])
    assert len(steps) == len(new)
    return new, steps


def reference_greedy(logits_fn, prompt, max_new_tokens, stop_ids):
    """Greedy decoding from full recomputes: token = argmax of the last position's logits."""
    seq = list(prompt)
    new, gaps = [], []
    for _ in range(max_new_tokens):
        row = logits_fn(seq)[-1]
        t = int(np.argmax(row))
        gaps.append(top_gap(row))
        new.append(t)
        seq.append(t)
        if stop_ids and t in stop_ids:
            break
    return new, min(gaps)


# --------------------------------------------------------------------------------------------
# Independent float64 numpy forward (causal Llama / Qwen2), for the self-check
# --------------------------------------------------------------------------------------------


def numpy_reference_logits(cfg: dict, tensors: dict[str, torch.Tensor], ids: list[int]) -> np.ndarray:
    w = {k: t.to(torch.float64).numpy() for k, t in tensors.items()}
    eps = cfg["rms_norm_eps"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // nh
    n = len(ids)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    inv = cfg["rope_theta"] ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]

    def rope(x):  # [n, heads, d], rotate-half pairs (i, i + d/2)
        return x * cos + np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    causal = np.tril(np.ones((n, n), dtype=bool))
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").reshape(n, nh, d))
        k = rope(lin(h, p + "self_attn.k_proj").reshape(n, nkv, d))
        v = lin(h, p + "self_attn.v_proj").reshape(n, nkv, d)
        out = np.zeros((n, nh, d))
        for head in range(nh):
            kv = head // (nh // nkv)
            s = np.where(causal, q[:, head] @ k[:, kv].T / math.sqrt(d), -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + lin(out.reshape(n, nh * d), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = lin(h, p + "mlp.gate_proj"), lin(h, p + "mlp.up_proj")
        x = x + lin(g / (1.0 + np.exp(-g)) * u, p + "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


# --------------------------------------------------------------------------------------------
# Fixture generation
# --------------------------------------------------------------------------------------------


def peakedness(model, rng) -> dict:
    lg = np.stack([hf_logits(model, rng.integers(0, BPE_VOCAB, size=32).tolist()) for _ in range(4)])
    l64 = lg.astype(np.float64)
    p = np.exp(l64 - l64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return dict(logit_std=float(lg.std(-1).mean()), top1_mean=float(p.max(-1).mean()), top1_median=float(np.median(p.max(-1))))


def make_fixture(out_dir, name, family, wseed, cseed, eos_align, tok, ids, tok_sha):
    from safetensors.torch import save_file

    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    cfg = ar_config(family, ids)
    eos_id = ids["<|im_end|>"]
    stop_ids = [eos_id, ids["<|endoftext|>"]]
    pad_id = ids["<|endoftext|>"]

    weights = random_weights(cfg, wseed)
    align_eos_row(load_hf_model(cfg, to_tensors(weights)), cfg, weights, eos_id, eos_align, wseed + 1)
    tensors = to_tensors(weights)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": stop_ids, "pad_token_id": pad_id}
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(folder, "tokenizer.json"))

    model = load_hf_model(cfg, tensors)
    rng = np.random.default_rng(cseed)
    print(f"[{name}] peakedness: {peakedness(model, rng)}")
    text_ids = tok.encode(PROMPT_TEXT).ids
    assert len(text_ids) >= 24

    def rand_tokens(n):
        return rng.integers(0, BPE_VOCAB, size=n).tolist()

    golden_tensors = {}
    logits_cases = []
    for ci, n in enumerate(LOGITS_LENGTHS):
        seq = text_ids[:n] if ci in (1, 2) else rand_tokens(n)
        if ci == 4:
            seq[20] = eos_id  # a special token inside the context
        key = f"logits.{ci}"
        golden_tensors[key] = torch.from_numpy(np.ascontiguousarray(hf_logits(model, seq), dtype=np.float32))
        logits_cases.append({"key": key, "ids": seq})

    decode_cases = []
    for di, (plen, max_new, early, want) in enumerate(DECODE_SPECS):
        attempt = 0
        while True:
            prompt = text_ids[:plen] if attempt == 0 and di % 2 == 0 else rand_tokens(plen)
            attempt += 1
            new, steps = hf_greedy(model, prompt, max_new, stop_ids if early else None, pad_id)
            gap = min(top_gap(r) for r in steps)
            has_eos = [t in stop_ids for t in new]
            stopped = early and has_eos[-1]
            ok = gap >= MIN_GAP and not (early and stopped and len(new) == max_new)
            if want == "stop":
                ok = ok and stopped and len(new) < max_new
            elif want == "nostop":
                ok = ok and not any(has_eos)
            elif want == "through":  # an EOS early on, and ordinary tokens after it
                first = has_eos.index(True) if any(has_eos) else max_new
                ok = ok and first < max_new - 4 and not all(has_eos[first:])
            print(
                f"[{name}] decode case {di}: P={plen} n={max_new} early_stop={early} attempt={attempt} "
                f"min_logit_gap={gap:.4g} new={len(new)} eos_at={[i for i, e in enumerate(has_eos) if e]}"
                + ("" if ok else "  -> redraw")
            )
            if ok:
                break
            if attempt > 500:
                raise SystemExit(f"could not draw decode case {di} ({want}) for {name}")
        decode_cases.append(
            {
                "prompt": prompt,
                "max_new_tokens": max_new,
                "early_stop": early,
                "stop_ids": stop_ids,
                "tokens": new,
                "stopped": bool(stopped),
                "min_logit_gap": gap,
            }
        )

    save_file(golden_tensors, os.path.join(folder, "golden.safetensors"), metadata={"format": "pt"})
    import tokenizers
    import transformers

    golden = {
        "model_type": cfg["model_type"],
        "vocab_size": cfg["vocab_size"],
        "bos_id": cfg["bos_token_id"],
        "stop_ids": stop_ids,
        "generator": {
            "tool": "tools/oracle/ar_oracle.py make-fixtures",
            "oracle": cfg["architectures"][0] + " float32 eager; decode via generate(do_sample=False, use_cache=True)",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
            "weight_seed": wseed,
            "case_seed": cseed,
            "eos_align": eos_align,
            "tokenizer_text_sha256": tok_sha,
        },
        "logits_cases": logits_cases,
        "decode_cases": decode_cases,
    }
    with open(os.path.join(folder, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    return folder


def cmd_make_fixtures(args):
    tok, ids, sha = build_tokenizer(AR_SPECIAL_TOKENS)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, special ids {ids}")
    for name, family, wseed, cseed, eos_align in FIXTURES:
        folder = make_fixture(args.out, name, family, wseed, cseed, eos_align, tok, ids, sha)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"[{name}] wrote {folder} ({size} bytes)")


# --------------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------------


def cmd_self_check(args):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    failures = 0

    def check(cond, msg):
        nonlocal failures
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures += 1

    for name, family, *_ in FIXTURES:
        folder = os.path.join(args.out, name)
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(folder, "golden.json")) as f:
            golden = json.load(f)
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        check(tok.get_vocab_size() <= cfg["vocab_size"], f"[{name}] tokenizer loads, size {tok.get_vocab_size()}")
        check(tok.token_to_id("<|im_end|>") == cfg["eos_token_id"] == golden["stop_ids"][0], f"[{name}] eos id")
        check(tok.token_to_id("<|endoftext|>") == cfg["bos_token_id"] == golden["stop_ids"][1], f"[{name}] bos / second stop id")
        enc = tok.encode("x = json.dumps(obj)<|im_end|>")
        check(tok.decode(enc.ids, skip_special_tokens=False) == "x = json.dumps(obj)<|im_end|>", f"[{name}] round trip {enc.ids}")
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        check(all(t.dtype == torch.float32 for t in tensors.values()), f"[{name}] all tensors float32")
        check(("lm_head.weight" in tensors) == (not cfg["tie_word_embeddings"]), f"[{name}] lm_head present iff untied")
        nb = sum(k.endswith(".bias") for k in tensors)
        check(nb == (3 * cfg["num_hidden_layers"] if family == "qwen2" else 0), f"[{name}] {nb} bias tensors")
        print(f"     [{name}] parameters stored: {sum(t.numel() for t in tensors.values())}")

        model = load_hf_model(cfg, tensors)
        fp = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        check(type(fp).__name__ == cfg["architectures"][0], f"[{name}] from_pretrained gives {type(fp).__name__}")
        gl = load_file(os.path.join(folder, "golden.safetensors"))
        for case in golden["logits_cases"]:
            want = gl[case["key"]].numpy()
            check(want.shape == (len(case["ids"]), cfg["vocab_size"]), f"[{name}] {case['key']} shape {want.shape}")
            diff = float(np.abs(hf_logits(model, case["ids"]) - want).max())
            diff2 = float(np.abs(hf_logits(fp, case["ids"]) - want).max())
            check(diff <= 1e-5 and diff2 <= 1e-5, f"[{name}] {case['key']} recomputed (state dict / from_pretrained), max |diff| {diff:.3g} / {diff2:.3g}")
            rdiff = float(np.abs(numpy_reference_logits(cfg, tensors, case["ids"]) - want).max())
            check(rdiff <= 1e-4, f"[{name}] {case['key']} vs float64 numpy reference, max |diff| {rdiff:.3g}")
            # causal: a prefix's logits do not depend on later tokens
            n = len(case["ids"])
            if n > 2:
                pre = hf_logits(model, case["ids"][: n // 2])
                check(float(np.abs(pre - want[: n // 2]).max()) <= 1e-5, f"[{name}] {case['key']} prefix of length {n // 2} gives the same logits")

        # Deleting a part of the model must change the logits (each one is really used).
        case = golden["logits_cases"][3]
        want = gl[case["key"]].numpy()
        probes = ["model.layers.1.post_attention_layernorm.weight", "model.norm.weight", "model.layers.0.self_attn.k_proj.weight"]
        if family == "qwen2":
            probes += ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias", "model.layers.0.self_attn.v_proj.bias"]
        for key in probes:
            t2 = dict(tensors)
            t2[key] = torch.ones_like(t2[key]) if key.endswith("norm.weight") else torch.zeros_like(t2[key])
            d = float(np.abs(hf_logits(load_hf_model(cfg, t2), case["ids"]) - want).max())
            check(d > 1e-2, f"[{name}] neutralising {key} changes logits by {d:.3g}")
        # The RoPE base matters.
        cfg2 = dict(cfg, rope_theta=10000.0)
        d = float(np.abs(hf_logits(load_hf_model(cfg2, tensors), case["ids"]) - want).max())
        check(d > 1e-3, f"[{name}] rope_theta 1e4 instead of {cfg['rope_theta']:g} changes logits by {d:.3g}")

        # Decode cases: replay with generate, with full recomputes, and with the numpy reference.
        ref_fn = lambda ids: numpy_reference_logits(cfg, tensors, ids).astype(np.float32)  # noqa: E731
        nocache_fn = lambda ids: hf_logits(model, ids)  # noqa: E731
        for i, dc in enumerate(golden["decode_cases"]):
            stops = dc["stop_ids"] if dc["early_stop"] else None
            new, steps = hf_greedy(fp, dc["prompt"], dc["max_new_tokens"], stops, golden["stop_ids"][1])
            gap = min(top_gap(r) for r in steps)
            check(new == dc["tokens"] and abs(gap - dc["min_logit_gap"]) < 1e-5, f"[{name}] decode {i} replays with generate (gap {gap:.4g})")
            new2, gap2 = reference_greedy(nocache_fn, dc["prompt"], dc["max_new_tokens"], stops)
            check(new2 == dc["tokens"], f"[{name}] decode {i} = greedy over full no-cache forwards (gap {gap2:.4g})")
            new3, gap3 = reference_greedy(ref_fn, dc["prompt"], dc["max_new_tokens"], stops)
            check(new3 == dc["tokens"], f"[{name}] decode {i} = greedy with the float64 numpy reference (gap {gap3:.4g})")
            stopped = dc["early_stop"] and bool(dc["tokens"]) and dc["tokens"][-1] in dc["stop_ids"]
            check(stopped == dc["stopped"] and (len(dc["tokens"]) == dc["max_new_tokens"] or stopped), f"[{name}] decode {i} stop flag {dc['stopped']}, {len(dc['tokens'])}/{dc['max_new_tokens']} tokens")
        kinds = [(dc["early_stop"], dc["stopped"], any(t in dc["stop_ids"] for t in dc["tokens"])) for dc in golden["decode_cases"]]
        check((True, True, True) in kinds and (True, False, False) in kinds and (False, False, True) in kinds,
              f"[{name}] cases cover an early stop, a run to the limit and a decode through EOS")
        gaps = [dc["min_logit_gap"] for dc in golden["decode_cases"]]
        check(min(gaps) >= MIN_GAP, f"[{name}] min_logit_gap values {['%.4g' % g for g in gaps]}")
    if failures:
        raise SystemExit(f"{failures} check(s) failed")
    print("all checks passed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-fixtures", help="write the tiny Llama / Qwen2 fixture folders and golden outputs")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_make_fixtures)
    p = sub.add_parser("self-check", help="reload the fixture folders and verify them")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_self_check)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
