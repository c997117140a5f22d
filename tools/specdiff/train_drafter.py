#!/usr/bin/env python3
"""Trains SpecDiff-2's masked-diffusion drafter for a causal target, with streak distillation,
and writes a drafter folder that `spot_models::MaskedDrafter` loads.

The drafter is the target's first `--layers` layers, its final norm and its (tied, frozen)
embeddings, plus a learned mask embedding. Layout (`docs/specdiff.md`): the context is read
causally; drafted position 0 is predicted from the last context token's hidden state, position
`i > 0` from the `i`-th of `γ - 1` mask tokens after the context, which attend to the context
and to each other. Each training sequence (a teacher continuation from teacher.py) is read
once causally and carries `--blocks` mask blocks at random cut points, each attending to the
text before its cut, so one forward trains many blocks.

Loss: streak distillation. Within a block the log-probability of the teacher's token at
drafted position `i` is weighted by the drafter's (detached) probability of having drafted
positions `0..i-1` right, `Π_{k<i} q(x_k)`, so training spends itself where a streak can
still grow; plus the causal next-token loss over the continuation (`--ar-weight`). With
`--no-streak`, every position weighs 1 (the ablation).

Teacher data: teacher.py's JSONL, or the lines `spot generate --json` writes (the lookup
store's `specdiff-lookup.jsonl` from tools/specdiff/setup_lookup.sh serves as both).

Prints a held-out acceptance curve (share of blocks whose greedy draft matches the teacher on
at least `i` leading tokens) every `--eval-every` steps, and resumes from `--out/train.pt`.

    python tools/specdiff/train_drafter.py --target ~/.cache/spot-smollm2 \
        --teacher work/teacher.jsonl --out work/drafter --layers 4 --minutes 30
"""

import argparse
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

DRAFTER_FILE = "specdiff-drafter.json"


def teacher_row(line: str, where: str):
    """A teacher continuation: teacher.py's `{"id", "ids", "prompt_len"}`, or a line `spot
    generate --json` writes (`prompt_ids` and `tokens`; the lookup store's file), which gets
    its own `id` or else `where` (file name and line number)."""
    r = json.loads(line)
    if "ids" in r:
        return r
    return {"id": r.get("id") or where, "ids": r["prompt_ids"] + r["tokens"], "prompt_len": len(r["prompt_ids"])}


def load_teacher(paths):
    rows = []
    for path in paths:
        with path.open() as f:
            rows += [teacher_row(line, f"{path.name}:{k}") for k, line in enumerate(f) if line.strip()]
    return [r for r in rows if len(r["ids"]) - r["prompt_len"] >= 4]


def split(rows, frac: float, seed: int):
    ids = sorted({r["id"] for r in rows})
    rng = random.Random(seed)
    rng.shuffle(ids)
    held = set(ids[: max(1, int(len(ids) * frac))])
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


