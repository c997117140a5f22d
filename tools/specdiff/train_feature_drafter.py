#!/usr/bin/env python3
"""Trains SpecDiff-2's drafter that reads the target (issue 47; DFlash's layout, our code) on the
set `feature_data.py` builds, and writes the folder `spot_specdiff::FeatureDrafter` loads.

The model (`docs/specdiff.md`, "The feature drafter"): the target's hidden states at the tapped
layers of every committed position are concatenated, projected to the model width by `fc`
(no bias) and RMS-normed (`fc_norm`): the context features, made once per position. A draft
block is the committed tokens the target has not yet run (usually one: the round's own token),
embedded with the target's input embedding, then `γ` copies of a learned mask vector.
`--layers` Llama decoder layers run over the block: in each, the queries are the block's rows;
the keys and values are those of the context features (that layer's `k_proj`/`v_proj` of the
features, RoPE at their positions) followed by the block's own (the same weights; RoPE at the
block's positions); attention is not causal. With two layers or more, a mask row reads the
other rows' first-layer guesses, not only their identical inputs. A final RMS norm and the target's tied output head give every mask row's distribution
over the token at its position. One pass drafts `γ` tokens.

Training: anchors in the generated part of each continuation; the labels are the float32
target's own argmax given the true prefix (`greedy`), which is what verification accepts. The
head scores the shortlist only (the training continuations' `--shortlist` most frequent tokens,
which the Rust drafter scores too, with the context's): a label outside it is left out. The
loss is streak distillation: position i's cross-entropy is weighted by the drafter's
probability of the labels before it (detached), so early positions, which every accepted streak
needs, weigh most; `--no-streak` trains plain cross-entropy (the ablation). `--dtype bfloat16`
autocasts (faster where the CPU has AMX; float32 is faster without it). Resumable (`OUT/train.pt`); every `--eval-every` steps it
prints the held-out acceptance curve (share of blocks whose greedy draft matches the labels on
at least i leading tokens) and writes the drafter folder `OUT/drafter/`.

    python tools/specdiff/train_feature_drafter.py --target ~/.cache/spot-smollm2 \\
        --data ~/.cache/spot-feature-data --out ~/.cache/spot-feature-train --minutes 45
"""

import argparse
import json
import math
import random
import re
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from llama_torch import Llama, rms, rope, rope_tables
from safetensors.torch import load_file, save_file

FORMAT = "spot-feature-drafter"


