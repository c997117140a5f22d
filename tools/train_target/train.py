#!/usr/bin/env python3
"""SDAR-style (two-stream, BD3-LM) block-diffusion training of a tiny Qwen3ForCausalLM on CPU.
(The GPU recipe, tools/train_target/gpu/, runs the same loop with --device cuda --amp bf16
--attn sdpa --model '{...}'; the defaults are the CPU recipe and reproduce it unchanged.)

x0: N=256 clean tokens. Per block of L=32: t ~ U(0.02, 1), each token masked with prob t -> xt.
Input concat(xt, x0), positions concat(0..N-1, 0..N-1), 4D additive mask (see common.two_stream_mask).
Loss: CE of the noisy-stream logits at masked positions vs x0 (no shift), plain mean over masked
tokens (NO 1/t weighting). Validation: same objective, fixed seed masks, fixed windows of val.bin.
"""
from __future__ import annotations

import argparse
import contextlib
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
from common import BLOCK, QWEN3_FIELDS, VOCAB, block_causal_mask, make_model, model_fields, noise, sdar_loss, two_stream_mask  # noqa: E402

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


def check_attn_matches_eager(model, fields, N, L, seed=0):
    """For a non-eager attention implementation: the two-stream logits must equal eager's."""
    ref = make_model(fields, attn="eager")
    ref.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, VOCAB - 3, (2, N), generator=g)
    xt, _, _ = noise(x0, L, g)
    ids = torch.cat([xt, x0], 1)
    pos = torch.arange(N).repeat(2)[None].expand(2, 2 * N)
    m2 = two_stream_mask(N, L).expand(2, 1, 2 * N, 2 * N)
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=m2, position_ids=pos, use_cache=False).logits
        b = ref(input_ids=ids, attention_mask=m2, position_ids=pos, use_cache=False).logits
    d = (a - b).abs().max().item()
    log(f"{model.config._attn_implementation} vs eager two-stream logits: max diff {d:.2e} -> "
        f"{'OK' if d < 1e-4 else 'FAILED'}")
    if not d < 1e-4:
        raise SystemExit(f"attention implementation {model.config._attn_implementation} does not apply "
                         "the 4D mask like eager; rerun with --attn eager")
    return d


