#!/usr/bin/env python3
"""Held-out bits per byte of a new and the current SDAR folder on the same text, and a verdict.

Estimator (the same for both models, defined for a masked block-diffusion LM with block L = 32):
the documents of a held-out set are encoded with the (shared) tokenizer, each followed by
<|endoftext|>, joined, and cut into non-overlapping 256-token windows; up to --max-windows evenly
spaced windows are scored. For every window, every 32-token block b and every mask count
k = 1..32, one uniformly random set M(b, k) of k positions of the block is masked (a seeded
random permutation per block: M(b, k) = its first k positions, so the sets are nested), and the
two-stream forward of common.sdar_loss (clean blocks < b visible, no other noise) gives the
cross-entropy CE_i of every masked token against the true one (full softmax over all ids). The
block's negative ELBO is

    NELBO(b) = sum_{k=1..32} (1/k) sum_{i in M(b,k)} CE_i

(the any-order / discrete-time masked-diffusion bound: exact in k, one Monte-Carlo mask set per
k); it bounds from above, in expectation, -log p(block | clean earlier blocks of the window).
Bits per byte = sum over windows and blocks of NELBO / ln 2 / the UTF-8 bytes of the scored tokens
(<|endoftext|> counts 0 bytes, its cost is included). Masks depend only on --seed and the
windows, so both models see the very same masked inputs; the paired per-window difference gives
a standard error. Also reported: the training objective (train.evaluate: t ~ U(0.02, 1) per
block, plain mean CE over masked tokens, fixed seed) on the same windows.

Sets: "mix" (--mix-docs: the GPU recipe's held-out documents) and "orig" (--orig-docs: the CPU
recipe's held-out split) where given. Verdict: replace = true only if the new model's bits per
byte is lower than the current one's on every set scored.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import BLOCK, ENDOFTEXT_ID, MASK_ID, VOCAB, sdar_loss, two_stream_mask  # noqa: E402
from export import load_folder  # noqa: E402
from train import evaluate  # noqa: E402

N = 256


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def byte_level_lengths(tok) -> np.ndarray:
    """UTF-8 bytes each id stands for, from the byte-level BPE alphabet (special ids: 0)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b) for b in printable} | {chr(256 + i) for i in range(256 - len(printable))}
    special = {"<|endoftext|>", "<|im_end|>", "<|MASK|>"}
    if hasattr(tok, "get_added_tokens_decoder"):
        special |= {t.content for t in tok.get_added_tokens_decoder().values()}
    out = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for tid in range(tok.get_vocab_size()):
        s = tok.id_to_token(tid)
        if s is None or s in special:
            continue
        assert all(c in alphabet for c in s), (tid, s)
        out[tid] = len(s)
    return out


def windows_of(tok, docs, nbytes, max_windows):
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    ids, src = [], []
    names = sorted({d["src"].split(":")[0] for d in docs})
    for d, e in zip(docs, encs):
        b = int(nbytes[e.ids].sum()) if e.ids else 0
        assert b == len(d["text"].encode("utf-8", "surrogatepass")), (d["src"], b)  # lossless byte count
        ids.extend(e.ids + [ENDOFTEXT_ID])
        src.extend([names.index(d["src"].split(":")[0])] * (len(e.ids) + 1))
    ids, src = np.asarray(ids, np.int64), np.asarray(src, np.int64)
    nwin = ids.size // N
    pick = np.unique(np.linspace(0, nwin - 1, min(max_windows, nwin)).round().astype(int))
    x = np.stack([ids[i * N:(i + 1) * N] for i in pick])
    s = np.stack([src[i * N:(i + 1) * N] for i in pick])
    return torch.from_numpy(x), torch.from_numpy(s), names, int(ids.size)


@torch.no_grad()
def nelbo(model, x, src, nsrc, ranks, device, batch):
    """Per-window NELBO (nats) and per-source NELBO sums; ranks [W, nb, L] = random permutation ranks."""
    model.eval()
    W = x.shape[0]
    L = BLOCK
    mask4d = two_stream_mask(N, L).to(device)
    items = [(w, k) for w in range(W) for k in range(1, L + 1)]
    per_win = torch.zeros(W, dtype=torch.float64)
    per_src = torch.zeros(nsrc, dtype=torch.float64)
    for i in range(0, len(items), batch):
        it = items[i:i + batch]
        w = torch.tensor([a for a, _ in it])
        k = torch.tensor([b for _, b in it])
        x0 = x[w]
        masked = (ranks[w] < k[:, None, None]).reshape(len(it), N)
        xt = torch.where(masked, torch.full_like(x0, MASK_ID), x0)
        ce, _ = sdar_loss(model, x0.to(device), xt.to(device), masked.to(device), mask4d, reduction="none")
        ce = ce.double().cpu()
        row = torch.arange(len(it))[:, None].expand(len(it), N)[masked]   # item of each masked token
        wce = ce / k[row].double()
        per_win.index_add_(0, w[row], wce)
        per_src.index_add_(0, src[w][masked], wce)
    return per_win, per_src


