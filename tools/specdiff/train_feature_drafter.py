#!/usr/bin/env python3
"""Trains a block drafter that reads the target's hidden states (issue 47, DFlash's layout), and
reports its held-out acceptance curve: the first step of issue 47, to see whether a one-layer
drafter on a 135M target accepts enough to pay before the Rust inference path is built.

The layout (docs/notes/2026-12-05-dflash-drafter-design.md): the target's hidden states at
`--taps` layers (default: the middle one) for the committed context are concatenated,
projected to the model width by a bias-free linear map and RMS-normed, once per position. A
draft block is 1 + `--gamma` positions: the last committed token (its target embedding) then
`--gamma` mask embeddings (one learned vector). Each draft layer is a Llama decoder layer whose
keys and values are the projected context features followed by the block's own states (the same
K/V weights for both, RoPE at true positions), with non-causal attention inside the block; the
queries are the block's. The target's final norm is copied and trained; its tied embeddings and
output head stay frozen. One forward drafts all `--gamma` positions.

Training data: the target's own continuations (`spot generate --json` lines; the lookup store's
`specdiff-lookup.jsonl` from tools/specdiff/setup_lookup.sh), split by id into training and
held-out rows (`train_drafter.split`). The tapped features of every row come from one target
forward per row, cached in `--out/features.pt`. Each step samples `--blocks` anchors per
sequence; the loss is streak distillation as in train_drafter.py (`--no-streak`: plain
cross-entropy). Resumes from `--out/train.pt`. Prints the held-out acceptance (the share of
blocks whose greedy draft equals the target's continuation on at least i leading tokens).

    python tools/specdiff/train_feature_drafter.py --target ~/.cache/spot-smollm2 \
        --teacher ~/.cache/spot-smollm2/specdiff-lookup.jsonl --out work/feature-drafter \
        --minutes 15
"""

import argparse
import copy
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from train_drafter import load_teacher, split, streak_loss
from transformers import AutoModelForCausalLM


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """Rotary embedding of `x` [heads, rows, dim] at positions `pos` [rows] (Llama's halves)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


class FeatureDrafter(torch.nn.Module):
    def __init__(self, target, taps, layers, gamma, mask_id):
        super().__init__()
        cfg = target.config
        self.cfg, self.taps, self.gamma, self.mask_id = cfg, taps, gamma, mask_id
        d = cfg.hidden_size
        self.heads, self.kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = d // self.heads
        self.embed = target.get_input_embeddings()
        self.head = target.lm_head
        self.fc = torch.nn.Linear(len(taps) * d, d, bias=False)
        self.fc_norm = torch.nn.Parameter(torch.ones(d))
        self.mask_vec = torch.nn.Parameter(self.embed.weight[mask_id].detach().clone())
        # Draft layers start as copies of the target's last layers (a warm start).
        src = target.model.layers[len(target.model.layers) - layers :]
        self.layers = torch.nn.ModuleList([_copy(layer) for layer in src])
        self.norm = torch.nn.Parameter(target.model.norm.weight.detach().clone())

    def features(self, hidden_taps):
        """Projected context features of [rows, taps × d] target states."""
        return rms(self.fc(hidden_taps), self.fc_norm, self.cfg.rms_norm_eps)

    def draft_hidden(self, ctx, ctx_pos, blocks):
        """States of every block row. `ctx` [n, d] projected features at positions `ctx_pos`;
        `blocks` a list of (anchor position c, anchor token): block rows are positions c..c+γ,
        reading context positions < c and their own block."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        gamma = self.gamma
        toks, pos, owner = [], [], []
        for b, (c, tok) in enumerate(blocks):
            toks.append(tok)
            toks += [self.mask_id] * gamma
            pos += list(range(c, c + 1 + gamma))
            owner += [b] * (1 + gamma)
        toks, pos = torch.tensor(toks), torch.tensor(pos)
        x = self.embed(toks)
        is_mask = torch.tensor([i % (1 + gamma) != 0 for i in range(len(owner))])
        x = torch.where(is_mask[:, None], self.mask_vec.expand_as(x), x)
        owner = torch.tensor(owner)
        anchors = torch.tensor([c for c, _ in blocks])
        # Each block row sees context positions before its anchor and its own block.
        see_ctx = ctx_pos[None, :] < anchors[owner][:, None]
        see_blk = owner[:, None] == owner[None, :]
        allow = torch.cat([see_ctx, see_blk], 1)
        rep = self.heads // self.kv
        for layer in self.layers:
            a = layer.self_attn
            h = rms(x, layer.input_layernorm.weight, eps)
            q = a.q_proj(h).view(-1, self.heads, self.hd).transpose(0, 1)
            kb = a.k_proj(h).view(-1, self.kv, self.hd).transpose(0, 1)
            vb = a.v_proj(h).view(-1, self.kv, self.hd).transpose(0, 1)
            kc = a.k_proj(ctx).view(-1, self.kv, self.hd).transpose(0, 1)
            vc = a.v_proj(ctx).view(-1, self.kv, self.hd).transpose(0, 1)
            q = rope(q, pos, cfg.rope_theta)
            k = torch.cat([rope(kc, ctx_pos, cfg.rope_theta), rope(kb, pos, cfg.rope_theta)], 1)
            v = torch.cat([vc, vb], 1)
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=allow[None, None])
            x = x + a.o_proj(o[0].transpose(0, 1).reshape(-1, self.heads * self.hd))
            h = rms(x, layer.post_attention_layernorm.weight, eps)
            x = x + layer.mlp(h)
        return rms(x, self.norm, eps)