class Drafter(torch.nn.Module):
    def __init__(self, target: Path, layers: int, mask_id: int):
        super().__init__()
        cfg = AutoConfig.from_pretrained(target)
        cfg.num_hidden_layers = layers
        self.lm = AutoModelForCausalLM.from_pretrained(
            target, config=cfg, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.cfg = cfg
        self.mask_id = mask_id
        emb = self.lm.get_input_embeddings().weight
        emb.requires_grad_(False)
        self.mask_vec = torch.nn.Parameter(emb[mask_id].detach().clone())

    def hidden(self, ids, is_mask, pos, mask4d):
        x = self.lm.get_input_embeddings()(ids)
        x = torch.where(is_mask[..., None], self.mask_vec.expand_as(x), x)
        out = self.lm.model(inputs_embeds=x, position_ids=pos, attention_mask=mask4d)
        return out.last_hidden_state

    def logits(self, h):
        return self.lm.lm_head(h)


def example(r, gamma: int, blocks: int, mask_id: int, rng: random.Random):
    """One training sequence: tokens, mask flags, positions, a 4D additive mask and the
    blocks' (cut, rows) for the loss."""
    s = r["ids"]
    n, p0 = len(s), r["prompt_len"]
    cuts = sorted(rng.sample(range(p0, n - 1), min(blocks, n - 1 - p0)))
    toks, pos, is_mask = list(s), list(range(n)), [False] * n
    spans = []
    for c in cuts:
        start = len(toks)
        m = gamma - 1
        toks += [mask_id] * m
        pos += list(range(c, c + m))
        is_mask += [True] * m
        spans.append((c, start, m))
    t = len(toks)
    allow = torch.zeros(t, t, dtype=torch.bool)
    allow[:n, :n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for c, start, m in spans:
        allow[start : start + m, :c] = True
        allow[start : start + m, start : start + m] = True
    mask4d = torch.zeros(1, 1, t, t)
    mask4d.masked_fill_(~allow, float("-inf"))
    return (
        torch.tensor([toks]),
        torch.tensor([is_mask]),
        torch.tensor([pos]),
        mask4d,
        spans,
    )


def block_logprobs(model, r, spans, h, gamma):
    """Per block: log q of the teacher's tokens at drafted positions 0..γ-1 (those inside the
    sequence), and the greedy hits."""
    s = torch.tensor(r["ids"])
    n = len(r["ids"])
    rows, targets, owner = [], [], []
    for b, (c, start, m) in enumerate(spans):
        # Position 0: the causal row c - 1 predicts token c.
        cand = [(c - 1, c)] + [(start + i, c + 1 + i) for i in range(m)]
        for i, (row, tgt) in enumerate(cand):
            if tgt < n:
                rows.append(row)
                targets.append(tgt)
                owner.append((b, i))
    hr = h[0, rows]
    logits = model.logits(hr).float()
    lp = torch.log_softmax(logits, -1)
    tgt_ids = s[targets]
    picked = lp.gather(1, tgt_ids[:, None])[:, 0]
    hit = logits.argmax(-1) == tgt_ids
    per = [[None] * gamma for _ in spans]
    hits = [[None] * gamma for _ in spans]
    for k, (b, i) in enumerate(owner):
        per[b][i] = picked[k]
        hits[b][i] = bool(hit[k])
    return per, hits


def streak_loss(per, streak: bool):
    total, count = 0.0, 0
    for blk in per:
        w = torch.tensor(1.0)
        for lp in blk:
            if lp is None:
                break
            total = total - (w * lp if streak else lp)
            count += 1
            if streak:
                w = w * lp.detach().exp()
    return total / max(count, 1)


def ar_loss(model, r, h):
    s = torch.tensor(r["ids"])
    p0, n = r["prompt_len"], len(r["ids"])
    rows = torch.arange(p0 - 1, n - 1)
    logits = model.logits(h[0, rows]).float()
    return F.cross_entropy(logits, s[p0:n])


def evaluate(model, rows, gamma, blocks, mask_id, seed):
    rng = random.Random(seed)
    curve = [0] * (gamma + 1)
    nblocks = 0
    model.eval()
    with torch.no_grad():
        for r in rows:
            ids, is_mask, pos, m4, spans = example(r, gamma, blocks, mask_id, rng)
            h = model.hidden(ids, is_mask, pos, m4)
            _, hits = block_logprobs(model, r, spans, h, gamma)
            for blk in hits:
                k = 0
                while k < gamma and blk[k]:
                    k += 1
                for i in range(k + 1):
                    curve[i] += 1
                nblocks += 1
    model.train()
    return [c / max(nblocks, 1) for c in curve[1:]], nblocks


def export(model, target: Path, out: Path, layers: int, mask_id: int, note: str):
    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in model.lm.state_dict().items():
        if k == "lm_head.weight" and model.cfg.tie_word_embeddings:
            continue
        sd[k] = v.detach().clone().contiguous()
    sd["model.embed_tokens.weight"][mask_id] = model.mask_vec.detach()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((target / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        if (target / f).exists():
            shutil.copy(target / f, out / f)
    (out / DRAFTER_FILE).write_text(
        json.dumps(
            {"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": mask_id, "description": note},
            indent=2,
        )
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--teacher", type=Path, nargs="+", required=True,
                    help="teacher.py output or `spot generate --json` lines (several files allowed)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--mask-id", type=int, default=16, help="SmolLM2's <empty_output>")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--max-steps", type=int, default=1_000_000)
    ap.add_argument("--ar-weight", type=float, default=0.5)
    ap.add_argument("--no-streak", action="store_true")
    ap.add_argument("--heldout", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rows = load_teacher(a.teacher)
    train, held = split(rows, a.heldout, a.seed)
    print(f"{len(train)} training and {len(held)} held-out continuations", flush=True)
    model = Drafter(a.target, a.layers, a.mask_id)
    params = [p for p in model.parameters() if p.requires_grad]
    print(f"drafter: {a.layers} layers, {sum(p.numel() for p in model.parameters()):,} parameters "
          f"({sum(p.numel() for p in params):,} trained)", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    ckpt = a.out / "train.pt"
    step = 0
    if ckpt.exists():
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print(f"resumed at step {step}", flush=True)
    curve, nb = evaluate(model, held, a.gamma, a.blocks, a.mask_id, 1)
    print(f"step {step}: held-out acceptance (>= 1, 2, 4, 8 tokens) "
          f"{curve[0]:.3f} {curve[1]:.3f} {curve[3]:.3f} {curve[7]:.3f} over {nb} blocks", flush=True)
    rng = random.Random(a.seed + step)
    start, span = step, max(1, a.max_steps - step)
    t0 = time.time()
    deadline = t0 + a.minutes * 60
    running = None
    while step < a.max_steps and time.time() < deadline:
        # Cosine decay over the budget: the time, or the steps when --max-steps is the tighter
        # one (equal step counts make runs on a shared CPU comparable).
        frac = min(1.0, max((time.time() - t0) / (a.minutes * 60), (step - start) / span))
        for g in opt.param_groups:
            g["lr"] = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        opt.zero_grad()
        acc = 0.0
        for _ in range(a.accum):
            r = rng.choice(train)
            ids, is_mask, pos, m4, spans = example(r, a.gamma, a.blocks, a.mask_id, rng)
            h = model.hidden(ids, is_mask, pos, m4)
            per, _ = block_logprobs(model, r, spans, h, a.gamma)
            loss = streak_loss(per, not a.no_streak) + a.ar_weight * ar_loss(model, r, h)
            (loss / a.accum).backward()
            acc += loss.item() / a.accum
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        running = acc if running is None else 0.98 * running + 0.02 * acc
        if step % 20 == 0:
            print(f"step {step}: loss {running:.4f}, {time.time() - t0:.0f} s", flush=True)
        if step % a.eval_every == 0:
            curve, nb = evaluate(model, held, a.gamma, a.blocks, a.mask_id, 1)
            print(f"step {step}: held-out acceptance (>= 1, 2, 4, 8 tokens) "
                  f"{curve[0]:.3f} {curve[1]:.3f} {curve[3]:.3f} {curve[7]:.3f}", flush=True)
            a.out.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    curve, nb = evaluate(model, held, a.gamma, a.blocks, a.mask_id, 1)
    print("held-out acceptance curve (share of blocks with >= i accepted tokens, i = 1..γ): "
          + " ".join(f"{c:.3f}" for c in curve), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    note = (f"SpecDiff-2 drafter: first {a.layers} layers of {a.target.name}, "
            f"{'streak distillation' if not a.no_streak else 'plain cross-entropy'}, {step} steps")
    export(model, a.target, a.out, a.layers, a.mask_id, note)
    print(f"wrote {a.out}", flush=True)


if __name__ == "__main__":
    main()