def score_set(name, docs, tok, nbytes, models, a, device):
    x, src, names, total_tokens = windows_of(tok, docs, nbytes, a.max_windows)
    W = x.shape[0]
    g = torch.Generator().manual_seed(a.seed)
    ranks = torch.rand(W, N // BLOCK, BLOCK, generator=g).argsort(-1).argsort(-1)
    byt = torch.from_numpy(nbytes)[x]
    bytes_total = int(byt.sum())
    bytes_src = torch.zeros(len(names), dtype=torch.int64).index_add_(0, src.reshape(-1), byt.reshape(-1))
    out = {"documents": len(docs), "tokens_in_set": total_tokens, "windows": W, "tokens_scored": W * N,
           "bytes_scored": bytes_total, "bytes_scored_by_source": dict(zip(names, bytes_src.tolist())),
           "models": {}}
    per_win = {}
    for tag, (model, _) in models.items():
        t = time.time()
        pw, ps = nelbo(model, x, src, len(names), ranks, device, a.batch)
        obj, nmask = evaluate(model, x, two_stream_mask(N, BLOCK).to(device), BLOCK, a.batch, seed=777,
                              device=device)
        per_win[tag] = pw
        bits = float(pw.sum()) / math.log(2)
        out["models"][tag] = {
            "bits_per_byte": bits / bytes_total,
            "nelbo_nats_per_token": float(pw.sum()) / (W * N),
            "bits_per_byte_by_source": {n: (float(ps[j]) / math.log(2) / int(bytes_src[j])) if bytes_src[j] else None
                                        for j, n in enumerate(names)},
            "objective_ce_nats": obj, "objective_masked_tokens": nmask,
            "seconds": round(time.time() - t, 1),
        }
        log(f"[{name}] {tag}: {bits / bytes_total:.4f} bits/byte, NELBO {float(pw.sum()) / (W * N):.4f} "
            f"nats/token, objective CE {obj:.4f} ({W} windows, {time.time() - t:.1f} s)")
    if "new" in per_win and "old" in per_win:
        d = (per_win["new"] - per_win["old"]) / math.log(2) / (byt.sum(1).double().clamp(min=1))
        wts = byt.sum(1).double() / bytes_total
        out["paired_bits_per_byte_diff_new_minus_old"] = {
            "value": out["models"]["new"]["bits_per_byte"] - out["models"]["old"]["bits_per_byte"],
            "windows_new_better": int((per_win["new"] < per_win["old"]).sum()),
            # standard error of the byte-weighted mean of per-window differences
            "se": float(torch.sqrt(W / max(W - 1, 1) * (wts ** 2 * (d - (d * wts).sum()) ** 2).sum())),
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", required=True)
    ap.add_argument("--old", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))),
                                                  "models", "sdar-tiny-code"))
    ap.add_argument("--mix-docs", default=None)
    ap.add_argument("--orig-docs", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-windows", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="(window, k) items per forward")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA device")
    from tokenizers import Tokenizer

    toks = {t: Tokenizer.from_file(os.path.join(d, "tokenizer.json")) for t, d in (("new", a.new), ("old", a.old))}
    if toks["new"].get_vocab(with_added_tokens=True) != toks["old"].get_vocab(with_added_tokens=True):
        raise SystemExit("the two folders have different tokenizers: this comparison needs the same one")
    tok = toks["new"]
    assert tok.get_vocab_size() == VOCAB
    nbytes = byte_level_lengths(tok)
    models = {}
    for tag, d in (("new", a.new), ("old", a.old)):
        m, cfg = load_folder(d)  # float32 weights (bf16 ones widened), eager attention
        m.to(device)
        models[tag] = (m, cfg)
        log(f"{tag}: {d}: {sum(p.numel() for p in m.parameters())} parameters, stored as "
            f"{cfg.get('torch_dtype')}, hidden {cfg['hidden_size']} x {cfg['num_hidden_layers']} layers")
    res = {"estimator": __doc__.split("Sets:")[0].strip(), "seed": a.seed, "max_windows": a.max_windows,
           "device": str(device), "torch": torch.__version__,
           "new": {"folder": a.new, "parameters": sum(p.numel() for p in models["new"][0].parameters())},
           "old": {"folder": a.old, "parameters": sum(p.numel() for p in models["old"][0].parameters())},
           "sets": {}}
    for name, path in (("mix", a.mix_docs), ("orig", a.orig_docs)):
        if not path or not os.path.exists(path):
            log(f"[{name}] no documents ({path}); skipped")
            continue
        with open(path, encoding="utf-8") as fh:
            docs = [json.loads(x) for x in fh]
        res["sets"][name] = score_set(name, docs, tok, nbytes, models, a, device)
        with open(a.out, "w") as fh:  # partial result as soon as a set is done
            json.dump(res, fh, indent=1)
    better = {n: s["models"]["new"]["bits_per_byte"] < s["models"]["old"]["bits_per_byte"]
              for n, s in res["sets"].items()}
    res["new_better_on"] = better
    res["replace"] = bool(better) and all(better.values())
    res["reason"] = ("no held-out set scored" if not better else
                     "; ".join(f"{n}: new {s['models']['new']['bits_per_byte']:.4f} vs current "
                               f"{s['models']['old']['bits_per_byte']:.4f} bits/byte"
                               for n, s in res["sets"].items()))
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    log(f"replace: {str(res['replace']).lower()} ({res['reason']})")


if __name__ == "__main__":
    sys.exit(main())
