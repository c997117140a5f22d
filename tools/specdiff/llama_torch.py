"""A Llama-family causal model in plain PyTorch, read from a Hugging Face folder's
`config.json` and `model.safetensors` (no `transformers`), for the feature drafter's tools
(issue 47): batched greedy generation with a KV cache, and one teacher-forced pass that returns
chosen layers' hidden states.

The definition is the one `spot_models::CausalLm` runs: RMS norm, rotary embedding on halves,
grouped-query attention, SwiGLU MLP; layer `i`'s output is the residual stream after layer `i`
(0-based), before the final norm.
"""

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(pos, dim, theta):
    """cos and sin [..., dim] at integer positions `pos` (any shape)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = pos[..., None].double() * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    d = x.shape[-1]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


class Llama:
    """Weights as plain tensors (frozen), grouped per layer."""

    def __init__(self, folder: Path, dtype=torch.float32):
        cfg = json.loads((Path(folder) / "config.json").read_text())
        if cfg.get("model_type") not in ("llama", "qwen2"):
            raise SystemExit(f"{folder}: model_type {cfg.get('model_type')!r} is not llama/qwen2")
        self.cfg = cfg
        w = load_file(str(Path(folder) / "model.safetensors"))
        self.d = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or self.d // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg.get("rope_theta", 10000.0)
        self.n_layers = cfg["num_hidden_layers"]
        self.embed = w["model.embed_tokens.weight"].to(dtype)
        self.head = w.get("lm_head.weight", w["model.embed_tokens.weight"]).to(dtype)
        self.norm = w["model.norm.weight"].to(dtype)
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            get = lambda n, p=p: w[p + n].to(dtype)  # noqa: E731
            self.layers.append(
                {
                    "in": get("input_layernorm.weight"),
                    "post": get("post_attention_layernorm.weight"),
                    "q": get("self_attn.q_proj.weight"),
                    "k": get("self_attn.k_proj.weight"),
                    "v": get("self_attn.v_proj.weight"),
                    "o": get("self_attn.o_proj.weight"),
                    "bq": w.get(p + "self_attn.q_proj.bias"),
                    "bk": w.get(p + "self_attn.k_proj.bias"),
                    "bv": w.get(p + "self_attn.v_proj.bias"),
                    "gate": get("mlp.gate_proj.weight"),
                    "up": get("mlp.up_proj.weight"),
                    "down": get("mlp.down_proj.weight"),
                }
            )

    def layer(self, L, x, cos, sin, cache, mask):
        """One layer over x [B, S, d]. `cache`: None, or (k, v, at) with k, v [B, kv, cap, hd]
        preallocated and `at` the rows already filled (these rows are written after them).
        `mask` [B, 1, S, at + S] boolean (True: may attend)."""
        B, S, _ = x.shape
        h = rms(x, L["in"], self.eps)
        q = F.linear(h, L["q"], L["bq"]).view(B, S, self.heads, self.hd).transpose(1, 2)
        k = F.linear(h, L["k"], L["bk"]).view(B, S, self.kv, self.hd).transpose(1, 2)
        v = F.linear(h, L["v"], L["bv"]).view(B, S, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:
            ck, cv, at = cache
            ck[:, :, at : at + S] = k
            cv[:, :, at : at + S] = v
            k, v = ck[:, :, : at + S], cv[:, :, : at + S]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + F.linear(o.transpose(1, 2).reshape(B, S, -1), L["o"])
        h = rms(x, L["post"], self.eps)
        return x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])

    @torch.no_grad()
    def hidden_states(self, ids, taps):
        """Teacher-forced pass over one sequence `ids` (list); returns ([len, len(taps) * d] tapped
        layer outputs, [len, vocab] logits)."""
        x = self.embed[torch.tensor(ids)][None]
        S = x.shape[1]
        pos = torch.arange(S)
        cos, sin = rope_tables(pos, self.hd, self.theta)
        mask = torch.ones(S, S, dtype=torch.bool).tril()[None, None]
        out = []
        for i, L in enumerate(self.layers):
            x = self.layer(L, x, cos, sin, None, mask)
            if i in taps:
                out.append(x[0])
        logits = F.linear(rms(x[0], self.norm, self.eps), self.head)
        return torch.cat([out[sorted(taps).index(t)] for t in taps], -1), logits

    def to(self, dtype):
        """A copy with every weight in `dtype` (bfloat16 runs on AMX where the CPU has it)."""
        m = copy.copy(self)
        conv = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        m.embed, m.head, m.norm = conv(self.embed), conv(self.head), conv(self.norm)
        m.layers = [{n: conv(t) for n, t in L.items()} for L in self.layers]
        return m

    @torch.no_grad()
    def generate(self, prompts, max_new, stops, temperature=0.0, seed=0):
        """Continuations of several prompts (lists of ids) at once, left-padded, in the weights'
        dtype, greedy or (`temperature` > 0) sampled with a generator seeded by `seed`; each
        ends at its first stop id (kept) or after `max_new` tokens."""
        gen = torch.Generator().manual_seed(seed)
        B = len(prompts)
        P = max(len(p) for p in prompts)
        ids = torch.zeros(B, P, dtype=torch.long)
        valid = torch.zeros(B, P + max_new, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, P - len(p) :] = torch.tensor(p)
            valid[b, P - len(p) : P] = True
        valid[:, P:] = True
        pos = (valid[:, :P].long().cumsum(1) - 1).clamp(min=0)
        dt = self.embed.dtype
        cap = P + max_new
        caches = [
            (torch.zeros(B, self.kv, cap, self.hd, dtype=dt), torch.zeros(B, self.kv, cap, self.hd, dtype=dt))
            for _ in range(self.n_layers)
        ]
        out = [[] for _ in range(B)]
        done = [False] * B
        x_ids, x_pos, at = ids, pos, 0
        for _ in range(max_new):
            S = x_ids.shape[1]
            total = at + S
            causal = torch.ones(S, total, dtype=torch.bool).tril(total - S)
            mask = (causal[None] & valid[:, None, :total])[:, None]
            # A fully padded query row would attend nowhere: let it see itself.
            mask = mask | _diag_mask(S, total)[None, None]
            cos, sin = rope_tables(x_pos, self.hd, self.theta)
            cos, sin = cos[:, None].to(dt), sin[:, None].to(dt)
            x = self.embed[x_ids]
            for i, L in enumerate(self.layers):
                x = self.layer(L, x, cos, sin, (*caches[i], at), mask)
            at = total
            logits = F.linear(rms(x[:, -1], self.norm, self.eps), self.head)
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            else:
                nxt = logits.float().argmax(-1)
            for b in range(B):
                if not done[b]:
                    t = int(nxt[b])
                    out[b].append(t)
                    done[b] = t in stops
            if all(done):
                break
            x_ids = nxt[:, None]
            x_pos = x_pos[:, -1:] + 1
        return out

    @torch.no_grad()
    def hidden_states_batch(self, seqs, taps):
        """[`hidden_states`] of several sequences at once (right-padded; padding is causal, so it
        never changes a real row): per sequence ([len, len(taps) * d] float16 tapped layer outputs,
        [len] argmax of the logits), in float32."""
        B, S = len(seqs), max(len(s) for s in seqs)
        ids = torch.zeros(B, S, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
        x = self.embed[ids]
        cos, sin = rope_tables(torch.arange(S), self.hd, self.theta)
        mask = torch.ones(S, S, dtype=torch.bool).tril()[None, None]
        out = []
        for i, L in enumerate(self.layers):
            x = self.layer(L, x, cos, sin, None, mask)
            if i in taps:
                out.append(x)
        h = torch.cat([out[sorted(taps).index(t)] for t in taps], -1)
        arg = F.linear(rms(x, self.norm, self.eps), self.head).argmax(-1)
        return [(h[b, : len(s)].half(), arg[b, : len(s)]) for b, s in enumerate(seqs)]


def _diag_mask(S, total):
    """The diagonal of the last S columns: each query row sees itself."""
    m = torch.zeros(S, total, dtype=torch.bool)
    m[torch.arange(S), torch.arange(total - S, total)] = True
    return m
