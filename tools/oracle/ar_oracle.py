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

import os

import numpy as np
import torch

import oracle_common as oc
from sdar_oracle import BPE_VOCAB, MIN_GAP, PROMPT_TEXT, TINY_SHAPES, build_tokenizer

torch.set_num_threads(1)

# The SDAR fixture tokenizer's 370 BPE tokens plus these (ids 370, 371); no mask token.
AR_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>"]

# The SDAR fixtures' shapes (vocab 384, hidden 64, ...); rms_norm_eps and rope_theta are the
# family's own (ar_config).
SHAPES = TINY_SHAPES

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
    tie = cfg["tie_word_embeddings"]
    bias = (0.5, 0.5, 0.3) if cfg["model_type"] == "qwen2" else None
    return oc.hf_decoder_weights(oc.WeightDraws(seed), cfg, embed_std=0.55 if tie else 1.0, head_std=0.55, qkv_bias_std=bias,
                                 signed_final_norm=tie)


def to_tensors(w: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in w.items()}


def load_hf_model(cfg: dict, tensors: dict[str, torch.Tensor]):
    """LlamaForCausalLM / Qwen2ForCausalLM (float32, eager) holding exactly `tensors`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls_cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[cfg["model_type"]]
    kw = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "transformers_version", "torch_dtype")}
    model = oc.eager_model(cls, cls_cfg(**kw))
    sd = {k: t.to(torch.float32) for k, t in tensors.items()}
    return oc.load_exact(model, sd, cfg["tie_word_embeddings"])


@torch.inference_mode()
def align_eos_row(model, cfg: dict, w: dict[str, np.ndarray], eos_id: int, strength: float, seed: int):
    """Make <|im_end|> a token the model sometimes predicts (as sdar_oracle.align_eos_row).

    The output row of the EOS token becomes 0.5 * (its random row) + strength * u, where u is
    the unit mean of the final normed hidden states on 16 seeded random 40-token sequences.
    """
    rows = np.random.default_rng(seed).integers(0, BPE_VOCAB, size=(16, 40)).tolist()
    u = oc.final_norm_direction(model, lambda: model(input_ids=torch.tensor(rows), use_cache=False))
    key = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    oc.boost_row(w, key, eos_id, strength, u)


# --------------------------------------------------------------------------------------------
# Oracle computations (the HF forward and generate: oracle_common.hf_causal_logits, hf_greedy)
# --------------------------------------------------------------------------------------------


def reference_greedy(logits_fn, prompt, max_new_tokens, stop_ids):
    """Greedy decoding from full recomputes: token = argmax of the last position's logits."""
    seq = list(prompt)
    new, gaps = [], []
    for _ in range(max_new_tokens):
        row = logits_fn(seq)[-1]
        t = int(np.argmax(row))
        gaps.append(oc.top_gap(row))
        new.append(t)
        seq.append(t)
        if stop_ids and t in stop_ids:
            break
    return new, min(gaps)


# --------------------------------------------------------------------------------------------
# Independent float64 numpy forward (causal Llama / Qwen2), for the self-check
# --------------------------------------------------------------------------------------------


def numpy_reference_logits(cfg: dict, tensors: dict[str, torch.Tensor], ids: list[int]) -> np.ndarray:
    return oc.numpy_decoder_logits(cfg, oc.float64_weights(tensors), ids, oc.visible_blocks(len(ids), 1))


# --------------------------------------------------------------------------------------------
# Fixture generation
# --------------------------------------------------------------------------------------------


def peakedness(model, rng) -> dict:
    lg = np.stack([oc.hf_causal_logits(model, oc.random_ids(rng, BPE_VOCAB, 32)) for _ in range(4)])
    p = oc.softmax64(lg)
    return dict(logit_std=float(lg.std(-1).mean()), top1_mean=float(p.max(-1).mean()), top1_median=float(np.median(p.max(-1))))