def _copy(module):
    m = copy.deepcopy(module)
    for p in m.parameters():
        p.requires_grad_(True)
    return m


def tap_features(target, rows, taps, path):
    """The target's hidden states at `taps` for every row (cached in `path`)."""
    if path.exists():
        return torch.load(path)
    feats = {}
    with torch.no_grad():
        for k, r in enumerate(rows):
            out = target(torch.tensor([r["ids"]]), output_hidden_states=True)
            # hidden_states[0] is the embeddings; layer i's output is hidden_states[i + 1].
            feats[r["id"]] = torch.cat([out.hidden_states[t + 1][0] for t in taps], -1).half()
            if k % 50 == 0:
                print(f"features: {k}/{len(rows)}", flush=True)
    torch.save(feats, path)
    return feats


def blocks_of(r, n_blocks, gamma, rng):
    """Anchors c in the generated part with at least one token after them."""
    p0, n = r["prompt_len"], len(r["ids"])
    cand = range(p0, n - 1)
    cs = sorted(rng.sample(cand, min(n_blocks, len(cand))))
    return [(c, r["ids"][c]) for c in cs]


def block_logprobs(model, r, feats, blocks):
    gamma = model.gamma
    ids = r["ids"]
    n = len(ids)
    last = max(c for c, _ in blocks)
    ctx_pos = torch.arange(last)
    ctx = model.features(feats[:last].float())
    h = model.draft_hidden(ctx, ctx_pos, blocks)
    rows, targets, owner = [], [], []
    for b, (c, _) in enumerate(blocks):
        for i in range(gamma):
            if c + 1 + i < n:
                rows.append(b * (1 + gamma) + 1 + i)
                targets.append(ids[c + 1 + i])
                owner.append((b, i))
    logits = model.head(h[rows]).float()
    tgt = torch.tensor(targets)
    picked = torch.log_softmax(logits, -1).gather(1, tgt[:, None])[:, 0]
    hit = logits.argmax(-1) == tgt
    per = [[None] * gamma for _ in blocks]
    hits = [[None] * gamma for _ in blocks]
    for k, (b, i) in enumerate(owner):
        per[b][i] = picked[k]
        hits[b][i] = bool(hit[k])
    return per, hits


def evaluate(model, rows, feats, n_blocks, seed):
    rng = random.Random(seed)
    gamma = model.gamma
    curve, total = [0] * (gamma + 1), 0
    model.eval()
    with torch.no_grad():
        for r in rows:
            blocks = blocks_of(r, n_blocks, gamma, rng)
            _, hits = block_logprobs(model, r, feats[r["id"]], blocks)
            for blk in hits:
                k = 0
                while k < gamma and blk[k]:
                    k += 1
                for i in range(k + 1):
                    curve[i] += 1
                total += 1
    model.train()
    return [c / max(total, 1) for c in curve[1:]], total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--teacher", type=Path, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--taps", type=int, nargs="+", help="target layers read (default: the middle one)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--gamma", type=int, default=15)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--mask-id", type=int, default=16, help="SmolLM2's <empty_output>")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--no-streak", action="store_true")
    ap.add_argument("--heldout", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    n_layers = target.config.num_hidden_layers
    taps = a.taps or [n_layers // 2]
    rows = load_teacher(a.teacher)
    train, held = split(rows, a.heldout, a.seed)
    print(f"{len(train)} training and {len(held)} held-out continuations; taps {taps}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    tag = "-".join(map(str, taps))
    feats = tap_features(target, rows, taps, a.out / f"features-{tag}.pt")
    model = FeatureDrafter(target, taps, a.layers, a.gamma, a.mask_id)
    params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith(("embed", "head"))]
    print(f"drafter: {a.layers} layer(s), {sum(p.numel() for p in params):,} trained parameters", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    ckpt = a.out / "train.pt"
    step = 0
    if ckpt.exists():
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print(f"resumed at step {step}", flush=True)

    def report(label):
        curve, nb = evaluate(model, held, feats, 32, 1)
        print(f"{label}: held-out acceptance (>= 1, 2, 4, 8 tokens) {curve[0]:.3f} {curve[1]:.3f} "
              f"{curve[3]:.3f} {curve[7]:.3f} over {nb} blocks; mean accepted "
              f"{sum(curve):.2f}", flush=True)
        return curve

    report(f"step {step}")
    rng = random.Random(a.seed + step)
    t0 = time.time()
    running = None
    while time.time() < t0 + a.minutes * 60:
        frac = (time.time() - t0) / (a.minutes * 60)
        for g in opt.param_groups:
            g["lr"] = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        r = rng.choice(train)
        blocks = blocks_of(r, a.blocks, a.gamma, rng)
        per, _ = block_logprobs(model, r, feats[r["id"]], blocks)
        loss = streak_loss(per, not a.no_streak)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            print(f"step {step}: loss {running:.4f}, {time.time() - t0:.0f} s", flush=True)
        if step % a.eval_every == 0:
            report(f"step {step}")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    curve = report(f"final, step {step}")
    print("held-out acceptance curve (i = 1..γ): " + " ".join(f"{c:.3f}" for c in curve), flush=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)


if __name__ == "__main__":
    main()
