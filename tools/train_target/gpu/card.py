#!/usr/bin/env python3
"""README.md (model card) of a folder exported from the GPU recipe, from the run's logs.

Reads --train-dir/train_summary.json, --corpus-stats and, when present, --compare (compare.py's
JSON); anything missing (a stage cut short) is reported as n/a. Rerun after compare.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import ENDOFTEXT_ID, IM_END_ID, MASK_ID  # noqa: E402


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def f(x, nd=4):
    return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--train-dir", required=True)
    ap.add_argument("--corpus-stats", required=True)
    ap.add_argument("--compare", default=None)
    ap.add_argument("--command", default="OUT=$OUT tools/train_target/gpu/run.sh")
    a = ap.parse_args(argv)
    s = load(os.path.join(a.train_dir, "train_summary.json")) or {}
    cs = load(a.corpus_stats) or {}
    cmp_ = load(a.compare) if a.compare else None
    cfg = load(os.path.join(a.model, "config.json")) or {}
    args = s.get("args", {})
    size_mb = os.path.getsize(os.path.join(a.model, "model.safetensors")) / 2**20
    n_params = s.get("parameters") or (cmp_ or {}).get("new", {}).get("parameters")
    tr, va = cs.get("train", {}), cs.get("val", {})
    site = cs.get("site", {})

    def src_row(key, label, licence):
        return (f"| {label} | {licence} | {tr.get('documents_by_source', {}).get(key, 0)} docs, "
                f"{tr.get('tokens_by_source', {}).get(key, 0)} tokens | "
                f"{va.get('documents_by_source', {}).get(key, 0)} docs, {va.get('tokens_by_source', {}).get(key, 0)} tokens |")

    dists = list(site.get("train_bytes_by_distribution", {}).items())
    lic = site.get("licences", {})
    dist_lines = "\n".join(f"| {d} | {lic.get(d, '?')} | {b / 2**20:.1f} |" for d, b in dists[:25])
    more = f"\n\n{len(dists) - 25} more distributions: see corpus_stats.json of the run." if len(dists) > 25 else ""
    minutes = (s.get("loop_seconds") or 0) / 60
    cmp_text = "Not run (stage missing or cut short)."
    if cmp_ and cmp_.get("sets"):
        rows = []
        for name, st in cmp_["sets"].items():
            n, o = st["models"]["new"], st["models"]["old"]
            pd = st.get("paired_bits_per_byte_diff_new_minus_old", {})
            label = {"mix": "GPU-recipe held-out mixture", "orig": "CPU recipe's held-out split"}.get(name, name)
            rows.append(f"| {label} | {st['windows']} x 256 tokens, {st['bytes_scored']} bytes | "
                        f"{n['bits_per_byte']:.4f} | {o['bits_per_byte']:.4f} | {f(pd.get('se'))} | "
                        f"{n['objective_ce_nats']:.4f} | {o['objective_ce_nats']:.4f} |")
        cmp_text = ("| held-out set | scored | bits/byte, this model | bits/byte, CPU-recipe model | s.e. of the "
                    "difference | objective CE, this | objective CE, CPU-recipe |\n|---|---|---|---|---|---|---|\n"
                    + "\n".join(rows)
                    + f"\n\nVerdict of compare.py: `replace: {str(cmp_.get('replace')).lower()}` "
                    f"({cmp_.get('reason')}). Bits per byte: the any-order masked-diffusion NELBO of each 32-token "
                    "block given the clean earlier blocks of its 256-token window, summed over all mask counts "
                    "k = 1..32 with weight 1/k (one seeded mask set per k), over the UTF-8 bytes scored "
                    "(tools/train_target/gpu/compare.py). Objective CE: the training objective, nats per masked token.")
    ca = cs.get("args", {})
    rep = ca.get("small_repeat")
    rows_text = "\n".join([
        src_row("site", "`.py` files of the installed Python distributions with a permissive licence (site-packages; "
                f"no tests, vendored or generated files; deduplicated; capped at {f(ca.get('cap_mb'), 0)} MiB)",
                "per distribution, below"),
        src_row("cpython", "CPython standard-library `.py` sources of the training machine (as the CPU recipe "
                "collects them)", "PSF License"),
        src_row("gsm8k_train", f"GSM8K train split (`Question: ...\\nAnswer: ...`), x{rep} in the stream", "MIT"),
        src_row("mbpp", f"MBPP tasks 601-974 only (`# <text>\\n<code>`), x{rep} in the stream", "CC-BY-4.0"),
    ])
    text = f"""# sdar-tiny-code (GPU recipe)

A small ({f(n_params)} parameter) SDAR-format block-diffusion language model trained from scratch
in {minutes:.1f} minutes on one {s.get('device_name', 'GPU')} by `tools/train_target/gpu/run.sh`, as the
trained test target of the Rust `spot-models` crate. It keeps the tokenizer, the block size and
the special ids of the CPU-recipe model (`tools/train_target/run_all.py`), so either can stand in
`models/sdar-tiny-code/`. It is still a very small model: use it as a test target, not as a generator.

## Format

Hugging Face SDAR folder: `config.json` (`"architectures": ["SDARForCausalLM"]`, `"model_type": "sdar"`,
Qwen3 fields), `generation_config.json`, `model.safetensors` (**bfloat16**, HF Qwen3 tensor names,
no `lm_head.weight` because the embeddings are tied), `tokenizer.json` (byte-level BPE, 6144 ids).

