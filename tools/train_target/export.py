#!/usr/bin/env python3
"""Export a train.py checkpoint as a Hugging Face SDAR folder (default models/sdar-tiny-code/).

Writes config.json (SDARForCausalLM / model_type sdar, Qwen3 fields, block_size, mask id),
generation_config.json, model.safetensors (float32, HF Qwen3 names, no lm_head.weight: tied),
tokenizer.json and README.md; then reloads the folder into Qwen3ForCausalLM and checks the
logits equal the checkpoint's. `--readme-only` just regenerates README.md from the logs.
GPU recipe: the checkpoint carries its model shape ("fields"); `--dtype bfloat16` stores bf16
weights and the reload check then compares with the checkpoint rounded to bf16; `--no-readme`
leaves the model card to tools/train_target/gpu/card.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BLOCK, ENDOFTEXT_ID, IM_END_ID, MASK_ID, QWEN3_FIELDS, block_causal_mask, make_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def sdar_config(fields: dict | None = None, dtype: str = "float32") -> dict:
    c = {"architectures": ["SDARForCausalLM"], "model_type": "sdar"}
    c.update(QWEN3_FIELDS if fields is None else fields)
    c.update({
        "attention_dropout": 0.0,
        "block_size": BLOCK,
        "mask_token_id": MASK_ID,
        "eos_token_id": ENDOFTEXT_ID,
        "bos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": dtype,
        "use_cache": False,
        "use_sliding_window": False,
    })
    return c


def load_folder(folder: str):
    """Qwen3ForCausalLM (float32, eager) from an SDAR folder; asserts every weight is loaded."""
    with open(os.path.join(folder, "config.json")) as fh:
        c = json.load(fh)
    model = make_model({k: c[k] for k in QWEN3_FIELDS})
    sd = load_file(os.path.join(folder, "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert list(missing) == ["lm_head.weight"], missing
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"].to(torch.float32))
    return model.eval(), c


def fmt(x, nd=4):
    return "n/a" if x is None else f"{x:.{nd}f}"


def write_readme(out: str, log_dir: str, command: str):
    s = json.load(open(os.path.join(log_dir, "train_summary.json")))
    cs = json.load(open(os.path.join(log_dir, "corpus_stats.json")))
    ds_path = os.path.join(log_dir, "decode_stats.json")
    ds = json.load(open(ds_path)) if os.path.exists(ds_path) else None
    size_mb = os.path.getsize(os.path.join(out, "model.safetensors")) / 2**20
    tr, va = cs["train"], cs["val"]
    dec = ""
    if ds:
        q = ds["committed_confidence"]["quantiles"]
        dec = (f"\n## Draft-free greedy decoding (tools/train_target/sample.py)\n\n"
               f"{ds['samples']} samples, {ds['steps']} commit steps: committed confidence mean "
               f"{ds['committed_confidence']['mean']:.3f}, quantiles "
               + ", ".join(f"p{k}={v:.3f}" for k, v in q.items())
               + f"; fraction of steps committing a position other than the leftmost masked one: "
               f"{ds['non_leftmost_fraction']:.3f}. Samples: `tools/train_target/logs/samples.txt`.\n")
    text = f"""# sdar-tiny-code

A tiny (≈{s['parameters'] / 1e6:.1f}M parameter) SDAR-format block-diffusion language model trained from
scratch on a 2-core CPU in {s['loop_seconds'] / 60:.1f} minutes, as a *real* (trained, non-random) test target for
the Rust `spot-models` crate. It is far too small and under-trained to be useful as a language
model: its validation loss clearly beats a unigram model, but greedy decoding soon falls into
repeated phrases ("the number of the number of ...", repeated `return`, docstring quotes; see the
decoding section). Use it as a trained test target (real, peaked-but-not-trivial logit
distributions, out-of-order commits, real tokenizer), not as a generator.

## Format