def make_fixture(out_dir, name, family, wseed, cseed, eos_align, tok, ids, tok_sha):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    cfg = ar_config(family, ids)
    eos_id = ids["<|im_end|>"]
    stop_ids = [eos_id, ids["<|endoftext|>"]]
    pad_id = ids["<|endoftext|>"]

    weights = random_weights(cfg, wseed)
    align_eos_row(load_hf_model(cfg, to_tensors(weights)), cfg, weights, eos_id, eos_align, wseed + 1)
    tensors = to_tensors(weights)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": stop_ids, "pad_token_id": pad_id}
    oc.write_model_folder(folder, tensors, cfg, gen, tok)

    model = load_hf_model(cfg, tensors)
    rng = np.random.default_rng(cseed)
    print(f"[{name}] peakedness: {peakedness(model, rng)}")
    text_ids = tok.encode(PROMPT_TEXT).ids
    assert len(text_ids) >= 24

    def rand_tokens(n):
        return oc.random_ids(rng, BPE_VOCAB, n)

    golden_tensors = {}
    logits_cases = []
    for ci, n in enumerate(LOGITS_LENGTHS):
        seq = text_ids[:n] if ci in (1, 2) else rand_tokens(n)
        if ci == 4:
            seq[20] = eos_id  # a special token inside the context
        key = f"logits.{ci}"
        golden_tensors[key] = torch.from_numpy(np.ascontiguousarray(oc.hf_causal_logits(model, seq), dtype=np.float32))
        logits_cases.append({"key": key, "ids": seq})

    decode_cases = []
    for di, (plen, max_new, early, want) in enumerate(DECODE_SPECS):

        def attempt(i):
            prompt = text_ids[:plen] if i == 0 and di % 2 == 0 else rand_tokens(plen)
            new, steps = oc.hf_greedy(model, prompt, max_new, stop_ids if early else None, pad_id)
            gap = min(oc.top_gap(r) for r in steps)
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
                f"[{name}] decode case {di}: P={plen} n={max_new} early_stop={early} attempt={i + 1} "
                f"min_logit_gap={gap:.4g} new={len(new)} eos_at={[j for j, e in enumerate(has_eos) if e]}"
                + ("" if ok else "  -> redraw")
            )
            return ok, (prompt, new, gap, stopped)

        prompt, new, gap, stopped = oc.redraw(f"decode case {di} ({want}) for {name}", 500, attempt)
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

    golden = {
        "model_type": cfg["model_type"],
        "vocab_size": cfg["vocab_size"],
        "bos_id": cfg["bos_token_id"],
        "stop_ids": stop_ids,
        "generator": {
            "tool": "tools/oracle/ar_oracle.py make-fixtures",
            "oracle": cfg["architectures"][0] + " float32 eager; decode via generate(do_sample=False, use_cache=True)",
            **oc.versions(),
            "weight_seed": wseed,
            "case_seed": cseed,
            "eos_align": eos_align,
            "tokenizer_text_sha256": tok_sha,
        },
    }
    oc.write_golden(folder, golden_tensors, golden, logits_cases, decode_cases)
    return folder


def cmd_make_fixtures(args):
    tok, ids, sha = build_tokenizer(AR_SPECIAL_TOKENS)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, special ids {ids}")
    for name, family, wseed, cseed, eos_align in FIXTURES:
        oc.report_written(name, make_fixture(args.out, name, family, wseed, cseed, eos_align, tok, ids, sha))


# --------------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------------


def cmd_self_check(args):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    check = oc.Checker()
    for name, family, *_ in FIXTURES:
        folder = os.path.join(args.out, name)
        cfg, golden, tok = oc.read_fixture(folder)
        check(tok.get_vocab_size() <= cfg["vocab_size"], f"[{name}] tokenizer loads, size {tok.get_vocab_size()}")
        check(tok.token_to_id("<|im_end|>") == cfg["eos_token_id"] == golden["stop_ids"][0], f"[{name}] eos id")
        check(tok.token_to_id("<|endoftext|>") == cfg["bos_token_id"] == golden["stop_ids"][1], f"[{name}] bos / second stop id")
        oc.check_round_trip(check, name, tok, "x = json.dumps(obj)<|im_end|>")
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
            diff = float(np.abs(oc.hf_causal_logits(model, case["ids"]) - want).max())
            diff2 = float(np.abs(oc.hf_causal_logits(fp, case["ids"]) - want).max())
            check(diff <= 1e-5 and diff2 <= 1e-5, f"[{name}] {case['key']} recomputed (state dict / from_pretrained), max |diff| {diff:.3g} / {diff2:.3g}")
            rdiff = float(np.abs(numpy_reference_logits(cfg, tensors, case["ids"]) - want).max())
            check(rdiff <= 1e-4, f"[{name}] {case['key']} vs float64 numpy reference, max |diff| {rdiff:.3g}")
            # causal: a prefix's logits do not depend on later tokens
            n = len(case["ids"])
            if n > 2:
                pre = oc.hf_causal_logits(model, case["ids"][: n // 2])
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
            d = float(np.abs(oc.hf_causal_logits(load_hf_model(cfg, t2), case["ids"]) - want).max())
            check(d > 1e-2, f"[{name}] neutralising {key} changes logits by {d:.3g}")
        # The RoPE base matters.
        cfg2 = dict(cfg, rope_theta=10000.0)
        d = float(np.abs(oc.hf_causal_logits(load_hf_model(cfg2, tensors), case["ids"]) - want).max())
        check(d > 1e-3, f"[{name}] rope_theta 1e4 instead of {cfg['rope_theta']:g} changes logits by {d:.3g}")

        # Decode cases: replay with generate, with full recomputes, and with the numpy reference.
        ref_fn = lambda ids: numpy_reference_logits(cfg, tensors, ids).astype(np.float32)  # noqa: E731
        nocache_fn = lambda ids: oc.hf_causal_logits(model, ids)  # noqa: E731
        for i, dc in enumerate(golden["decode_cases"]):
            stops = dc["stop_ids"] if dc["early_stop"] else None
            new, steps = oc.hf_greedy(fp, dc["prompt"], dc["max_new_tokens"], stops, golden["stop_ids"][1])
            gap = min(oc.top_gap(r) for r in steps)
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
    check.finish()


def main(argv=None):
    ap, _, _ = oc.fixture_cli(__doc__, "write the tiny Llama / Qwen2 fixture folders and golden outputs", cmd_make_fixtures, cmd_self_check)
    oc.run_cli(ap, argv)


if __name__ == "__main__":
    main()