* Qwen3: vocab {cfg.get('vocab_size')}, hidden {cfg.get('hidden_size')}, {cfg.get('num_hidden_layers')} layers,
  {cfg.get('num_attention_heads')} query heads, {cfg.get('num_key_value_heads')} KV heads, head_dim {cfg.get('head_dim')},
  MLP {cfg.get('intermediate_size')} (SiLU), RMSNorm eps {cfg.get('rms_norm_eps')} (incl. q/k norm), RoPE theta
  {cfg.get('rope_theta')}, max positions {cfg.get('max_position_embeddings')}, tied embeddings.
  Parameters: {f(n_params)} ({size_mb:.1f} MiB on disk).
* Block size {cfg.get('block_size')}: attention is block-causal (query i sees key j iff j // 32 <= i // 32),
  no logit shift (the logits at position i predict token i).
* Special tokens: `<|endoftext|>` = {ENDOFTEXT_ID} (document separator, `eos_token_id`),
  `<|im_end|>` = {IM_END_ID} (never seen in training), `<|MASK|>` = {MASK_ID} (`mask_token_id`).
  No BOS. `generation_config.json` stops on [{ENDOFTEXT_ID}, {IM_END_ID}].

## Data

Built on the training machine by `tools/train_target/gpu/corpus_gpu.py`; documents joined with
`<|endoftext|>`. Held out (never trained on): the CPU recipe's held-out split (its
GSM8K/MBPP/CPython documents, removed from every source here by name and content) and a seeded
{100 * (cs.get('args', {}).get('heldout_frac') or 0):.0f}% of the site-packages files.

| source | licence | train | held-out mixture |
|---|---|---|---|
{rows_text}
| total | | {tr.get('documents', 'n/a')} docs, {tr.get('tokens', 'n/a')} tokens | {va.get('documents', 'n/a')} docs, {va.get('tokens', 'n/a')} tokens |

Not used for training (tokenizer included): GSM8K test, MBPP tasks 1-600, MATH-500, HumanEval.

Site-packages distributions used (licence as declared in their metadata; MiB of training text):

| distribution | licence | MiB |
|---|---|---|
{dist_lines}{more}

Left out for their licence (GPL family, MPL, proprietary, none declared): {", ".join(list(site.get('left_out_for_licence_bytes', {}))[:20]) or 'none'}.

## Licence

The weights are released under Apache-2.0. They were trained on data under the licences above
(permissive licences of the listed distributions; PSF License for the CPython sources; MIT for GSM8K,
Cobbe et al., 2021; CC-BY-4.0 for MBPP: attribution to Austin et al., "Program Synthesis with
Large Language Models", 2021).

## Recipe

SDAR / BD3-LM two-stream training of `transformers.Qwen3ForCausalLM` with the CPU recipe's objective
and code (`tools/train_target/train.py`, `common.py`): x0 = {s.get('seq', 256)} clean tokens; per 32-token block
t ~ U(0.02, 1) and each token replaced by `<|MASK|>` with probability t; input concat(xt, x0) with the
two-stream block mask; loss = cross-entropy at the masked noisy positions, plain mean (no 1/t weighting).
On {s.get('device_name', 'the GPU')}: bfloat16 autocast (float32 master weights), `{args.get('attn')}` attention (checked
equal to eager on the two-stream mask), {'fused ' if args.get('device') == 'cuda' else ''}AdamW (betas 0.9/0.95, weight decay {args.get('weight_decay')} on matrices),
peak lr {args.get('lr')}, {args.get('warmup')} warmup steps then cosine to {args.get('min_lr_frac')}x over the wall-clock budget
({f(args.get('max_minutes'), 2)} min), grad-clip 1.0, batch {s.get('batch', 'n/a')} sequences, seed {args.get('seed')}.
torch {s.get('torch', 'n/a')}, transformers {s.get('transformers', 'n/a')}.

Command (device machine, repository root, after `tools/train_target/gpu/prepare.sh` here): `{a.command}`

## Measured

* Steps: {f(s.get('steps'))}; clean tokens seen {f(s.get('tokens_seen_clean'))} ({f(s.get('clean_tokens_per_s'))} per second);
  training loop {f(s.get('loop_seconds'), 1)} s, total {f(s.get('total_seconds'), 1)} s.
* Train loss (mean of the last logged steps): {f(s.get('train_loss_last20'))} nats per masked token.
* Validation loss on the held-out mixture (same objective, fixed masks): {f(s.get('val_loss_final_set'))} nats on
  {f(s.get('val_windows_final'))} windows of 256 tokens; {f(s.get('val_loss_step0'))} at initialisation.
* Unigram baseline (training unigram, add-one smoothed) on the same windows: {f(s.get('unigram_ce_final_windows'))} nats.

### Against the CPU-recipe model (tools/train_target/gpu/compare.py)

{cmp_text}

## Drafters

None yet: `spot-drafter.*` and `spiffy-graph.json` of the CPU-recipe model do not fit this one; they
must be regenerated (`spot train-drafter`, `spot calibrate-spiffy`), and the benchmark tables rerun,
before this folder replaces `models/sdar-tiny-code/`.
"""
    with open(os.path.join(a.model, "README.md"), "w") as fh:
        fh.write(text)
    print(f"model card -> {os.path.join(a.model, 'README.md')} (compare: {'yes' if cmp_ else 'no'})")


if __name__ == "__main__":
    sys.exit(main())
