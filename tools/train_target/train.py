#!/usr/bin/env python3
"""SDAR-style (two-stream, BD3-LM) block-diffusion training of a tiny Qwen3ForCausalLM on CPU.

x0: N=256 clean tokens. Per block of L=32: t ~ U(0.02, 1), each token masked with prob t -> xt.
Input concat(xt, x0), positions concat(0..N-1, 0..N-1), 4D additive mask (see common.two_stream_mask).
Loss: CE of the noisy-stream logits at masked positions vs x0 (no shift), plain mean over masked
tokens (NO 1/t weighting). Validation: same objective, fixed seed masks, fixed windows of val.bin.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BLOCK, VOCAB, block_causal_mask, make_model, noise, sdar_loss, two_stream_mask  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def verify_mask_used(model, N, L, seed=0):
    """Check transformers really applies our 4D mask (eager attention) on a random model state."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, VOCAB - 3, (1, N), generator=g)
    xt, masked, _ = noise(x0, L, g)
    m2 = two_stream_mask(N, L)
    ids = torch.cat([xt, x0], 1)
    pos = torch.arange(N).repeat(2)[None]
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=m2, position_ids=pos, use_cache=False).logits[0]
        # clean stream == block-causal run on x0 alone
        hc = model(input_ids=x0, attention_mask=block_causal_mask(N, L), position_ids=pos[:, :N],
                   use_cache=False).logits[0]
        d_clean = (h[N:] - hc).abs().max().item()
        # noisy stream of block b == block-causal run on x0[:bL] + xt[bL:(b+1)L]
        d_noisy = 0.0
        for b in (0, 3, N // L - 1):
            seq = torch.cat([x0[:, : b * L], xt[:, b * L:(b + 1) * L]], 1)
            n = seq.shape[1]
            hn = model(input_ids=seq, attention_mask=block_causal_mask(n, L),
                       position_ids=torch.arange(n)[None], use_cache=False).logits[0]
            d_noisy = max(d_noisy, (h[b * L:(b + 1) * L] - hn[b * L:]).abs().max().item())
        # without our mask (default causal) the noisy stream must differ
        hd = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        d_default = (h[:N] - hd[:N]).abs().max().item()
    ok = d_clean < 1e-4 and d_noisy < 1e-4 and d_default > 1e-3
    log(f"4D-mask check: clean-stream diff {d_clean:.2e}, noisy-stream diff {d_noisy:.2e}, "
        f"vs default-mask diff {d_default:.2e} -> {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit("transformers did not use the 4D mask as expected")
    return dict(clean_diff=d_clean, noisy_diff=d_noisy, default_mask_diff=d_default)


@torch.no_grad()
def evaluate(model, val_x, mask4d, L, batch, seed=777):
    model.eval()
    g = torch.Generator().manual_seed(seed)
    tot, cnt = 0.0, 0
    for i in range(0, val_x.shape[0], batch):
        x0 = val_x[i:i + batch]
        xt, masked, _ = noise(x0, L, g)
        loss, n = sdar_loss(model, x0, xt, masked, mask4d)
        tot += loss.item() * n
        cnt += n
    model.train()
    return tot / cnt, cnt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-minutes", type=float, default=45.0, help="wall-clock budget of the training loop")
    ap.add_argument("--smoke", action="store_true", help="~2 minute run, logs/ckpt under $TMPDIR/sdar_smoke")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--val-seqs", type=int, default=64)
    ap.add_argument("--final-val-seqs", type=int, default=256)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--ckpt", default=None)
    a = ap.parse_args(argv)
    if a.smoke:
        a.max_minutes = min(a.max_minutes, 1.5)
        a.eval_every, a.val_seqs, a.final_val_seqs, a.warmup = 10, 16, 32, 5
    smoke = os.path.join(tempfile.gettempdir(), "sdar_smoke")
    a.log_dir = a.log_dir or (os.path.join(smoke, "logs") if a.smoke else os.path.join(HERE, "logs"))
    a.ckpt = a.ckpt or (os.path.join(smoke, "ckpt") if a.smoke else os.path.join(HERE, "ckpt"))
    os.makedirs(a.log_dir, exist_ok=True)
    os.makedirs(a.ckpt, exist_ok=True)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    random.seed(a.seed)
    t_start = time.time()
    N, L = a.seq, BLOCK
    assert N % L == 0

    train = np.fromfile(os.path.join(a.data, "train.bin"), dtype=np.uint16).astype(np.int64)
    val = np.fromfile(os.path.join(a.data, "val.bin"), dtype=np.uint16).astype(np.int64)
    # fixed validation windows: evenly spaced, non-overlapping where possible
    nwin = val.size // N
    all_val = torch.from_numpy(val[: nwin * N].reshape(nwin, N))
    pick = np.linspace(0, nwin - 1, min(a.val_seqs, nwin)).round().astype(int)
    pick_final = np.linspace(0, nwin - 1, min(a.final_val_seqs, nwin)).round().astype(int)
    val_x, val_final = all_val[pick], all_val[pick_final]

    # unigram baseline (add-one smoothed training unigram)
    counts = np.bincount(train, minlength=VOCAB).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    uni_all = float(-logp[val].mean())
    uni_win = float(-logp[val_x.numpy().ravel()].mean())
    uni_final = float(-logp[val_final.numpy().ravel()].mean())
    log(f"train tokens {train.size}, val tokens {val.size}; val windows {len(pick)} (periodic), "
        f"{len(pick_final)} (final)")
    log(f"unigram baseline CE (nats): all val tokens {uni_all:.4f}; periodic windows {uni_win:.4f}; "
        f"final windows {uni_final:.4f}")

    model = make_model()
    n_params = sum(p.numel() for p in model.parameters())  # tied: counted once
    log(f"parameters: {n_params} (unique; embedding {model.model.embed_tokens.weight.numel()})")
    check = verify_mask_used(model, N, L)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    mask4d = two_stream_mask(N, L)
    g_noise = torch.Generator().manual_seed(a.seed + 1)
    rng = np.random.default_rng(a.seed + 2)
    budget = a.max_minutes * 60.0

    tr_f = open(os.path.join(a.log_dir, "train_log.csv"), "w", newline="")
    va_f = open(os.path.join(a.log_dir, "val_log.csv"), "w", newline="")
    tr_w, va_w = csv.writer(tr_f), csv.writer(va_f)
    tr_w.writerow(["step", "tokens_seen", "lr", "train_loss", "elapsed_s"])
    va_w.writerow(["step", "tokens_seen", "val_loss", "masked_tokens", "elapsed_s"])

    def save(step):
        torch.save({"model": model.state_dict(), "step": step}, os.path.join(a.ckpt, "model.pt"))

    v0, _ = evaluate(model, val_x, mask4d, L, a.batch)
    log(f"step 0 val {v0:.4f}")
    va_w.writerow([0, 0, f"{v0:.5f}", "", f"{time.time() - t_start:.1f}"])
    t_loop = time.time()
    step, recent, last_val = 0, [], v0
    model.train()
    while True:
        elapsed = time.time() - t_loop
        if elapsed >= budget:
            break
        progress = elapsed / budget
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = rng.integers(0, train.size - N, size=a.batch)
        x0 = torch.from_numpy(np.stack([train[s:s + N] for s in starts]))
        xt, masked, _ = noise(x0, L, g_noise)
        loss, _ = sdar_loss(model, x0, xt, masked, mask4d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent.append(loss.item())
        if step % a.log_every == 0:
            tl = sum(recent) / len(recent)
            recent = []
            el = time.time() - t_start
            tr_w.writerow([step, step * a.batch * N, f"{lr:.3e}", f"{tl:.5f}", f"{el:.1f}"])
            tr_f.flush()
            log(f"step {step} lr {lr:.2e} train {tl:.4f} ({(time.time() - t_loop) / step:.2f} s/step)")
        if step % a.eval_every == 0:
            last_val, _ = evaluate(model, val_x, mask4d, L, a.batch)
            va_w.writerow([step, step * a.batch * N, f"{last_val:.5f}", "", f"{time.time() - t_start:.1f}"])
            va_f.flush()
            log(f"step {step} val {last_val:.4f} (unigram {uni_win:.4f})")
            save(step)
    loop_s = time.time() - t_loop
    save(step)
    # final numbers: train loss = mean of last 20 steps; val on the periodic and the larger final set
    v_per, _ = evaluate(model, val_x, mask4d, L, a.batch)
    v_fin, n_fin = evaluate(model, val_final, mask4d, L, a.batch, seed=778)
    va_w.writerow([step, step * a.batch * N, f"{v_per:.5f}", "", f"{time.time() - t_start:.1f}"])
    tr_f.close()
    va_f.close()
    rows = list(csv.DictReader(open(os.path.join(a.log_dir, "train_log.csv"))))
    last = [float(r["train_loss"]) for r in rows[-4:]]
    summary = dict(
        parameters=n_params, steps=step, batch=a.batch, seq=N, block=L,
        tokens_seen_clean=step * a.batch * N, tokens_processed_two_stream=2 * step * a.batch * N,
        loop_seconds=round(loop_s, 1), total_seconds=round(time.time() - t_start, 1),
        s_per_step=round(loop_s / max(step, 1), 3),
        train_loss_last20=(sum(last) / len(last)) if last else None,
        val_loss_periodic_set=v_per, val_windows_periodic=len(pick),
        val_loss_final_set=v_fin, val_windows_final=len(pick_final), val_masked_tokens_final=n_fin,
        val_loss_step0=v0,
        unigram_ce_all_val=uni_all, unigram_ce_periodic_windows=uni_win, unigram_ce_final_windows=uni_final,
        loss_weighting="plain mean over masked tokens (no 1/t weighting)",
        mask_check=check, args=vars(a), torch=torch.__version__,
    )
    with open(os.path.join(a.log_dir, "train_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    log("summary " + json.dumps({k: v for k, v in summary.items() if k not in ("args", "mask_check")}))


if __name__ == "__main__":
    sys.exit(main())