def autocast(device, amp):
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(model, val_x, mask4d, L, batch, seed=777, device=None, amp="none"):
    """Masks drawn on the CPU with a fixed seed (same masks whatever the device)."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    tot, cnt = 0.0, 0
    for i in range(0, val_x.shape[0], batch):
        x0 = val_x[i:i + batch]
        xt, masked, _ = noise(x0, L, g)
        if device is not None and device.type != "cpu":
            x0, xt, masked = x0.to(device), xt.to(device), masked.to(device)
        with autocast(mask4d.device, amp):
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
    # GPU recipe (defaults = CPU recipe)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none", help="bf16 autocast")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
    ap.add_argument("--model", default="", help="JSON overrides of common.QWEN3_FIELDS (size only)")
    ap.add_argument("--max-params", type=int, default=0, help="refuse a model with more parameters")
    ap.add_argument("--eval-every-s", type=float, default=0.0,
                    help="validate every this many seconds of training instead of --eval-every steps")
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
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device cuda but torch {torch.__version__} sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    fields = model_fields(**json.loads(a.model)) if a.model else dict(QWEN3_FIELDS)
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

    model = make_model(fields, attn=a.attn)
    n_params = sum(p.numel() for p in model.parameters())  # tied: counted once
    log(f"parameters: {n_params} (unique; embedding {model.model.embed_tokens.weight.numel()})")
    if a.max_params and n_params > a.max_params:
        raise SystemExit(f"{n_params} parameters > --max-params {a.max_params}")
    check = verify_mask_used(model, N, L)  # on the CPU, float32, before any move
    if a.attn != "eager":
        check["attn_vs_eager_diff"] = check_attn_matches_eager(model, fields, N, L)
    model.to(device)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if device.type == "cuda":
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    else:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    mask4d = two_stream_mask(N, L).to(device)
    if device.type == "cpu":
        g_noise = torch.Generator().manual_seed(a.seed + 1)
    else:  # noise drawn on the device (common.noise uses x0's device)
        g_noise = torch.Generator(device=device).manual_seed(a.seed + 1)
        train_dev = torch.from_numpy(train).to(device)
        offs = torch.arange(N, device=device)
    rng = np.random.default_rng(a.seed + 2)
    budget = a.max_minutes * 60.0

    tr_f = open(os.path.join(a.log_dir, "train_log.csv"), "w", newline="")
    va_f = open(os.path.join(a.log_dir, "val_log.csv"), "w", newline="")
    tr_w, va_w = csv.writer(tr_f), csv.writer(va_f)
    tr_w.writerow(["step", "tokens_seen", "lr", "train_loss", "elapsed_s"])
    va_w.writerow(["step", "tokens_seen", "val_loss", "masked_tokens", "elapsed_s"])

    def save(step):
        ck = {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "step": step}
        if a.model:
            ck["fields"] = fields
        tmp = os.path.join(a.ckpt, "model.pt.tmp")
        torch.save(ck, tmp)
        os.replace(tmp, os.path.join(a.ckpt, "model.pt"))

    ev = dict(device=device, amp=a.amp)
    v0, _ = evaluate(model, val_x, mask4d, L, a.batch, **ev)
    log(f"step 0 val {v0:.4f}")
    va_w.writerow([0, 0, f"{v0:.5f}", "", f"{time.time() - t_start:.1f}"])
    t_loop = time.time()
    t_eval = t_loop
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
        if device.type == "cpu":
            x0 = torch.from_numpy(np.stack([train[s:s + N] for s in starts]))
        else:
            x0 = train_dev[torch.from_numpy(starts).to(device)[:, None] + offs]
        xt, masked, _ = noise(x0, L, g_noise)
        with autocast(device, a.amp):
            loss, _ = sdar_loss(model, x0, xt, masked, mask4d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent.append(loss.detach())
        if step % a.log_every == 0:
            tl = sum(float(x) for x in recent) / len(recent)
            recent = []
            el = time.time() - t_start
            tr_w.writerow([step, step * a.batch * N, f"{lr:.3e}", f"{tl:.5f}", f"{el:.1f}"])
            tr_f.flush()
            log(f"step {step} lr {lr:.2e} train {tl:.4f} ({(time.time() - t_loop) / step:.2f} s/step)")
        if (time.time() - t_eval >= a.eval_every_s) if a.eval_every_s > 0 else (step % a.eval_every == 0):
            t_eval = time.time()
            last_val, _ = evaluate(model, val_x, mask4d, L, a.batch, **ev)
            va_w.writerow([step, step * a.batch * N, f"{last_val:.5f}", "", f"{time.time() - t_start:.1f}"])
            va_f.flush()
            log(f"step {step} val {last_val:.4f} (unigram {uni_win:.4f})")
            save(step)
    loop_s = time.time() - t_loop
    save(step)
    # final numbers: train loss = mean of last 20 steps; val on the periodic and the larger final set
    v_per, _ = evaluate(model, val_x, mask4d, L, a.batch, **ev)
    v_fin, n_fin = evaluate(model, val_final, mask4d, L, a.batch, seed=778, **ev)
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
    if a.model:  # GPU recipe: record the model shape and where it ran
        import transformers
        summary.update(model_fields=fields, transformers=transformers.__version__,
                       device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       clean_tokens_per_s=round(step * a.batch * N / max(loop_s, 1e-9)))
    with open(os.path.join(a.log_dir, "train_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    log("summary " + json.dumps({k: v for k, v in summary.items() if k not in ("args", "mask_check")}))


if __name__ == "__main__":
    sys.exit(main())
