#!/usr/bin/env python3
"""Trains the MRP baseline (multi-token residual prediction, arXiv 2605.18817) for an
SDAR-format target: a small module that reads the target's final hidden states `h_A` of a
block and the block's current tokens, and predicts the hidden-space residual that turns the
stale logits `A = head(h_A)` into the logits of the state one commit later,
`head(h_A + h_C)` (`head` is the target's own, frozen).

    python tools/mrp/train_mrp.py --target models/sdar-tiny-code --data ../shared/data \
        --out models/sdar-tiny-code --minutes 20

Module (as the paper's code builds it): `h_C = norm(layers(W [enorm(embed(ids)); hnorm(h)]))`
with `layers` decoder layers of the target's own shape attending bidirectionally within the
block (the prefix reaches it only through `h`). Applied recursively for a chain of drafts:
step `k` reads `h_A + Σ_{i<k} h_C,i` and the tokens after `k` commits, and its logits are
`head(h_A + Σ_{i≤k} h_C,i)`.

Training, as the paper: the target frozen; forward KL from the target's logits at the next
state to the corrected ones, over the positions still masked, `--steps-ahead` recursive steps
(the paper trains 1-3). The states differ from the paper's, to make the baseline as strong as
it can be for exact single-commit decoding: each step draws windows of training-side text
(GSM8K train, MBPP 601-974), decodes each window's last block draft-free with the target (the
most confident masked position with its choice, one per forward) and trains on random steps of
those decodes, so the module sees the states and commits it will draft from (the paper masks
ground-truth text at random and reveals a random position with its ground-truth token).
With `--temperatures 0,1,2` each window is decoded at one of them (the choice
`argmax(l / T + G)` with Gumbel noise `G`, the confidence its probability under
`softmax(l / T)`, as the Rust decoder) and the KL compares `softmax(l / T)`; `--init` starts
from a module already trained (at `T = 0`, say).

Writes OUT/mrp.safetensors (the module's tensors, `mrp.` names) and OUT/mrp.json (shape,
training record, a reference output the Rust tests compare with). Resumes from
OUT/mrp-train.pt. Never add evaluation prompts (GSM8K test, HumanEval, MATH-500, MBPP 11-510).
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

FORMAT = "spot-mrp"
NEG = -1e30


def load_target(folder: Path):
    cfg = json.loads((folder / "config.json").read_text())
    keep = {k: cfg[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "attention_bias",
        "tie_word_embeddings")}
    qc = Qwen3Config(**keep, attention_dropout=0.0, use_sliding_window=False, use_cache=False)
    qc._attn_implementation = "eager"
    model = Qwen3ForCausalLM(qc).to(torch.float32)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"target weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval().requires_grad_(False)
    return model, cfg


class Mrp(torch.nn.Module):
    def __init__(self, qc, layers: int):
        super().__init__()
        h = qc.hidden_size
        self.enorm = Qwen3RMSNorm(h, eps=qc.rms_norm_eps)
        self.hnorm = Qwen3RMSNorm(h, eps=qc.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.layers = torch.nn.ModuleList(Qwen3DecoderLayer(qc, i) for i in range(layers))
        self.norm = Qwen3RMSNorm(h, eps=qc.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(qc)
        for p in self.layers.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        torch.nn.init.normal_(self.eh_proj.weight, std=0.02)
        with torch.no_grad():
            self.norm.weight.fill_(0.1)  # start near the stale logits

    def forward(self, emb, h):
        b, n, _ = emb.shape
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], -1))
        pos = torch.arange(n)[None].expand(b, n)
        pe = self.rotary(x, pos)
        full = torch.zeros(b, 1, n, n)  # bidirectional within the block
        for layer in self.layers:
            out = layer(x, attention_mask=full, position_ids=pos, position_embeddings=pe)
            x = out[0] if isinstance(out, tuple) else out
        return self.norm(x)


def docs(data: Path, tok: Tokenizer):
    out = []
    for line in (data / "gsm8k_train.jsonl").open():
        r = json.loads(line)
        out.append(r["question"] + "\n" + r["answer"])
    for r in [json.loads(line) for line in (data / "mbpp.jsonl").open()][600:974]:
        out.append(r["text"].strip() + "\n" + r["code"])
    return [tok.encode(d).ids for d in out]


def stream(ids_list, eot: int):
    s = []
    for ids in ids_list:
        s.extend(ids)
        s.append(eot)
    return torch.tensor(s)


def block_causal(n: int, block: int):
    b = torch.arange(n) // block
    return torch.zeros(n, n).masked_fill(~(b[None, :] <= b[:, None]), float("-inf"))[None, None]


class Windows:
    """Training-side text windows: `prefix_blocks` clean blocks, then a masked block."""

    def __init__(self, data, block, prefix_blocks, rng):
        self.data, self.block, self.pb, self.rng = data, block, prefix_blocks, rng

    def sample(self, b: int, mask_id: int):
        n = (self.pb + 1) * self.block
        starts = [self.rng.randrange(0, len(self.data) - n) for _ in range(b)]
        x = torch.stack([self.data[s:s + n] for s in starts])
        x[:, -self.block:] = mask_id
        return x


def block_forward(target, ids, mask4d, block):
    n = ids.shape[1]
    h = target.model(input_ids=ids, attention_mask=mask4d.expand(ids.shape[0], 1, n, n),
                     position_ids=torch.arange(n)[None].expand(ids.shape[0], n)).last_hidden_state
    return h[:, -block:]


def masked_logits(target, h, mask_id):
    lg = target.lm_head(h)
    lg[..., mask_id] = NEG
    return lg


def gumbel(like, gen=None):
    """Standard Gumbel noise shaped like `like` (from `gen` when given)."""
    u = torch.rand(like.shape, generator=gen).clamp_(1e-12, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def tempered(temps):
    """Per-row divisor of the logits, `[B, 1, 1]`: `T`, or 1 where `T = 0`."""
    return torch.where(temps > 0, temps, torch.ones_like(temps))[:, None, None]


def commit(lg, state, mask_id, temps=None, noise=None):
    """The target's own step: the most confident masked position with its choice. With
    per-row temperatures `temps` (`[B]`) and Gumbel `noise` (`[B, L, V]`), the choice is
    `argmax(l / T + G)` where `T > 0` (`argmax l` where `T = 0`) and the confidence is its
    probability under `softmax(l / T)`, as the Rust decoder's default rule."""
    if temps is None:
        conf, tok = torch.softmax(lg, -1).max(-1)
    else:
        z = lg / tempered(temps)
        hot = (temps > 0)[:, None, None]
        tok = torch.where(hot, z + noise, z).argmax(-1)
        conf = torch.softmax(z, -1).gather(-1, tok[..., None])[..., 0]
    conf = conf.masked_fill(state != mask_id, -1.0)
    s = conf.argmax(-1)
    rows = torch.arange(state.shape[0])
    new = state.clone()
    new[rows, s] = tok[rows, s]
    return new, s, tok[rows, s]