Hugging Face SDAR folder: `config.json` (`"architectures": ["SDARForCausalLM"]`, `"model_type": "sdar"`,
Qwen3 fields), `generation_config.json`, `model.safetensors` (float32, HF Qwen3 tensor names, no
`lm_head.weight` because the embeddings are tied), `tokenizer.json` (byte-level BPE).

* Qwen3: vocab 6144, hidden 256, 6 layers, 4 query heads, 2 KV heads, head_dim 64, MLP 768 (SiLU),
  RMSNorm eps 1e-6 (incl. q/k norm), RoPE theta 1e6, max positions 2048, tied embeddings.
  Parameters: {s['parameters']} ({size_mb:.1f} MiB on disk).
* Block size 32: attention is block-causal (query i sees key j iff j // 32 <= i // 32), and there is
  no logit shift (the logits at position i predict token i).
* Special tokens: `<|endoftext|>` = {ENDOFTEXT_ID} (document separator, `eos_token_id`),
  `<|im_end|>` = {IM_END_ID} (never seen in training), `<|MASK|>` = {MASK_ID} (`mask_token_id`).
  No BOS. `generation_config.json` stops on [{ENDOFTEXT_ID}, {IM_END_ID}].

## Data

Documents joined with `<|endoftext|>`; 2% of documents held out (seeded) for validation.

| source | licence | train docs/tokens | val tokens |
|---|---|---|---|
| CPython 3.11.7 standard-library `.py` sources (no `test/`, `tests/`, `idlelib/`, `site-packages/`) | PSF License | {tr['tokens_by_source'].get('cpython', 0)} tokens | {va['tokens_by_source'].get('cpython', 0)} |
| GSM8K train split (`Question: ...\\nAnswer: ...`) | MIT | {tr['tokens_by_source'].get('gsm8k_train', 0)} tokens | {va['tokens_by_source'].get('gsm8k_train', 0)} |
| MBPP tasks 601-974 only (`# <text>\\n<code>`) | CC-BY-4.0 | {tr['tokens_by_source'].get('mbpp', 0)} tokens | {va['tokens_by_source'].get('mbpp', 0)} |
| total | | {tr['documents']} docs, {tr['tokens']} tokens | {va['documents']} docs, {va['tokens']} tokens |

Not used for training (tokenizer included): GSM8K test, MBPP tasks 1-600, MATH-500, HumanEval.

## Licence

The weights are released under Apache-2.0. They were trained on data under the licences above
(PSF License for the CPython sources, MIT for GSM8K, CC-BY-4.0 for MBPP: attribution to Austin et al.,
"Program Synthesis with Large Language Models", 2021; GSM8K: Cobbe et al., 2021).

## Recipe

SDAR / BD3-LM two-stream training of `transformers.Qwen3ForCausalLM` (eager attention, float32):
x0 = 256 clean tokens (random windows of the packed corpus); per 32-token block t ~ U(0.02, 1) and
each token is replaced by `<|MASK|>` with probability t (xt). Input concat(xt, x0) with positions
concat(0..255, 0..255) and a 4D additive mask: a noisy query of block b sees the noisy keys of block b
(bidirectional) and the clean keys of blocks < b; a clean query of block b sees clean keys of blocks <= b.
Loss: cross-entropy of the noisy-stream logits at the masked positions against x0 (no shift), a plain
mean over masked tokens (no 1/t weighting). AdamW (betas 0.9/0.95, weight decay 0.1 on matrices),
peak lr {s['args']['lr']}, {s['args']['warmup']} warmup steps then cosine to {s['args']['min_lr_frac']}x over the wall-clock
budget, grad-clip 1.0, batch {s['batch']} sequences, seed {s['args']['seed']}, `torch.set_num_threads(2)`.

Command (from the repository root): `{command}`

## Measured

* Steps: {s['steps']}; clean tokens seen {s['tokens_seen_clean']} ({s['tokens_processed_two_stream']} through the
  two-stream model); training loop {s['loop_seconds']} s ({s['s_per_step']} s/step), total {s['total_seconds']} s.
  The 2 cores were shared with niced cargo builds for part of the run (about 3.9 s/step when
  quiet, 4.2-4.7 s/step with a build running), so the step count of a rerun varies with load.
* Train loss (mean of the last logged steps): {fmt(s['train_loss_last20'])} nats per masked token.
* Validation loss (same objective, fixed masks): {fmt(s['val_loss_final_set'])} nats on {s['val_windows_final']} windows of
  256 tokens ({s['val_masked_tokens_final']} masked tokens); {fmt(s['val_loss_periodic_set'])} on the {s['val_windows_periodic']}-window
  periodic set; {fmt(s['val_loss_step0'])} at initialisation.
* Unigram baseline (training unigram, add-one smoothed) on the same validation tokens:
  {fmt(s['unigram_ce_final_windows'])} nats (final windows), {fmt(s['unigram_ce_all_val'])} (all validation tokens).
{dec}
Logs: `tools/train_target/logs/` (train_log.csv, val_log.csv, train_summary.json, decode_stats.json).
"""
    with open(os.path.join(out, "README.md"), "w") as fh:
        fh.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", default=os.path.join(HERE, "ckpt", "model.pt"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "sdar-tiny-code"))
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "data", "tokenizer.json"))
    ap.add_argument("--log-dir", default=os.path.join(HERE, "logs"))
    ap.add_argument("--command", default="python3 tools/train_target/run_all.py --max-minutes 105")
    ap.add_argument("--readme-only", action="store_true")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="storage type of model.safetensors")
    ap.add_argument("--no-readme", action="store_true", help="do not write README.md")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.readme_only:
        write_readme(a.out, a.log_dir, a.command)
        print(f"README -> {a.out}")
        return
    os.makedirs(a.out, exist_ok=True)
    ck = torch.load(a.ckpt, map_location="cpu", weights_only=True)
    fields = ck.get("fields")  # absent in CPU-recipe checkpoints: QWEN3_FIELDS
    model = make_model(fields)
    model.load_state_dict(ck["model"])
    model.eval()
    store = getattr(torch, a.dtype)
    sd = {k: v.detach().to(store).contiguous().clone()
          for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(sdar_config(fields, a.dtype), fh, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": [ENDOFTEXT_ID, IM_END_ID]}, fh, indent=2)
    shutil.copyfile(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
    # reload and compare
    m2, _ = load_folder(a.out)
    ids = torch.randint(0, 6141, (1, 80), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(80)[None]
    exact = model
    if store != torch.float32:  # the stored weights are the checkpoint's rounded to `store`
        exact = make_model(fields).eval()
        exact.load_state_dict({k: v.to(store).to(torch.float32) for k, v in model.state_dict().items()})
    with torch.no_grad():
        l1 = exact(input_ids=ids, attention_mask=block_causal_mask(80, BLOCK), position_ids=pos).logits
        l2 = m2(input_ids=ids, attention_mask=block_causal_mask(80, BLOCK), position_ids=pos).logits
        l0 = model(input_ids=ids, attention_mask=block_causal_mask(80, BLOCK), position_ids=pos).logits
    assert torch.equal(l1, l2)
    if store != torch.float32:
        print(f"reload: logits equal to the checkpoint rounded to {a.dtype}; max |diff| to the float32 "
              f"checkpoint {(l0 - l2).abs().max().item():.3e}")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
    assert tok.token_to_id("<|MASK|>") == MASK_ID and tok.get_vocab_size() == 6144
    if not a.no_readme and os.path.exists(os.path.join(a.log_dir, "train_summary.json")):
        write_readme(a.out, a.log_dir, a.command)
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"exported step {ck['step']} -> {a.out} ({total / 2**20:.1f} MiB, {len(sd)} tensors); reload check OK")


if __name__ == "__main__":
    sys.exit(main())