class FeatureDrafter(torch.nn.Module):
    def __init__(self, target: Llama, taps, gamma, init_layers):
        super().__init__()
        d = target.d
        self.t, self.taps, self.gamma = target, list(taps), gamma
        self.fc = torch.nn.Parameter(torch.randn(d, len(taps) * d) / math.sqrt(len(taps) * d))
        self.fc_norm = torch.nn.Parameter(torch.ones(d))
        self.mask = torch.nn.Parameter(target.embed.mean(0).clone())
        # Draft layers start as copies of target layers (a warm start).
        self.ws = torch.nn.ModuleList(
            torch.nn.ParameterDict(
                {n: torch.nn.Parameter(target.layers[i][n].clone()) for n in ("in", "post", "q", "k", "v", "o", "gate", "up", "down")}
            )
            for i in init_layers
        )
        self.norm = torch.nn.Parameter(target.norm.clone())

    def features(self, f):
        return rms(F.linear(f, self.fc), self.fc_norm, self.t.eps)

    def blocks(self, ctx, anchors, known, ids):
        """Mask-row states [B, γ, d] of blocks whose known tokens are ids[c - k + 1 .. c] (anchor
        c, `known` k), reading context features ctx[: c - k + 1] ([n, d], positions 0..n-1)."""
        t, g = self.t, self.gamma
        B = len(anchors)
        L = max(known) + g
        d, hd, H, KV = t.d, t.hd, t.heads, t.kv
        rows = torch.zeros(B, L, dtype=torch.long)
        pos = torch.zeros(B, L, dtype=torch.long)
        is_tok = torch.zeros(B, L, dtype=torch.bool)
        valid = torch.zeros(B, L, dtype=torch.bool)
        first = []
        for b, (c, k) in enumerate(zip(anchors, known)):
            s = c - k + 1
            first.append(s)
            rows[b, :k] = torch.tensor(ids[s : c + 1])
            is_tok[b, :k] = True
            valid[b, : k + g] = True
            pos[b, : k + g] = torch.arange(s, c + 1 + g)
        x = torch.where(is_tok[..., None], t.embed[rows], self.mask.expand(B, L, d))
        n = ctx.shape[0]
        see_ctx = torch.arange(n)[None, :] < torch.tensor(first)[:, None]
        mask = torch.cat([see_ctx[:, None, :].expand(B, L, n), valid[:, None, :].expand(B, L, L)], -1)
        mask = mask | ~valid[:, :, None]  # padded rows attend somewhere (ignored)
        cos, sin = rope_tables(pos, hd, t.theta)
        ccos, csin = rope_tables(torch.arange(n), hd, t.theta)
        # Context keys and values per layer (from the same features), then the block's own.
        for w in self.ws:
            h = rms(x, w["in"], t.eps)
            q = rope(F.linear(h, w["q"]).view(B, L, H, hd).transpose(1, 2), cos[:, None], sin[:, None])
            kb = rope(F.linear(h, w["k"]).view(B, L, KV, hd).transpose(1, 2), cos[:, None], sin[:, None])
            vb = F.linear(h, w["v"]).view(B, L, KV, hd).transpose(1, 2)
            kc = rope(F.linear(ctx, w["k"]).view(n, KV, hd).transpose(0, 1), ccos, csin)
            vc = F.linear(ctx, w["v"]).view(n, KV, hd).transpose(0, 1)
            k = torch.cat([kc[None].expand(B, -1, -1, -1), kb], 2)
            v = torch.cat([vc[None].expand(B, -1, -1, -1), vb], 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
            x = x + F.linear(o.transpose(1, 2).reshape(B, L, -1), w["o"])
            h = rms(x, w["post"], t.eps)
            x = x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
        x = rms(x, self.norm, t.eps)
        idx = torch.tensor(known)[:, None] + torch.arange(g)[None, :]
        return x.gather(1, idx[..., None].expand(B, g, d))

    def states(self, f, ids, cs, ks, lab_tokens):
        """Draft states [B, γ, d] of anchors cs with ks known tokens (`lab_tokens`: the labels,
        which the autoregressive mode feeds back)."""
        return self.blocks(self.features(f[: max(cs)].float()), cs, ks, ids)

    def meta_extra(self):
        return {}

    def set_shortlist(self, ids, dtype=torch.float32):
        """Scores only `ids` (as the Rust drafter's head does): the frozen head's rows, cast
        once to the compute `dtype`, and the map from token id to shortlist index (-2: not
        listed)."""
        self.compute = dtype
        self.shortlist_ids = torch.tensor(ids)
        self._head = self.t.head[torch.tensor(ids)].to(dtype)
        self._index = torch.full((self.t.head.shape[0] + 1,), -2, dtype=torch.long)
        self._index[torch.tensor(ids)] = torch.arange(len(ids))
        self._index[-1] = -1  # past the end stays -1

    def logits(self, h):
        """Logits over the shortlist."""
        return F.linear(h.to(self.compute), self._head)

    def autocast(self):
        """bfloat16 autocast when that is the compute dtype."""
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.compute == torch.bfloat16)

    def listed(self, lab):
        """Token labels as shortlist indices (-1 past the end, -2 not listed)."""
        return self._index[lab]

    def tensors(self):
        """The trained parameters under the names of the drafter folder's `model.safetensors`."""
        w = {
            "fc.weight": self.fc,
            "fc_norm.weight": self.fc_norm,
            "norm.weight": self.norm,
        }
        if hasattr(self, "mask"):
            w["mask_embedding"] = self.mask
        names = {
            "in": "input_layernorm.weight",
            "post": "post_attention_layernorm.weight",
            "q": "self_attn.q_proj.weight",
            "k": "self_attn.k_proj.weight",
            "v": "self_attn.v_proj.weight",
            "o": "self_attn.o_proj.weight",
            "gate": "mlp.gate_proj.weight",
            "up": "mlp.up_proj.weight",
            "down": "mlp.down_proj.weight",
        }
        for i, lw in enumerate(self.ws):
            w.update({f"layers.{i}.{names[n]}": p for n, p in lw.items()})
        return w

    def load_folder(self, folder: Path):
        """Starts from the weights of a drafter folder (`--init`); every tensor must be there
        with its shape."""
        saved = load_file(str(folder / "model.safetensors"))
        with torch.no_grad():
            for name, p in self.tensors().items():
                if name not in saved or saved[name].shape != p.shape:
                    raise SystemExit(f"{folder}/model.safetensors: {name} is missing or not shaped {list(p.shape)}")
                p.copy_(saved[name].float())

    def export(self, folder: Path, shortlist, description, store=None, dtype=torch.float16):
        """Writes the drafter folder; with `store` (rows of the training set) also its lookup
        store, `store.jsonl`: each continuation as `prompt_ids` and `tokens`."""
        folder.mkdir(parents=True, exist_ok=True)
        w = self.tensors()
        save_file({n: p.detach().to(dtype).contiguous() for n, p in w.items()}, str(folder / "model.safetensors"))
        meta = {
            "format": FORMAT,
            "version": 1,
            "taps": self.taps,
            "layers": len(self.ws),
            "draft_positions": self.gamma,
            "shortlist": shortlist,
            "description": description,
            **self.meta_extra(),
        }
        if store is not None:
            lines = (json.dumps({"prompt_ids": r["ids"][: r["prompt_len"]], "tokens": r["ids"][r["prompt_len"] :]}) for r in store)
            (folder / "store.jsonl").write_text("".join(line + "\n" for line in lines))
            meta["store"] = "store.jsonl"
        (folder / "specdiff-drafter.json").write_text(json.dumps(meta) + "\n")