@torch.no_grad()
def rollout(target, x, a, temps):
    """Draft-free decoding of each window's block at its temperature (`temps`, `[B]`; fresh
    Gumbel noise per step where `T > 0`): per step, the state, the target's hidden states and
    logits there ([B, L] ids, [B, L, H], [B, L, V] per step)."""
    mask4d = block_causal(x.shape[1], a.block)
    state = x[:, -a.block:]
    states, hs, lgs = [], [], []
    for _ in range(a.block):
        h = block_forward(target, torch.cat([x[:, :-a.block], state], 1), mask4d, a.block)
        lg = masked_logits(target, h, a.mask_id)
        states.append(state)
        hs.append(h)
        lgs.append(lg)
        state, _, _ = commit(lg, state, a.mask_id, temps, gumbel(lg))
    return torch.stack(states, 1), torch.stack(hs, 1), torch.stack(lgs, 1), temps


def examples(roll, per_window: int, steps: int, rng: random.Random):
    """`per_window` random steps `k` of each rollout: the stale hidden states at `k`, then the
    states and target logits of the `steps` steps after it, and each example's temperature."""
    states, hs, lgs, temps = roll
    b, n = states.shape[0], states.shape[1]
    rows = [(i, rng.randrange(0, n - steps)) for i in range(b) for _ in range(per_window)]
    bi = torch.tensor([r[0] for r in rows])
    ki = torch.tensor([r[1] for r in rows])
    h = hs[bi, ki]
    stale = lgs[bi, ki]
    nxt = [(states[bi, ki + s], lgs[bi, ki + s]) for s in range(1, steps + 1)]
    return h, stale, nxt, temps[bi]


