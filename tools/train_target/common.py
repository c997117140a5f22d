"""Shared pieces: model config, masks, the two-stream SDAR objective."""
from __future__ import annotations

import torch

VOCAB = 6144
BLOCK = 32
ENDOFTEXT_ID = 6141
IM_END_ID = 6142
MASK_ID = 6143

QWEN3_FIELDS = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    rope_scaling=None,
    attention_bias=False,
    tie_word_embeddings=True,
)


def model_fields(**overrides) -> dict:
    """QWEN3_FIELDS with size overrides (hidden_size, num_hidden_layers, ...); vocab, ids fixed."""
    bad = set(overrides) - set(QWEN3_FIELDS) | ({"vocab_size"} & set(overrides))
    if bad:
        raise ValueError(f"cannot override {sorted(bad)}")
    return {**QWEN3_FIELDS, **overrides}


def make_model(fields: dict | None = None, attn: str = "eager"):
    """Qwen3ForCausalLM in float32 with `fields` (default QWEN3_FIELDS) and the given attention
    implementation ("eager", the CPU recipe; "sdpa" for the GPU recipe, checked by train.py)."""
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:  # Qwen3 arrived in transformers 4.51
        import transformers
        raise SystemExit(f"transformers {transformers.__version__} has no Qwen3 (need >= 4.51): {e}")

    f = dict(QWEN3_FIELDS if fields is None else fields)
    cfg = Qwen3Config(**f, attention_dropout=0.0, use_sliding_window=False, use_cache=False,
                      bos_token_id=None, eos_token_id=ENDOFTEXT_ID, pad_token_id=None)
    cfg._attn_implementation = attn
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    assert model.config._attn_implementation == attn
    if f["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def block_causal_mask(n: int, block: int) -> torch.Tensor:
    """Additive [1, 1, n, n]: query i sees key j iff j // block <= i // block."""
    b = torch.arange(n) // block
    vis = b[None, :] <= b[:, None]
    return torch.zeros(n, n).masked_fill(~vis, float("-inf"))[None, None]


def two_stream_mask(n: int, block: int) -> torch.Tensor:
    """Additive [1, 1, 2n, 2n] mask for input concat(xt, x0).

    noisy query (block b): noisy keys of block b (bidirectional) + clean keys of blocks < b;
    clean query (block b): clean keys of blocks <= b; never noisy keys.
    """
    b = torch.arange(n) // block
    nn_ = b[None, :] == b[:, None]          # noisy q -> noisy k
    nc = b[None, :] < b[:, None]            # noisy q -> clean k
    cn = torch.zeros(n, n, dtype=torch.bool)  # clean q -> noisy k
    cc = b[None, :] <= b[:, None]           # clean q -> clean k
    vis = torch.cat([torch.cat([nn_, nc], 1), torch.cat([cn, cc], 1)], 0)
    return torch.zeros(2 * n, 2 * n).masked_fill(~vis, float("-inf"))[None, None]


def noise(x0: torch.Tensor, block: int, gen: torch.Generator, t_min: float = 0.02):
    """Per-block t ~ U(t_min, 1); mask each token with prob t. Returns xt, masked bool, t per token."""
    B, N = x0.shape
    nb = N // block
    dev = x0.device  # gen must live on the same device (CPU recipe: both on the CPU)
    t = t_min + (1 - t_min) * torch.rand(B, nb, generator=gen, device=dev)
    t_tok = t.repeat_interleave(block, dim=1)
    masked = torch.rand(B, N, generator=gen, device=dev) < t_tok
    xt = torch.where(masked, torch.full_like(x0, MASK_ID), x0)
    return xt, masked, t_tok


def sdar_loss(model, x0, xt, masked, mask4d, reduction: str = "mean"):
    """Mean CE (nats) of noisy-stream logits at masked positions vs x0 (no shift), and count.
    reduction="none": the CE of every masked position instead of the mean (row-major order of
    `masked`), as gpu/compare.py needs."""
    B, N = x0.shape
    ids = torch.cat([xt, x0], 1)
    pos = torch.arange(N, device=x0.device).repeat(2)[None].expand(B, 2 * N)
    h = model.model(input_ids=ids, attention_mask=mask4d.expand(B, 1, 2 * N, 2 * N),
                    position_ids=pos, use_cache=False).last_hidden_state
    hm = h[:, :N][masked]                      # [M, H]: only masked noisy positions
    logits = model.lm_head(hm)
    tgt = x0[masked]
    loss = torch.nn.functional.cross_entropy(logits.float(), tgt, reduction=reduction)
    return loss, int(tgt.numel())
