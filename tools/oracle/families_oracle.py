#!/usr/bin/env python3
"""Families oracle: tiny random LLaDA, Dream and LLaDA2.0-MoE model folders plus golden outputs.

Each folder is stored in its real family's format (config.json field names and model_type,
safetensors tensor names) and the golden outputs come from a stock HuggingFace transformers
model holding exactly the same weights:

  llada-tiny       LLaDA-8B layout (OLMo-style config, model.transformer.* tensors);
                   oracle LlamaForCausalLM, full bidirectional attention, no logit shift.
  dream-tiny       Dream-v0 layout (Qwen2 config and tensors, q/k/v bias);
                   oracle Qwen2ForCausalLM, full bidirectional attention, logits shifted right.
  llada2-moe-tiny  LLaDA2.0-mini layout (fused query_key_value, QK-norm, partial RoPE, dense
                   layer 0 then group-limited sigmoid MoE layers); oracle Glm4MoeForCausalLM
                   after splitting the fused QKV, block-causal attention, no logit shift.

All run in float32 with eager attention, an explicit additive 4D mask [B, 1, Q, K] and explicit
position ids 0..n-1, no cache. LLaDA and Dream see the whole canvas: the sequence up to `end`
with every future block all masks.

Subcommands:
  make-fixtures --out DIR   write DIR/{llada-tiny,dream-tiny,llada2-moe-tiny}
  self-check    --out DIR   reload the folders and check them (see README.md)

The tokenizer, the draft-free decoding loop and the store/mask helpers come from
sdar_oracle.py; see tools/oracle/README.md for the conventions.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402
import sdar_oracle as so  # noqa: E402  (sets torch to one thread)

torch.set_num_threads(1)

BLOCK_SIZE = so.BLOCK_SIZE  # 8
MIN_GAP = so.MIN_GAP  # 1e-4: decode confidence / logit gaps
MIN_ROUTE_GAP = 3e-5  # MoE: every routing decision (group and expert choice) has at least this margin
BPE_VOCAB = so.BPE_VOCAB  # 370

# Set to True to also write mask_token_id / eos_token_id into the LLaDA2 config.json (the real
# LLaDA2.0-mini config has neither; the ids come from the tokenizer / generation_config).
LLADA2_IDS_IN_CONFIG = False


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------

# Each family's fields, in the order of the rows below:
#   kind       llada | dream | llada2
#   specials   special tokens, appended to the BPE vocabulary in this order
#   mask, bos  the mask and BOS tokens
#   eos        the EOS token, also the pad token
#   stops      generation_config's eos_token_id: a list, or a plain int when there is one stop
#   eos_align  the stop token whose output row align_eos_row raises, by `align`
#   wseed, cseed  weight seed, case seed
#   head_std   std of the output matrix
#   qk_gain    gain of the q/k projections (LLaDA2: of the q/k RMSNorm weights, as QK-norm makes
#              a projection gain moot)
FAMILY_FIELDS = ("kind", "specials", "mask", "bos", "eos", "stops", "eos_align", "align", "wseed", "cseed", "head_std", "qk_gain")
FAMILIES = {
    name: dict(zip(FAMILY_FIELDS, row))
    for name, *row in [
        ("llada-tiny", "llada", ["<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>"], "<|mdm_mask|>",
         "<|startoftext|>", "<|endoftext|>", ["<|endoftext|>", "<|eot_id|>"], "<|eot_id|>", 1.45, 20250701, 8101, 0.55, 3.0),
        ("dream-tiny", "dream", ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"], "<|mask|>",
         "<|beginoftext|>", "<|endoftext|>", ["<|endoftext|>", "<|im_end|>"], "<|im_end|>", 1.3, 20250702, 8102, 0.55, 3.0),
        ("llada2-moe-tiny", "llada2", ["<|startoftext|>", "<|endoftext|>", "<|mask|>"], "<|mask|>",
         "<|startoftext|>", "<|endoftext|>", ["<|endoftext|>"], "<|endoftext|>", 1.0, 20250703, 8103, 0.55, 2.0),
    ]
}

V, H, NH, NKV, D = 384, 64, 4, 2, 16
MAX_POS = 512

LLADA = dict(layers=2, mlp=128, theta=500000.0, eps=1e-5)
DREAM = dict(layers=2, mlp=128, theta=1000000.0, eps=1e-6)
LLADA2 = dict(layers=3, mlp=128, theta=600000.0, eps=1e-6, experts=16, moe_mlp=32, top_k=4,
              n_group=4, topk_group=2, shared=1, scaling=2.5, first_dense=1, partial=0.5)


def hf_fields(c: dict) -> dict:
    """The HF config fields of the LLaDA or Dream shapes (for oracle_common's weights and numpy forward)."""
    return dict(vocab_size=V, hidden_size=H, intermediate_size=c["mlp"], num_hidden_layers=c["layers"], num_attention_heads=NH,
                num_key_value_heads=NKV, head_dim=D, rms_norm_eps=c["eps"], rope_theta=c["theta"], tie_word_embeddings=False)


def family_config(name: str, ids: dict) -> dict:
    f = FAMILIES[name]
    kind = f["kind"]
    mask_id, bos, eos = ids[f["mask"]], ids[f["bos"]], ids[f["eos"]]
    if kind == "llada":
        c = LLADA
        return {
            "activation_type": "silu",
            "alibi": False,
            "alibi_bias_max": 8.0,
            "architectures": ["LLaDAModelLM"],
            "attention_dropout": 0.0,
            "attention_layer_norm": False,
            "attention_layer_norm_with_affine": True,
            "auto_map": {
                "AutoConfig": "configuration_llada.LLaDAConfig",
                "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                "AutoModel": "modeling_llada.LLaDAModelLM",
            },
            "bias_for_layer_norm": False,
            "block_group_size": 1,
            "block_type": "llama",
            "d_model": H,
            "embedding_dropout": 0.0,
            "embedding_size": V,
            "eos_token_id": eos,
            "flash_attention": False,
            "include_bias": False,
            "include_qkv_bias": False,
            "init_cutoff_factor": None,
            "init_device": "meta",
            "init_fn": "mitchell",
            "init_std": 0.02,
            "input_emb_norm": False,
            "layer_norm_type": "rms",
            "layer_norm_with_affine": True,
            "mask_token_id": mask_id,
            "max_sequence_length": MAX_POS,
            "mlp_hidden_size": c["mlp"],
            "mlp_ratio": 4,
            "model_type": "llada",
            "multi_query_attention": None,
            "n_heads": NH,
            "n_kv_heads": NKV,
            "n_layers": c["layers"],
            "pad_token_id": eos,
            "precision": "amp_bf16",
            "residual_dropout": 0.0,
            "rms_norm_eps": c["eps"],
            "rope": True,
            "rope_full_precision": True,
            "rope_theta": c["theta"],
            "scale_logits": False,
            "transformers_version": "4.46.3",
            "use_cache": False,
            "vocab_size": V,
            "weight_tying": False,
        }
    if kind == "dream":
        c = DREAM
        return {
            "architectures": ["DreamModel"],
            "attention_dropout": 0.0,
            "auto_map": {
                "AutoConfig": "configuration_dream.DreamConfig",
                "AutoModel": "modeling_dream.DreamModel",
            },
            "bos_token_id": bos,
            "eos_token_id": eos,
            "hidden_act": "silu",
            "hidden_size": H,
            "initializer_range": 0.02,
            "intermediate_size": c["mlp"],
            "mask_token_id": mask_id,
            "max_position_embeddings": MAX_POS,
            "max_window_layers": c["layers"],
            "model_type": "Dream",
            "num_attention_heads": NH,
            "num_hidden_layers": c["layers"],
            "num_key_value_heads": NKV,
            "pad_token_id": eos,
            "rms_norm_eps": c["eps"],
            "rope_scaling": None,
            "rope_theta": c["theta"],
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.46.2",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": V,
        }
    c = LLADA2
    cfg = {
        "architectures": ["LLaDA2MoeModelLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "dtype": "float32",
        "embedding_dropout": 0.0,
        "first_k_dense_replace": c["first_dense"],
        "head_dim": D,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": c["mlp"],
        "max_position_embeddings": MAX_POS,
        "max_window_layers": c["layers"],
        "model_type": "llada2_moe",
        "moe_intermediate_size": c["moe_mlp"],
        "moe_router_enable_expert_bias": True,
        "n_group": c["n_group"],
        "norm_head": False,
        "norm_topk_prob": True,
        "num_attention_heads": NH,
        "num_experts": c["experts"],
        "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": c["layers"],
        "num_key_value_heads": NKV,
        "num_shared_experts": c["shared"],
        "output_dropout": 0.0,
        "output_router_logits": False,
        "pad_token_id": eos,
        "partial_rotary_factor": c["partial"],
        "rms_norm_eps": c["eps"],
        "rope_scaling": None,
        "rope_theta": c["theta"],
        "rotary_dim": int(D * c["partial"]),
        "routed_scaling_factor": c["scaling"],
        "router_dtype": "fp32",
        "score_function": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": c["topk_group"],
        "transformers_version": "4.52.3",
        "use_bias": False,
        "use_cache": False,
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_rmsnorm": True,
        "vocab_size": V,
    }
    if LLADA2_IDS_IN_CONFIG:
        cfg["mask_token_id"] = mask_id
        cfg["eos_token_id"] = eos
    return cfg


def generation_config(name: str, ids: dict) -> dict:
    f = FAMILIES[name]
    stops = [ids[t] for t in f["stops"]]
    g = {"bos_token_id": ids[f["bos"]], "pad_token_id": ids[f["eos"]]}
    g["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    return g


def stop_ids(name: str, ids: dict) -> list[int]:
    return [ids[t] for t in FAMILIES[name]["stops"]]


# --------------------------------------------------------------------------------------------
# Weights (family names) and the mapping to the HF oracle classes
# --------------------------------------------------------------------------------------------


def random_weights(kind: str, seed: int, head_std: float, qk_gain: float = 1.0) -> dict[str, np.ndarray]:
    """Random float32 weights under the family's real tensor names (peaked, see README).

    Projections have std 1/sqrt(fan_in), except q and k: qk_gain/sqrt(fan_in) (LLaDA, Dream), or
    the q/k RMSNorm weights are qk_gain * (1 + 0.1 N(0,1)) (LLaDA2): sharp, position-dependent
    attention, without which a canvas of masks gives every masked position the same prediction.
    """
    draw = oc.WeightDraws(seed)
    normal, norm, lin = draw.normal, draw.norm, draw.lin
    if kind == "dream":  # the Qwen2 layout under its HF names, each q/k/v bias right after its weight
        return oc.hf_decoder_weights(draw, hf_fields(DREAM), embed_std=1.0, head_std=head_std, qk_gain=qk_gain,
                                     qkv_bias_std=(0.5, 0.5, 0.5), bias_after_each=True)
    w: dict[str, np.ndarray] = {}
    if kind == "llada":
        c = LLADA
        w["model.transformer.wte.weight"] = normal((V, H), 1.0)
        for layer in range(c["layers"]):
            p = f"model.transformer.blocks.{layer}."
            w[p + "attn_norm.weight"] = norm(H)
            w[p + "q_proj.weight"] = lin(NH * D, H, qk_gain)
            w[p + "k_proj.weight"] = lin(NKV * D, H, qk_gain)
            w[p + "v_proj.weight"] = lin(NKV * D, H)
            w[p + "attn_out.weight"] = lin(H, NH * D)
            w[p + "ff_norm.weight"] = norm(H)
            w[p + "ff_proj.weight"] = lin(c["mlp"], H)
            w[p + "up_proj.weight"] = lin(c["mlp"], H)
            w[p + "ff_out.weight"] = lin(H, c["mlp"])
        w["model.transformer.ln_f.weight"] = norm(H)
        w["model.transformer.ff_out.weight"] = normal((V, H), head_std)
    else:
        c = LLADA2
        w["model.word_embeddings.weight"] = normal((V, H), 1.0)
        for layer in range(c["layers"]):
            p = f"model.layers.{layer}."
            w[p + "input_layernorm.weight"] = norm(H)
            w[p + "attention.query_key_value.weight"] = lin((NH + 2 * NKV) * D, H)
            w[p + "attention.query_layernorm.weight"] = qk_gain * norm(D)
            w[p + "attention.key_layernorm.weight"] = qk_gain * norm(D)
            w[p + "attention.dense.weight"] = lin(H, NH * D)
            w[p + "post_attention_layernorm.weight"] = norm(H)
            if layer < c["first_dense"]:
                w[p + "mlp.gate_proj.weight"] = lin(c["mlp"], H)
                w[p + "mlp.up_proj.weight"] = lin(c["mlp"], H)
                w[p + "mlp.down_proj.weight"] = lin(H, c["mlp"])
                continue
            w[p + "mlp.gate.weight"] = lin(c["experts"], H)
            w[p + "mlp.gate.expert_bias"] = draw.rng.uniform(0.0, 0.05, c["experts"]).astype(np.float32)
            for e in range(c["experts"]):
                q = p + f"mlp.experts.{e}."
                w[q + "gate_proj.weight"] = lin(c["moe_mlp"], H)
                w[q + "up_proj.weight"] = lin(c["moe_mlp"], H)
                w[q + "down_proj.weight"] = lin(H, c["moe_mlp"])
            sw = c["moe_mlp"] * c["shared"]
            w[p + "mlp.shared_experts.gate_proj.weight"] = lin(sw, H)
            w[p + "mlp.shared_experts.up_proj.weight"] = lin(sw, H)
            w[p + "mlp.shared_experts.down_proj.weight"] = lin(H, sw)
        w["model.norm.weight"] = norm(H)
        w["lm_head.weight"] = normal((V, H), head_std)
    return w


def head_name(kind: str) -> str:
    return "model.transformer.ff_out.weight" if kind == "llada" else "lm_head.weight"


LLADA_RENAMES = [  # family suffix -> Llama suffix, inside a block
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ff_norm.weight", "post_attention_layernorm.weight"),
    ("q_proj.weight", "self_attn.q_proj.weight"),
    ("k_proj.weight", "self_attn.k_proj.weight"),
    ("v_proj.weight", "self_attn.v_proj.weight"),
    ("attn_out.weight", "self_attn.o_proj.weight"),
    ("ff_proj.weight", "mlp.gate_proj.weight"),
    ("up_proj.weight", "mlp.up_proj.weight"),
    ("ff_out.weight", "mlp.down_proj.weight"),
]


def to_hf_state(kind: str, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Family tensors (any dtype) -> float32 state dict of the HF oracle class."""
    t = {k: v.to(torch.float32) for k, v in t.items()}
    if kind == "dream":
        return dict(t)
    out: dict[str, torch.Tensor] = {}
    if kind == "llada":
        for k, v in t.items():
            if k == "model.transformer.wte.weight":
                out["model.embed_tokens.weight"] = v
            elif k == "model.transformer.ln_f.weight":
                out["model.norm.weight"] = v
            elif k == "model.transformer.ff_out.weight":
                out["lm_head.weight"] = v
            else:
                pre = "model.transformer.blocks."
                assert k.startswith(pre), k
                layer, suffix = k[len(pre) :].split(".", 1)
                new = dict(LLADA_RENAMES)[suffix]
                out[f"model.layers.{layer}.{new}"] = v
        return out
    for k, v in t.items():
        if k == "model.word_embeddings.weight":
            out["model.embed_tokens.weight"] = v
        elif k.endswith("attention.query_key_value.weight"):
            p = k[: -len("attention.query_key_value.weight")]
            q, kk, vv = torch.split(v, [NH * D, NKV * D, NKV * D], dim=0)
            out[p + "self_attn.q_proj.weight"] = q.contiguous()
            out[p + "self_attn.k_proj.weight"] = kk.contiguous()
            out[p + "self_attn.v_proj.weight"] = vv.contiguous()
        elif k.endswith("attention.dense.weight"):
            out[k.replace("attention.dense.", "self_attn.o_proj.")] = v
        elif k.endswith("attention.query_layernorm.weight"):
            out[k.replace("attention.query_layernorm.", "self_attn.q_norm.")] = v
        elif k.endswith("attention.key_layernorm.weight"):
            out[k.replace("attention.key_layernorm.", "self_attn.k_norm.")] = v
        elif k.endswith("mlp.gate.expert_bias"):
            out[k.replace("mlp.gate.expert_bias", "mlp.gate.e_score_correction_bias")] = v
        else:
            out[k] = v
    return out


def load_hf_model(kind: str, tensors: dict[str, torch.Tensor]):
    """The HF oracle model (float32, eager) holding exactly `tensors` (family names)."""
    if kind == "llada":
        from transformers import LlamaConfig, LlamaForCausalLM

        c = LLADA
        hcfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=c["mlp"], num_hidden_layers=c["layers"],
                           num_attention_heads=NH, num_key_value_heads=NKV, head_dim=D, hidden_act="silu",
                           max_position_embeddings=MAX_POS, rms_norm_eps=c["eps"], rope_theta=c["theta"],
                           rope_scaling=None, attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                           use_cache=False)
        cls = LlamaForCausalLM
    elif kind == "dream":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        c = DREAM
        hcfg = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=c["mlp"], num_hidden_layers=c["layers"],
                           num_attention_heads=NH, num_key_value_heads=NKV, hidden_act="silu",
                           max_position_embeddings=MAX_POS, rms_norm_eps=c["eps"], rope_theta=c["theta"],
                           rope_scaling=None, use_sliding_window=False, tie_word_embeddings=False, use_cache=False)
        cls = Qwen2ForCausalLM
    else:
        from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

        c = LLADA2
        hcfg = Glm4MoeConfig(vocab_size=V, hidden_size=H, intermediate_size=c["mlp"], num_hidden_layers=c["layers"],
                             num_attention_heads=NH, num_key_value_heads=NKV, head_dim=D,
                             partial_rotary_factor=c["partial"], hidden_act="silu", max_position_embeddings=MAX_POS,
                             rms_norm_eps=c["eps"], rope_theta=c["theta"], rope_scaling=None, attention_bias=False,
                             moe_intermediate_size=c["moe_mlp"], num_experts_per_tok=c["top_k"],
                             n_shared_experts=c["shared"], n_routed_experts=c["experts"],
                             routed_scaling_factor=c["scaling"], n_group=c["n_group"], topk_group=c["topk_group"],
                             first_k_dense_replace=c["first_dense"], norm_topk_prob=True, use_qk_norm=True,
                             tie_word_embeddings=False, use_cache=False)
        cls = Glm4MoeForCausalLM
    model = oc.eager_model(cls, hcfg)
    sd = to_hf_state(kind, tensors)
    model.load_state_dict(sd, strict=True)
    full = dict(model.state_dict())
    assert set(full) == set(sd), set(full) ^ set(sd)
    for k, v in sd.items():
        assert torch.equal(full[k], v), k
    if kind == "llada2":
        assert model.model.rotary_emb.inv_freq.numel() == int(D * LLADA2["partial"]) // 2
    return model


# --------------------------------------------------------------------------------------------
# Forwards (HF oracle)
# --------------------------------------------------------------------------------------------


def default_mask(kind: str, n: int, b: int) -> torch.Tensor:
    if kind == "llada2":
        return so.block_causal_mask(n, BLOCK_SIZE, b)
    return torch.zeros(b, 1, n, n, dtype=torch.float32)


def shift(kind: str, lg: np.ndarray) -> np.ndarray:
    """Dream: the logits for position p are the output row p - 1 (row 0 for p = 0)."""
    if kind != "dream":
        return lg
    return np.concatenate([lg[:, :1], lg[:, :-1]], axis=1)


@torch.inference_mode()
def hf_logits(kind: str, model, rows: list[list[int]], mask: torch.Tensor | None = None) -> np.ndarray:
    """float32 per-position logits [B, n, V] (Dream: after the shift) of equal-length rows."""
    if mask is None:
        mask = default_mask(kind, len(rows[0]), len(rows))
    return shift(kind, oc.hf_forward(model, rows, mask))


def canvas_rows(kind: str, prefix: list[int], states: list[list[int]], end: int | None, mask_id: int):
    """The rows a block forward runs: LLaDA/Dream pad with masks up to `end`, LLaDA2 does not."""
    if kind == "llada2":
        return [prefix + s for s in states]
    assert end is not None and end >= len(prefix) + BLOCK_SIZE and end % BLOCK_SIZE == 0
    return [prefix + s + [mask_id] * (end - len(prefix) - len(s)) for s in states]


def block_logits(kind, forward, prefix, states, end, mask_id) -> np.ndarray:
    """[B, L, V] logits of the block positions; `forward(rows) -> [B, n, V]`."""
    rows = canvas_rows(kind, prefix, states, end, mask_id)
    return forward(rows)[:, len(prefix) : len(prefix) + BLOCK_SIZE]


def decode_logits_fn(kind, forward, end, mask_id):
    """sdar_oracle.draft_free_decode's logits_fn: ids = done + state -> [len(ids), V]."""

    def fn(ids):
        n = len(ids)
        row = list(ids) if kind == "llada2" else list(ids) + [mask_id] * (end - n)
        return forward([row])[0][:n]

    return fn


def decode(kind, forward, prompt, max_new, early, stops, mask_id):
    P = len(prompt)
    end = -(-(P + max_new) // BLOCK_SIZE) * BLOCK_SIZE
    r = so.draft_free_decode(None, prompt, max_new, early, stops, mask_id, block=BLOCK_SIZE,
                             logits_fn=decode_logits_fn(kind, forward, end, mask_id))
    r["end"] = end
    return r


# --------------------------------------------------------------------------------------------
# MoE routing monitor (margins of every routing decision the HF oracle makes)
# --------------------------------------------------------------------------------------------


def route_decisions(x: np.ndarray, wg: np.ndarray, bias: np.ndarray):
    """Group-limited routing of tokens x [T, H] in float64.

    Returns (selected [T, k] expert ids sorted, plain top-k [T, k] sorted, margin [T]) where the
    margin is the smaller of (the topk_group-th minus the next group score) and (the k-th minus
    the (k+1)-th biased expert score inside the kept groups): how far every discrete decision
    is from a tie.
    """
    c = LLADA2
    E, G, TG, K = c["experts"], c["n_group"], c["topk_group"], c["top_k"]
    logits = x.astype(np.float64) @ wg.astype(np.float64).T
    s = 1.0 / (1.0 + np.exp(-logits))
    sc = s + bias.astype(np.float64)[None]
    T = sc.shape[0]
    grouped = sc.reshape(T, G, E // G)
    gscore = np.sort(grouped, axis=-1)[..., -2:].sum(-1)  # [T, G]: sum of each group's top 2
    gorder = np.argsort(-gscore, axis=-1, kind="stable")
    gsorted = np.take_along_axis(gscore, gorder, -1)
    margin_g = gsorted[:, TG - 1] - gsorted[:, TG]
    keep = np.zeros((T, G), dtype=bool)
    np.put_along_axis(keep, gorder[:, :TG], True, -1)
    masked = np.where(np.repeat(keep, E // G, axis=1), sc, -np.inf)
    eorder = np.argsort(-masked, axis=-1, kind="stable")
    esorted = np.take_along_axis(masked, eorder, -1)
    margin_e = esorted[:, K - 1] - esorted[:, K]
    sel = np.sort(eorder[:, :K], axis=-1)
    plain = np.sort(np.argsort(-sc, axis=-1, kind="stable")[:, :K], axis=-1)
    return sel, plain, s, np.minimum(margin_g, margin_e)


class RouteMonitor:
    """Captures the router inputs of every MoE layer of a Glm4MoeForCausalLM."""

    def __init__(self, model):
        self.layers = []
        self.seen: list[tuple[int, np.ndarray]] = []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not hasattr(gate, "e_score_correction_bias"):
                continue
            wg = gate.weight.detach().numpy().copy()
            bias = gate.e_score_correction_bias.detach().numpy().copy()
            self.layers.append((i, wg, bias))
            gate.register_forward_hook(self._hook(len(self.layers) - 1))

    def _hook(self, j):
        def fn(mod, inp, out):
            self.seen.append((j, inp[0].detach().reshape(-1, inp[0].shape[-1]).numpy().copy()))

        return fn

    def take(self):
        """Min margin, experts used per layer, and the routed tokens (one per token per MoE layer
        per forward) whose choice the group limit / the expert bias changed."""
        margin = math.inf
        used = [set() for _ in self.layers]
        changed = bias_changed = tokens = 0
        for j, x in self.seen:
            _, wg, bias = self.layers[j]
            sel, plain, _, m = route_decisions(x, wg, bias)
            unbiased = route_decisions(x, wg, np.zeros_like(bias))[0]
            margin = min(margin, float(m.min()))
            used[j].update(int(e) for e in sel.ravel())
            changed += int((sel != plain).any(-1).sum())
            bias_changed += int((sel != unbiased).any(-1).sum())
            tokens += x.shape[0]
        self.seen = []
        return dict(min_route_gap=margin, experts_used=[sorted(u) for u in used], group_changed=changed,
                    bias_changed=bias_changed, routed_tokens=tokens)


# --------------------------------------------------------------------------------------------
# Independent float64 numpy reference of the three families (for the self-check)
# --------------------------------------------------------------------------------------------


def numpy_reference_logits(kind: str, tensors: dict[str, torch.Tensor], ids: list[int], stats=None) -> np.ndarray:
    """[n, V] float64 logits straight from the family tensors (Dream: after the shift)."""
    w = oc.float64_weights(tensors)
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    visible = oc.visible_blocks(n, BLOCK_SIZE) if kind == "llada2" else np.ones((n, n), dtype=bool)

    if kind == "dream":  # the Qwen2 layout under its HF names
        lg = oc.numpy_decoder_logits(hf_fields(DREAM), w, ids, visible)
        return np.concatenate([lg[:1], lg[:-1]], axis=0)

    c = LLADA if kind == "llada" else LLADA2
    eps, theta = c["eps"], c["theta"]
    rd = D if kind == "llada" else int(D * LLADA2["partial"])

    def rms(x, g):
        return oc.rms_norm(x, g, eps)

    def rope(x):  # x [n, heads, D]: NeoX rotate-half on the first rd dims, the rest passes
        return oc.rope_rotate_half(x, pos, theta, rd)

    swiglu = oc.swiglu

    def attend(q, k, v):
        return oc.gqa_attention(q, k, v, visible)

    if kind == "llada":
        x = w["model.transformer.wte.weight"][ids]
        for layer in range(c["layers"]):
            p = f"model.transformer.blocks.{layer}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "q_proj.weight"].T).reshape(n, NH, D))
            k = rope((h @ w[p + "k_proj.weight"].T).reshape(n, NKV, D))
            v = (h @ w[p + "v_proj.weight"].T).reshape(n, NKV, D)
            x = x + attend(q, k, v) @ w[p + "attn_out.weight"].T
            h = rms(x, w[p + "ff_norm.weight"])
            x = x + swiglu(h, w[p + "ff_proj.weight"], w[p + "up_proj.weight"], w[p + "ff_out.weight"])
        return rms(x, w["model.transformer.ln_f.weight"]) @ w["model.transformer.ff_out.weight"].T

    x = w["model.word_embeddings.weight"][ids]
    for layer in range(c["layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        qkv = h @ w[p + "attention.query_key_value.weight"].T
        q = qkv[:, : NH * D].reshape(n, NH, D)
        k = qkv[:, NH * D : (NH + NKV) * D].reshape(n, NKV, D)
        v = qkv[:, (NH + NKV) * D :].reshape(n, NKV, D)
        q = rope(rms(q, w[p + "attention.query_layernorm.weight"]))
        k = rope(rms(k, w[p + "attention.key_layernorm.weight"]))
        x = x + attend(q, k, v) @ w[p + "attention.dense.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        if layer < c["first_dense"]:
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
            continue
        sel, _, s, margin = route_decisions(h, w[m + "gate.weight"], w[m + "gate.expert_bias"])
        if stats is not None:
            stats["min_route_gap"] = min(stats.get("min_route_gap", math.inf), float(margin.min()))
        out = swiglu(h, w[m + "shared_experts.gate_proj.weight"], w[m + "shared_experts.up_proj.weight"],
                     w[m + "shared_experts.down_proj.weight"])
        for t in range(n):
            ws = s[t, sel[t]]
            ws = ws / (ws.sum() + 1e-20) * c["scaling"]
            for e, we in zip(sel[t], ws):
                q_ = m + f"experts.{e}."
                out[t] += we * swiglu(h[t : t + 1], w[q_ + "gate_proj.weight"], w[q_ + "up_proj.weight"],
                                      w[q_ + "down_proj.weight"])[0]
        x = x + out
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


# --------------------------------------------------------------------------------------------
# Fixture generation
# --------------------------------------------------------------------------------------------


@torch.inference_mode()
def align_eos_row(kind, w, eos_id, mask_id, strength, seed):
    """Make a stop token one the model sometimes predicts (like sdar_oracle.align_eos_row).

    u = the unit mean final normed hidden state on 16 seeded random contexts (40 tokens, last
    block 70% masks; LLaDA/Dream: canvas to 56). Every output row loses its component along u
    (the common direction would otherwise make a few tokens win everywhere and decodes repeat
    themselves), then the stop token's row becomes 0.5 * (its row) + strength * u.
    """
    model = load_hf_model(kind, so.store_tensors(w, "float32"))
    rows = oc.masked_rows(np.random.default_rng(seed), BPE_VOCAB, 16, 40, 0.7, mask_id, pad=16 if kind != "llada2" else 0)
    u = oc.final_norm_direction(model, lambda: hf_logits(kind, model, rows), slice(32, 40))
    key = head_name(kind)
    head = w[key].astype(np.float64)
    head -= np.outer(head @ u, u)
    head[eos_id] = 0.5 * head[eos_id] + strength * u
    w[key] = head.astype(np.float32)


def peakedness(kind, forward, rng, mask_id) -> dict:
    st = so.summarize_peakedness(forward, rng, mask_id, pad=16 if kind != "llada2" else 0)
    return {k: round(st[k], 3) for k in ("logit_std", "top1_mean", "top1_median")}


def make_fixture(out_dir: str, name: str, tok_sha: str):
    f = FAMILIES[name]
    kind = f["kind"]
    tok, ids, sha = so.build_tokenizer(f["specials"])
    assert sha == tok_sha
    mask_id = ids[f["mask"]]
    stops = stop_ids(name, ids)
    assert mask_id < V and tok.get_vocab_size() <= V
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    cfg = family_config(name, ids)

    weights = random_weights(kind, f["wseed"], f["head_std"], f["qk_gain"])
    align_eos_row(kind, weights, ids[f["eos_align"]], mask_id, f["align"], f["wseed"] + 1)
    tensors = so.store_tensors(weights, "float32")
    oc.write_model_folder(folder, tensors, cfg, generation_config(name, ids), tok)

    model = load_hf_model(kind, tensors)
    monitor = RouteMonitor(model) if kind == "llada2" else None

    def forward(rows):
        return hf_logits(kind, model, rows)

    rng = np.random.default_rng(f["cseed"])
    print(f"[{name}] peakedness: {peakedness(kind, forward, rng, mask_id)}")
    if monitor:
        monitor.take()

    def rand_tokens(k):
        return oc.random_ids(rng, BPE_VOCAB, k)

    M = mask_id
    text_ids = tok.encode(so.PROMPT_TEXT).ids
    assert len(text_ids) >= 40 and M not in text_ids

    # ---- logits cases: (prefix, states, end); end is the canvas end (LLaDA / Dream only)
    def logits_spec(ci, attempt):
        off = 0 if attempt == 0 else int(rng.integers(0, len(text_ids) - 24))
        specs = [
            lambda: ([], [[M] * 8, rand_tokens(3) + [M] * 5, [M, 17, M, M, 250, M, M, 9]], 24),
            lambda: (text_ids[off : off + 24], [[M] * 8, rand_tokens(2) + [M] * 6, [M] * 5 + rand_tokens(3),
                                                [M, 101, M, 33, M, 7, M, 300]], 48),
            lambda: (rand_tokens(8), [rand_tokens(4) + [M] * 4], 32),
            lambda: (rand_tokens(16), [rand_tokens(8), [M] * 8], 40),
        ]
        return specs[ci]()

    golden_tensors = {}
    logits_cases = []
    routing = dict(min_route_gap=math.inf, group_changed=0, bias_changed=0, routed_tokens=0, experts_used=None)

    def note_routing(st):
        routing["min_route_gap"] = min(routing["min_route_gap"], st["min_route_gap"])
        routing["group_changed"] += st["group_changed"]
        routing["bias_changed"] += st["bias_changed"]
        routing["routed_tokens"] += st["routed_tokens"]
        if routing["experts_used"] is None:
            routing["experts_used"] = [set() for _ in st["experts_used"]]
        for u, e in zip(routing["experts_used"], st["experts_used"]):
            u.update(e)

    for ci in range(4):
        for attempt in range(200):
            prefix, states, end = logits_spec(ci, attempt)
            lg = block_logits(kind, forward, prefix, states, end, M)
            st = monitor.take() if monitor else None
            if st is None or st["min_route_gap"] >= MIN_ROUTE_GAP:
                break
            print(f"[{name}] logits case {ci}: route gap {st['min_route_gap']:.3g} -> redraw")
        else:
            raise SystemExit(f"could not draw logits case {ci} for {name}")
        key = f"logits.{ci}"
        golden_tensors[key] = torch.from_numpy(np.ascontiguousarray(lg, dtype=np.float32))
        case = {"key": key, "prefix": prefix, "states": states}
        if kind != "llada2":
            case["end"] = end
        else:
            case["min_route_gap"] = st["min_route_gap"]
            note_routing(st)
        logits_cases.append(case)

    # ---- decode cases
    decode_cases = []
    for di, (plen, max_new, early, need_stop) in enumerate(so.DECODE_SPECS):

        def attempt(i):
            prompt = so.spec_prompt(di, i, plen, text_ids, rand_tokens)
            r = decode(kind, forward, prompt, max_new, early, stops, mask_id)
            st = monitor.take() if monitor else None
            # with need_stop, the stop ends decoding after at least two blocks, before the last
            # planned one, and cuts the output
            ok = (r["min_conf_gap"] >= MIN_GAP and (st is None or st["min_route_gap"] >= MIN_ROUTE_GAP)
                  and (not need_stop or so.cuts_early(r, 2)))
            print(f"[{name}] decode case {di}: P={plen} n={max_new} early_stop={early} attempt={i + 1} "
                  f"min_conf_gap={r['min_conf_gap']:.6g}"
                  + (f" route_gap={st['min_route_gap']:.3g}" if st else "")
                  + f" stopped={r['stopped']} forwards={r['block_forwards']}" + ("" if ok else "  -> redraw"))
            return ok, (prompt, r, st)

        prompt, r, st = oc.redraw(f"decode case {di} for {name}", 400, attempt)
        case = so.decode_record(prompt, max_new, early, stops, r, end=r["end"])
        if st:
            case["min_route_gap"] = st["min_route_gap"]
            note_routing(st)
        decode_cases.append(case)

    conventions = {
        "llada": dict(hf_class="LlamaForCausalLM", attention="bidirectional", canvas="full: future blocks all masks up to end",
                      logit_shift=False),
        "dream": dict(hf_class="Qwen2ForCausalLM", attention="bidirectional", canvas="full: future blocks all masks up to end",
                      logit_shift=True),
        "llada2": dict(hf_class="Glm4MoeForCausalLM (fused query_key_value split, renamed)", attention="block_causal",
                       canvas="prefix + block only", logit_shift=False),
    }[kind]
    generator = {
        "tool": "tools/oracle/families_oracle.py make-fixtures",
        "family": kind,
        **conventions,
        **oc.versions(),
        "weight_seed": f["wseed"],
        "case_seed": f["cseed"],
        "eos_align": [f["eos_align"], f["align"]],
        "weights_dtype": "float32",
        "tokenizer_text_sha256": sha,
        "special_tokens": {t: ids[t] for t in f["specials"]},
    }
    if kind == "llada2":
        used = [sorted(u) for u in routing["experts_used"]]
        generator["routing"] = {
            "min_route_gap": routing["min_route_gap"],
            "min_route_gap_required": MIN_ROUTE_GAP,
            "routed_tokens": routing["routed_tokens"],
            "tokens_where_group_limit_changed_the_choice": routing["group_changed"],
            "tokens_where_expert_bias_changed_the_choice": routing["bias_changed"],
            "experts_used_per_moe_layer": [len(u) for u in used],
        }
        print(f"[{name}] routing: {generator['routing']}")
        assert routing["group_changed"] > 0 and routing["bias_changed"] > 0 and all(len(u) >= LLADA2["experts"] // 2 for u in used)
    golden = {
        "block_size": BLOCK_SIZE,
        "mask_id": mask_id,
        "vocab_size": V,
        "generator": generator,
    }
    oc.write_golden(folder, golden_tensors, golden, logits_cases, decode_cases)
    return folder


def cmd_make_fixtures(args):
    _, _, sha = so.build_tokenizer()
    for name in FAMILIES:
        oc.report_written(name, make_fixture(args.out, name, sha))


# --------------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------------


def expected_names(kind: str) -> set[str]:
    return set(random_weights(kind, 0, 1.0))


def cmd_self_check(args):
    from safetensors.torch import load_file

    check = oc.Checker()
    summary = {}
    for name, f in FAMILIES.items():
        kind = f["kind"]
        folder = os.path.join(args.out, name)
        cfg, golden, tok = oc.read_fixture(folder)
        gen = oc.load_json(os.path.join(folder, "generation_config.json"))
        M = golden["mask_id"]
        check(tok.token_to_id(f["mask"]) == M and M < cfg["vocab_size"] == golden["vocab_size"],
              f"[{name}] mask {f['mask']} = {M} < vocab {cfg['vocab_size']}")
        if "mask_token_id" in cfg:
            check(cfg["mask_token_id"] == M, f"[{name}] config mask_token_id")
        eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
        check(eos == [tok.token_to_id(t) for t in f["stops"]], f"[{name}] generation_config eos_token_id {gen['eos_token_id']}")
        check(all(dc["stop_ids"] == eos for dc in golden["decode_cases"]), f"[{name}] decode stop ids = generation_config")
        oc.check_round_trip(check, name, tok, "x = json.dumps(obj)" + f["stops"][-1])

        tensors = load_file(os.path.join(folder, "model.safetensors"))
        check(set(tensors) == expected_names(kind), f"[{name}] tensor names are the family's ({len(tensors)})")
        check(all(t.dtype == torch.float32 for t in tensors.values()), f"[{name}] all tensors float32")
        print(f"     [{name}] parameters stored: {sum(t.numel() for t in tensors.values())}")
        model = load_hf_model(kind, tensors)

        def forward(rows, mask=None):
            return hf_logits(kind, model, rows, mask)

        gl = load_file(os.path.join(folder, "golden.safetensors"))
        worst_hf, worst_ref = 0.0, 0.0
        for case in golden["logits_cases"]:
            end = case.get("end")
            lg = block_logits(kind, forward, case["prefix"], case["states"], end, M)
            diff = float(np.abs(lg - gl[case["key"]].numpy()).max())
            worst_hf = max(worst_hf, diff)
            check(diff <= 1e-5, f"[{name}] {case['key']} recomputed, max |diff| {diff:.3g}")
            rows = canvas_rows(kind, case["prefix"], case["states"], end, M)
            stats = {}
            ref = np.stack([numpy_reference_logits(kind, tensors, r, stats) for r in rows])
            ref = ref[:, len(case["prefix"]) : len(case["prefix"]) + BLOCK_SIZE]
            rdiff = float(np.abs(ref - gl[case["key"]].numpy()).max())
            worst_ref = max(worst_ref, rdiff)
            check(rdiff <= 1e-4, f"[{name}] {case['key']} vs float64 numpy reference, max |diff| {rdiff:.3g}"
                  + (f" (route gap {stats['min_route_gap']:.3g})" if stats else ""))

        # The attention mask and the canvas really matter.
        case = golden["logits_cases"][1]
        rows = canvas_rows(kind, case["prefix"], case["states"], case.get("end"), M)
        n, b = len(rows[0]), len(rows)
        base = forward(rows)
        ca = forward(rows, so.causal_mask(n, b))
        check(float(np.abs(base - ca).max()) > 1e-2, f"[{name}] a causal mask changes logits by {float(np.abs(base - ca).max()):.3g}")
        if kind == "llada2":
            oc.check_block_causal(check, name, forward, rows, base, BLOCK_SIZE)
        else:
            bc = forward(rows, so.block_causal_mask(n, BLOCK_SIZE, b))
            check(float(np.abs(base - bc).max()) > 1e-2, f"[{name}] a block-causal mask changes logits by {float(np.abs(base - bc).max()):.3g}")
            # Without the future masks (canvas ending with the block) the block logits change.
            p0 = len(case["prefix"])
            short = forward(canvas_rows(kind, case["prefix"], case["states"], p0 + BLOCK_SIZE, M))
            d = float(np.abs(short[:, p0:] - base[:, p0 : p0 + BLOCK_SIZE]).max())
            check(d > 1e-3, f"[{name}] the future masks change the block logits by {d:.3g}")
        if kind == "dream":
            raw = hf_logits("llada", model, rows)  # same zero mask, no shift: the raw Qwen2 rows
            check(np.array_equal(base[:, 1:], raw[:, :-1]) and np.array_equal(base[:, 0], raw[:, 0]), f"[{name}] logits shifted right by one")

        # Decode cases replay with the HF model and with the numpy reference.
        monitor = RouteMonitor(model) if kind == "llada2" else None

        def replay(fwd):
            return lambda dc: decode(kind, fwd, dc["prompt"], dc["max_new_tokens"], dc["early_stop"], dc["stop_ids"], M)

        so.check_decodes(check, name, golden["decode_cases"], replay(forward), so.REPLAY_KEYS + ("stopped", "end"), "reproduces")
        ref_fwd = lambda rs: np.stack([numpy_reference_logits(kind, tensors, r) for r in rs]).astype(np.float32)  # noqa: E731
        so.check_decodes(check, name, golden["decode_cases"], replay(ref_fwd), so.REPLAY_KEYS, "reproduced by the numpy reference")
        gaps = [dc["min_conf_gap"] for dc in golden["decode_cases"]]
        check(min(gaps) >= MIN_GAP, f"[{name}] min_conf_gap values {['%.3g' % g for g in gaps]}")
        check(all(dc["end"] == -(-(len(dc["prompt"]) + dc["max_new_tokens"]) // BLOCK_SIZE) * BLOCK_SIZE for dc in golden["decode_cases"]),
              f"[{name}] decode end = ceil((P + n) / L) * L")
        check(any(dc["stopped"] and len(dc["tokens"]) < len(dc["generated"]) for dc in golden["decode_cases"]), f"[{name}] an early stop cuts a decode")
        if monitor:
            # Routing in every recorded case is far from ties, diverse, and group-limited.
            monitor.take()  # drop what the replays above recorded; count each recorded case once
            for case in golden["logits_cases"]:
                block_logits(kind, forward, case["prefix"], case["states"], None, M)
            for dc in golden["decode_cases"]:
                decode(kind, forward, dc["prompt"], dc["max_new_tokens"], dc["early_stop"], dc["stop_ids"], M)
            st = monitor.take()
            check(st["min_route_gap"] >= MIN_ROUTE_GAP, f"[{name}] min routing margin {st['min_route_gap']:.3g} >= {MIN_ROUTE_GAP}")
            check(st["group_changed"] > 0, f"[{name}] group limit changed the choice for {st['group_changed']} of {st['routed_tokens']} routed tokens")
            check(st["bias_changed"] > 0, f"[{name}] expert bias changed the choice for {st['bias_changed']} of {st['routed_tokens']} routed tokens")
            check(all(len(u) >= 8 for u in st["experts_used"]), f"[{name}] experts used per MoE layer {[len(u) for u in st['experts_used']]}")
            rec = golden["generator"]["routing"]
            check(rec["tokens_where_group_limit_changed_the_choice"] == st["group_changed"]
                  and rec["tokens_where_expert_bias_changed_the_choice"] == st["bias_changed"]
                  and rec["routed_tokens"] == st["routed_tokens"], f"[{name}] routing stats recorded")
        summary[name] = dict(hf=worst_hf, ref=worst_ref, min_conf_gap=min(gaps))
    print(json.dumps(summary))
    check.finish()


def main(argv=None):
    ap, _, _ = oc.fixture_cli(__doc__, "write the three tiny family folders and golden outputs", cmd_make_fixtures, cmd_self_check)
    oc.run_cli(ap, argv)


if __name__ == "__main__":
    main()