def run(target, mrp, ex, a, steps, gen=None):
    """Returns the loss (forward KL between the tempered distributions, `softmax(l / T)`,
    `T = 1` for greedy examples) and, per temperature and step, how often the corrected and
    the stale logits name the target's next commit (position and token, under one shared
    draw of the noise): `{T: [mrp step 1, stale step 1, mrp step 2, ...]}`."""
    ha, stale, nxt, temps = ex
    mask_id = a.mask_id
    div = tempered(temps)
    acc = torch.zeros_like(ha)
    loss, hits = 0.0, {}
    for state, true_lg in nxt[:steps]:
        emb = target.model.embed_tokens(state)
        acc = acc + mrp(emb, ha + acc)
        pred = masked_logits(target, ha + acc, mask_id)
        still = state == mask_id
        kl = torch.sum(torch.softmax(true_lg / div, -1)
                       * (torch.log_softmax(true_lg / div, -1)
                          - torch.log_softmax(pred / div, -1)), -1)
        loss = loss + (kl * still).sum() / still.sum().clamp_min(1) / steps
        with torch.no_grad():
            g = gumbel(true_lg, gen)
            _, s_true, v_true = commit(true_lg, state, mask_id, temps, g)
            _, s_pred, v_pred = commit(pred, state, mask_id, temps, g)
            _, s_old, v_old = commit(stale, state, mask_id, temps, g)
            for t in sorted(set(temps.tolist())):
                sel = temps == t
                for s_x, v_x in ((s_pred, v_pred), (s_old, v_old)):
                    hit = (s_x == s_true) & (v_x == v_true)
                    hits.setdefault(t, []).append(hit[sel].float().mean().item())
    return loss, hits