class ArHead(FeatureDrafter):
    """The EAGLE-style baseline (`--mode autoregressive`): the same context features, layers,
    norm and head, drafting one token per step. Row `i` reads `inp · [g_i ; E(token_{i+1})]`,
    where `g_i` is the projected feature of position `i` while the target has run it and,
    for drafted positions, the drafter's own previous output state (RMS-normed by `fc_norm`,
    as EAGLE-3 feeds its own states); the layers are causal; row `i`'s output predicts the
    token at `i + 2`. Training unrolls the draft (EAGLE-3's training-time test): step 1 reads
    the target's features, later steps the drafter's own states, with the label tokens fed in."""

    def __init__(self, target: Llama, taps, gamma, init_layers):
        super().__init__(target, taps, gamma, init_layers)
        d = target.d
        del self.mask
        self.inp = torch.nn.Parameter(torch.cat([torch.eye(d), torch.eye(d)], 1) * 0.7)

    def tensors(self):
        w = super().tensors()
        w["inp.weight"] = self.inp
        return w

    def meta_extra(self):
        return {"mode": "autoregressive"}

    def step_in(self, g, tokens):
        return F.linear(torch.cat([g, self.t.embed[tokens]], -1), self.inp)

    def layer_rows(self, w, x, pos, k_prev, v_prev, see):
        """One layer over rows x [B, S, d] at positions pos [B, S]; they attend to the earlier
        keys/values k_prev/v_prev [B, KV, P, hd] where `see` [B, S, P] and causally to each
        other. Returns (x, k, v) with this call's keys/values [B, KV, S, hd] appended."""
        t = self.t
        B, S, _ = x.shape
        hd = t.hd
        cos, sin = rope_tables(pos, hd, t.theta)
        h = rms(x, w["in"], t.eps)
        q = rope(F.linear(h, w["q"]).view(B, S, t.heads, hd).transpose(1, 2), cos[:, None], sin[:, None])
        k = rope(F.linear(h, w["k"]).view(B, S, t.kv, hd).transpose(1, 2), cos[:, None], sin[:, None])
        v = F.linear(h, w["v"]).view(B, S, t.kv, hd).transpose(1, 2)
        k = torch.cat([k_prev, k], 2)
        v = torch.cat([v_prev, v], 2)
        causal = torch.ones(S, S, dtype=torch.bool).tril()[None].expand(B, S, S)
        mask = torch.cat([see, causal], -1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        x = x + F.linear(o.transpose(1, 2).reshape(B, S, -1), w["o"])
        h = rms(x, w["post"], t.eps)
        x = x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
        return x, k, v

    def states(self, f, ids, cs, ks, lab_tokens):
        return self.unroll(f, ids, cs, lab_tokens)

    def unroll(self, f, ids, cs, lab_tokens):
        """States [B, γ, d] (after the final norm) of the γ draft steps of anchors cs (the
        round's known token at c, the target's features at positions < c); step j + 1 is fed
        lab_tokens[:, j] (the labels of the steps before, as an accepted draft would be)."""
        t, g = self.t, self.gamma
        n = max(cs)  # context rows 0..n-1 need tokens 1..n
        feats = self.features(f[:n].float())
        x = self.step_in(feats, torch.tensor(ids[1 : n + 1]))[None]
        pos = torch.arange(n)[None]
        empty = torch.zeros(1, t.kv, 0, t.hd)
        ks, vs = [], []
        for w in self.ws:
            x, k, v = self.layer_rows(w, x, pos, empty, empty, torch.zeros(1, n, 0, dtype=torch.bool))
            ks.append(k)
            vs.append(v)
        B = len(cs)
        a = torch.tensor(cs) - 1  # each anchor's last context row
        s = x[0, a][:, None]  # [B, 1, d]: step 1's states
        outs = [s]
        see = (torch.arange(n)[None, :] <= a[:, None])[:, None, :]  # [B, 1, n]
        dk = [k.expand(B, -1, -1, -1) for k in ks]
        dv = [v.expand(B, -1, -1, -1) for v in vs]
        for j in range(1, g):
            x = self.step_in(rms(s, self.fc_norm, t.eps), lab_tokens[:, j - 1 : j].clamp(min=0))
            p = (a + j)[:, None]
            for li, w in enumerate(self.ws):
                # The new row's keys and values join dk/dv: later steps read them.
                x, dk[li], dv[li] = self.layer_rows(w, x, p, dk[li], dv[li], see)
            see = torch.cat([see, torch.ones(B, 1, 1, dtype=torch.bool)], -1)
            s = x
            outs.append(s)
        return rms(torch.cat(outs, 1), self.norm, t.eps)


def ckpt_exists(out: Path) -> bool:
    return (out / "train.pt").exists()


def load(data: Path):
    rows, feats = [], {}
    for p in sorted(data.glob("chunk-*.pt")):
        feats.update(torch.load(p))
        rows += [json.loads(line) for line in p.with_suffix(".jsonl").open()]
    return [r for r in rows if len(r["ids"]) - r["prompt_len"] >= 4], feats


def prompt_id(pid: str) -> str:
    """The id of the prompt a continuation continues (a sampled one's `-tT` suffix dropped)."""
    return re.sub(r"-t[0-9.]+$", "", pid)


def split(rows, frac, seed):
    ids = sorted(r["id"] for r in rows)
    random.Random(seed).shuffle(ids)
    held = set(ids[: max(1, int(len(ids) * frac))])
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def sample_blocks(r, n, gamma, rng, multi=0.25):
    """Anchors c (the last known token) in the generated part, and known counts."""
    p0, m = r["prompt_len"], len(r["ids"])
    cand = list(range(p0, m - 2))
    cs = rng.sample(cand, min(n, len(cand)))
    ks = [1 if rng.random() > multi else rng.randint(2, 4) for _ in cs]
    return cs, ks


def labels(r, cs, gamma):
    """[B, γ] labels (-1 past the end): mask row i of anchor c predicts position c + 1 + i."""
    g, m = r["greedy"], len(r["ids"])
    out = torch.full((len(cs), gamma), -1, dtype=torch.long)
    for b, c in enumerate(cs):
        for i in range(gamma):
            if c + i < m - 1:
                out[b, i] = g[c + i]
    return out


@torch.no_grad()
def target_logits(t, f, taps, rows):
    """The target's logits [len(rows), vocab] after each position in `rows` ([B, γ] long), from
    the stored features: layer n - 2's output is a tap, so only the last layer and the head run
    again (on float16 features: a soft target, not an exact one)."""
    i = taps.index(t.n_layers - 2)
    d = t.d
    S = int(rows.max()) + 1
    x = f[:S, i * d : (i + 1) * d].float()[None]
    cos, sin = rope_tables(torch.arange(S), t.hd, t.theta)
    mask = torch.ones(S, S, dtype=torch.bool).tril()[None, None]
    x = t.layer(t.layers[-1], x, cos, sin, None, mask)[0]
    return F.linear(rms(x[rows], t.norm, t.eps), t.head)


def block_loss(model, r, f, rng, n_blocks, streak, soft=0.0, taps=None):
    cs, ks = sample_blocks(r, n_blocks, model.gamma, rng, multi=0.0 if isinstance(model, ArHead) else 0.25)
    tokens = labels(r, cs, model.gamma)
    lab = model.listed(tokens)
    h = model.states(f, r["ids"], cs, ks, tokens)
    lp = torch.log_softmax(model.logits(h).float(), -1)
    ok = lab >= 0
    picked = lp.gather(-1, lab.clamp(min=0)[..., None])[..., 0] * ok
    if streak:
        w = torch.cumprod(torch.cat([torch.ones(len(cs), 1), picked.detach().exp()[:, :-1]], 1), 1)
    else:
        w = torch.ones_like(picked)
    if soft > 0:
        # The target's own distribution over the shortlist at each drafted position (what the
        # noise-coupled draft at T > 0 must match), as a second cross-entropy.
        rows = (torch.tensor(cs)[:, None] + torch.arange(model.gamma)[None]).clamp(max=len(r["ids"]) - 1)
        p = torch.softmax(target_logits(model.t, f, taps, rows)[..., model.shortlist_ids], -1)
        picked = picked + soft * (p * lp).sum(-1) * ok
    return -(w * picked).sum() / ok.sum().clamp(min=1)


@torch.no_grad()
def evaluate(model, rows, feats, seed, n_blocks=16, taps=None):
    """The held-out acceptance curve at T = 0, and (with `taps`, which must include layer
    n - 2) the share of blocks whose first position's draft at T = 1, chosen among the drafter's
    64 best candidates with the Gumbel noise the target samples with, is the target's sample."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    g = model.gamma
    curve, total, coupled = [0] * g, 0, 0
    for r in rows:
        cs, _ = sample_blocks(r, n_blocks, g, rng, multi=0.0)
        ks = [1] * len(cs)
        tokens = labels(r, cs, g)
        lab = model.listed(tokens)
        with model.autocast():
            h = model.states(feats[r["id"]], r["ids"], cs, ks, tokens)
            arg = model.logits(h).float().argmax(-1)
        if taps is not None and model.t.n_layers - 2 in taps:
            tl = target_logits(model.t, feats[r["id"]], taps, torch.tensor(cs)[:, None])[:, 0]
            noise = -torch.log(-torch.log(torch.rand(tl.shape, generator=gen).clamp(1e-20, 1 - 1e-7)))
            sample = (tl + noise).argmax(-1)
            dl = model.logits(h[:, 0]).float()
            top = dl.topk(min(64, dl.shape[-1]), -1)
            ids = model.shortlist_ids[top.indices]
            pick = ids.gather(1, (top.values + noise.gather(1, ids)).argmax(-1, keepdim=True))[:, 0]
            coupled += int((pick == sample).sum())
        hit = (arg == lab).long()
        run = torch.cumprod(hit, 1).sum(1)
        for s in run.tolist():
            for i in range(s):
                curve[i] += 1
        total += len(cs)
    model.coupled = coupled / max(total, 1)
    return [c / max(total, 1) for c in curve], total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2, help="draft layers (copies of the target's last ones to start)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minutes", type=float, default=45.0)
    ap.add_argument("--no-streak", action="store_true")
    ap.add_argument(
        "--soft",
        type=float,
        default=0.0,
        help="weight of a second cross-entropy against the target's own distribution over the shortlist (needs the tap n_layers - 2)",
    )
    ap.add_argument(
        "--mode",
        choices=["block", "autoregressive"],
        default="block",
        help="block: one pass drafts γ (ours); autoregressive: the EAGLE-style baseline, one step per token",
    )
    ap.add_argument("--heldout", type=float, default=0.04)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--shortlist", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", action="store_true", help="ship every greedy continuation as the drafter's lookup store")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="compute (bfloat16: autocast)")
    ap.add_argument(
        "--init",
        type=Path,
        help="start from this drafter folder's weights and shortlist (a fresh optimizer; its held-out split must be this one's)",
    )
    ap.add_argument(
        "--heldout-ids",
        type=Path,
        help="a JSON list of the ids to hold out (instead of --heldout's share): --init's own held-out set when this run sees fewer chunks",
    )
    ap.add_argument("--init-steps", type=int, default=0, help="steps the --init weights were trained for (counted in the card)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    meta = json.loads((a.data / "meta.json").read_text())
    target = Llama(a.target)
    rows, feats = load(a.data)
    if a.heldout_ids:
        held_ids = set(json.loads(a.heldout_ids.read_text()))
        # A sampled continuation (`-tT` id) of a held-out prompt is held out too.
        train = [r for r in rows if prompt_id(r["id"]) not in held_ids]
        held = [r for r in rows if r["id"] in held_ids]
        held_sampled = [r for r in rows if r["id"] not in held_ids and prompt_id(r["id"]) in held_ids]
    else:
        train, held = split(rows, a.heldout, a.seed)
        held_sampled = []
    n_gen = sum(len(r["ids"]) - r["prompt_len"] for r in train)
    print(f"{len(train)} training continuations ({n_gen} tokens), {len(held)} held out; taps {meta['taps']}", flush=True)
    # The shortlist: the most frequent tokens of the training continuations (the drafter's head
    # scores these and the prompt's tokens).
    freq = Counter(t for r in train for t in r["ids"][r["prompt_len"] :])
    shortlist = sorted(t for t, _ in freq.most_common(a.shortlist))
    if a.init:
        init_meta = json.loads((a.init / "specdiff-drafter.json").read_text())
        shortlist = init_meta["shortlist"]
    cover = sum(freq[t] for t in shortlist) / max(1, sum(freq.values()))
    print(f"shortlist: {len(shortlist)} tokens cover {cover:.4f} of the training continuations' tokens", flush=True)
    kind = ArHead if a.mode == "autoregressive" else FeatureDrafter
    model = kind(target, meta["taps"], a.gamma, range(target.n_layers - a.layers, target.n_layers))
    model.set_shortlist(shortlist, getattr(torch, a.dtype))
    if a.init and not ckpt_exists(a.out):
        model.load_folder(a.init)
        print(f"started from {a.init} ({a.init_steps} steps)", flush=True)
    params = list(model.parameters())
    print(f"drafter: {sum(p.numel() for p in params):,} trained parameters", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0, betas=(0.9, 0.98))
    a.out.mkdir(parents=True, exist_ok=True)
    ckpt = a.out / "train.pt"
    step, spent = a.init_steps if a.init else 0, 0.0
    if ckpt.exists():
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, spent = st["step"], st["seconds"]
        print(f"resumed at step {step} ({spent:.0f} s trained)", flush=True)
    budget = a.minutes * 60
    rng = random.Random(a.seed + step)
    first = a.init_steps if a.init else 0  # the warm-up restarts with a fresh optimizer

    def checkpoint(label):
        curve, nb = evaluate(model, held, feats, 1, taps=meta["taps"])
        line = " ".join(f"{c:.3f}" for c in curve)
        print(
            f"{label}: held-out acceptance >= 1..{a.gamma} tokens: {line} ({nb} blocks; mean accepted {sum(curve):.2f}); "
            f"T = 1 first position coupled: {model.coupled:.3f}",
            flush=True,
        )
        sources = {}
        for r in held:
            sources.setdefault(re.sub(r"-[0-9]+$", "", r["id"]), []).append(r)
        if len(sources) > 1:
            # Per source, so that one kind of text cannot hide behind another's mean.
            for src, part in sorted(sources.items()):
                curve_p, nb_p = evaluate(model, part, feats, 1, taps=meta["taps"])
                print(
                    f"{label}: held-out {src} ({len(part)} continuations, {nb_p} blocks): mean accepted "
                    f"{sum(curve_p):.2f} (>= 1: {curve_p[0]:.3f}); T = 1 first position coupled: {model.coupled:.3f}",
                    flush=True,
                )
        if held_sampled:
            curve_s, nb_s = evaluate(model, held_sampled, feats, 1, taps=meta["taps"])
            print(
                f"{label}: held-out sampled continuations ({nb_s} blocks): mean accepted {sum(curve_s):.2f} "
                f"(>= 1: {curve_s[0]:.3f}); T = 1 first position coupled: {model.coupled:.3f}",
                flush=True,
            )
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": spent}, ckpt)
        desc = (
            f"SpecDiff-2 feature drafter ({a.mode}) for {Path(meta['target']).name}: taps {meta['taps']}, {a.layers} layer(s), "
            f"{len(train)} continuations ({n_gen} tokens), {step} steps x {a.blocks} blocks, "
            f"{'streak distillation' if not a.no_streak else 'plain cross-entropy'}"
            f"{f' + {a.soft} x soft targets' if a.soft else ''}, {spent / 60:.1f} min on "
            f"{torch.get_num_threads()} threads; held-out acceptance >= 1/2/4: {curve[0]:.3f}/{curve[1]:.3f}/{curve[3]:.3f}"
        )
        # The store: greedy continuations only (a sampled one is one draw, not what T = 0 repeats).
        greedy = [r for r in rows if prompt_id(r["id"]) == r["id"]]
        model.export(a.out / "drafter", shortlist, desc, greedy if a.store else None)

    t0 = time.time() - spent
    running = None
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1 - first) / 200) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        r = rng.choice(train)
        with model.autocast():
            loss = block_loss(model, r, feats[r["id"]], rng, a.blocks, not a.no_streak, a.soft, meta["taps"])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        spent = time.time() - t0
        running = loss.item() if running is None else 0.99 * running + 0.01 * loss.item()
        if step % 100 == 0:
            print(f"step {step}: loss {running:.4f}, {spent:.0f} s", flush=True)
        if step % a.eval_every == 0:
            checkpoint(f"step {step}")
    checkpoint(f"final, step {step}")


if __name__ == "__main__":
    main()