def export(mrp, out: Path, a, record, target, held_x):
    tensors = {}
    for k, v in mrp.state_dict().items():
        if k.startswith("rotary"):
            continue
        tensors["mrp." + k] = v.detach().contiguous()
    save_file(tensors, str(out / "mrp.safetensors"))
    # A reference the Rust tests recompute: one held-out state (four steps into a draft-free
    # decode of its block), its hidden states from the target, one MRP step on the state one
    # commit later; the top-5 corrected logits at the first three masked positions.
    x = held_x[:1]
    with torch.no_grad():
        states, hs, _, _ = rollout(target, x, a, torch.zeros(1))
        state = states[:, 5]
        hc = mrp(target.model.embed_tokens(state), hs[:, 4])
        lg = masked_logits(target, hs[:, 4] + hc, a.mask_id)[0]
        ids = torch.cat([x[0, :-a.block], states[0, 4]]).tolist()
    ref = []
    for s in [i for i in range(a.block) if int(state[0, i]) == a.mask_id][:3]:
        v, i = lg[s].topk(5)
        ref.append({"position": s, "ids": i.tolist(), "logits": [float(x) for x in v]})
    meta = {
        "format": FORMAT,
        "version": 1,
        "layers": a.layers,
        "parameters": sum(t.numel() for t in tensors.values()),
        "description": "MRP baseline (arXiv 2605.18817) trained by tools/mrp/train_mrp.py",
        "training": record,
        "reference": {"ids": ids, "next": states[0, 5].tolist(), "positions": ref},
    }
    (out / "mrp.json").write_text(json.dumps(meta, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps-ahead", type=int, default=2)
    ap.add_argument("--prefix-blocks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="text windows per step")
    ap.add_argument("--per-window", type=int, default=8,
                    help="training states drawn from each window's draft-free rollout")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperatures", default="0",
                    help="comma-separated decoding temperatures; each window's rollout draws one")
    ap.add_argument("--init", type=Path,
                    help="start from this mrp.safetensors (when OUT holds no checkpoint)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    target, cfg = load_target(a.target)
    a.block, a.mask_id = cfg["block_size"], cfg["mask_token_id"]
    tok = Tokenizer.from_file(str(a.target / "tokenizer.json"))
    ids = docs(a.data, tok)
    random.Random(a.seed).shuffle(ids)
    cut = max(1, len(ids) // 20)
    eot = cfg.get("eos_token_id", a.mask_id - 2)
    train = Windows(stream(ids[cut:], eot), a.block, a.prefix_blocks, random.Random(a.seed + 1))
    held_x = Windows(stream(ids[:cut], eot), a.block, a.prefix_blocks,
                     random.Random(a.seed + 2)).sample(96, a.mask_id)
    temps = [float(t) for t in a.temperatures.split(",")]
    if not temps or any(t < 0 or not math.isfinite(t) for t in temps):
        raise SystemExit(f"--temperatures: finite values >= 0, got {a.temperatures!r}")
    held_t = torch.tensor([temps[i % len(temps)] for i in range(held_x.shape[0])])
    held = examples(rollout(target, held_x, a, held_t), 4, a.steps_ahead,
                    random.Random(a.seed + 3))
    pick = random.Random(a.seed + 4)
    mrp = Mrp(target.config, a.layers)
    opt = torch.optim.AdamW(mrp.parameters(), lr=a.lr, weight_decay=0.0)
    a.out.mkdir(parents=True, exist_ok=True)
    ckpt = a.out / "mrp-train.pt"
    step, spent, log = 0, 0.0, []
    if ckpt.exists():
        st = torch.load(ckpt)
        mrp.load_state_dict(st["mrp"])
        opt.load_state_dict(st["opt"])
        step, spent, log = st["step"], st["spent"], st["log"]
        print(f"resumed at step {step} ({spent / 60:.1f} min)", flush=True)
    elif a.init:
        init = {k.removeprefix("mrp."): v for k, v in load_file(str(a.init)).items()}
        missing, unexpected = mrp.load_state_dict(init, strict=False)
        if unexpected or [m for m in missing if not m.startswith("rotary")]:
            raise SystemExit(f"--init {a.init}: missing {missing}, unexpected {unexpected}")
        print(f"initialised from {a.init}", flush=True)
    budget = a.minutes * 60
    total_est = max(1, int(budget / max(1e-3, spent / step))) if step else None
    t0 = time.time() - spent
    best = None
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * frac))
        mrp.train()
        window_t = torch.tensor([pick.choice(temps) for _ in range(a.batch)])
        roll = rollout(target, train.sample(a.batch, a.mask_id), a, window_t)
        loss, _ = run(target, mrp, examples(roll, a.per_window, a.steps_ahead, pick), a,
                      a.steps_ahead)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mrp.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.eval_every == 0 or time.time() - t0 >= budget:
            mrp.eval()
            with torch.no_grad():
                gen = torch.Generator().manual_seed(a.seed + 5)
                hl, hits = run(target, mrp, held, a, a.steps_ahead, gen)
            rec = {"step": step, "minutes": round((time.time() - t0) / 60, 2),
                   "train_kl": round(loss.item(), 4), "heldout_kl": round(hl.item(), 4),
                   "next_commit_mrp": {f"T{t:g}": [round(x, 4) for x in h[0::2]]
                                       for t, h in hits.items()},
                   "next_commit_stale": {f"T{t:g}": [round(x, 4) for x in h[1::2]]
                                         for t, h in hits.items()}}
            log.append(rec)
            print(json.dumps(rec), flush=True)
            if best is None or rec["heldout_kl"] < best["heldout_kl"]:
                best = rec
                record = {"log": log, "kept": rec, "args": {k: str(v) for k, v in vars(a).items()},
                          "total_steps_estimate": total_est}
                export(mrp, a.out, a, record, target, held_x)
            torch.save({"mrp": mrp.state_dict(), "opt": opt.state_dict(), "step": step,
                        "spent": time.time() - t0, "log": log}, ckpt)
    print(f"done: {step} steps; kept step {best['step'] if best else None}", flush=True)


if __name__ == "__main__":
    main()
