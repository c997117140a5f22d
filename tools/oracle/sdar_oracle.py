#!/usr/bin/env python3
"""SDAR oracle: tiny random SDAR model folders plus golden outputs from HuggingFace transformers.

SDAR is the Qwen3 architecture used as a block-diffusion LM: the sequence is split into blocks
of `block_size` tokens, attention is block-causal (query i sees key j iff j // L <= i // L) and
there is no logit shift (the logits at position i predict token i). The oracle model is
`transformers.Qwen3ForCausalLM` in float32 with eager attention, an explicit 4D additive
attention mask [B, 1, Q, K] and explicit position ids 0..n-1.

Subcommands:
  make-fixtures --out DIR   write DIR/sdar-tiny and DIR/sdar-tiny-bf16 (model + golden files)
  self-check    --out DIR   reload the folders and check them (see README.md)
  golden-decodes --model DIR --prompts FILE.jsonl --out FILE.json
                            draft-free T=0 decodes of a real SDAR folder (e.g. the shipped
                            models/sdar-tiny-code) for the Rust agreement test

See tools/oracle/README.md for the exact decoding semantics reproduced here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

# One thread: the tiny model is overhead-bound and far faster single-threaded (and this stays
# within the 2 cores of the machine the fixtures were made on).
torch.set_num_threads(1)

BLOCK_SIZE = 8
MIN_GAP = 1e-4
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>", "<|MASK|>"]
BPE_VOCAB = 370  # byte-level BPE size before the three special tokens are appended

TINY_SHAPES = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=512,
)

# name, tie_word_embeddings, stored dtype, weight seed, case seed, eos alignment (see align_eos_row)
FIXTURES = [
    ("sdar-tiny", True, "float32", 20240601, 7001, 2.0),
    ("sdar-tiny-bf16", False, "bfloat16", 20240602, 7002, 1.4),
]

# Training text for the tokenizer: the first 4000 characters of each of these CPython
# standard-library sources (paths relative to the directory of the `json` package's parent).
TOKENIZER_SOURCES = ["json/decoder.py", "json/encoder.py", "textwrap.py"]
TOKENIZER_CHARS = 4000


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def tokenizer_training_text() -> str:
    import json as json_pkg

    stdlib = os.path.dirname(os.path.dirname(json_pkg.__file__))
    parts = []
    for rel in TOKENIZER_SOURCES:
        with open(os.path.join(stdlib, rel), encoding="utf-8") as f:
            parts.append(f.read()[:TOKENIZER_CHARS])
    return "\n".join(parts)


def build_tokenizer(special_tokens=None):
    """The fixture BPE tokenizer plus `special_tokens` (default: SDAR's three) appended in order."""
    specials = list(SPECIAL_TOKENS if special_tokens is None else special_tokens)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = tokenizer_training_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens(specials)
    ids = {t: tok.token_to_id(t) for t in specials}
    assert tok.get_vocab_size() == BPE_VOCAB + len(specials)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return tok, ids, sha


# --------------------------------------------------------------------------------------------
# Config and weights
# --------------------------------------------------------------------------------------------


def sdar_config(tie: bool, dtype: str, ids: dict) -> dict:
    s = TINY_SHAPES
    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "vocab_size": s["vocab_size"],
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": s["max_position_embeddings"],
        "rms_norm_eps": s["rms_norm_eps"],
        "rope_theta": s["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": tie,
        "torch_dtype": dtype,
        "block_size": BLOCK_SIZE,
        "mask_token_id": ids["<|MASK|>"],
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "use_cache": False,
    }


def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights with HF Qwen3 names, scaled so that the model is peaked.

    Projections use variance-preserving scales (std 1/sqrt(fan_in)) so that attention and MLP
    contribute to the residual stream as much as the embedding does (the context matters).
    The output embedding (the tied embedding, or lm_head when untied, whose input embedding
    then has std 1) has std 0.45 / 0.55: logits with a std of about 4 and a median top-1
    probability of about 0.4-0.6 (printed as "peakedness" by make-fixtures). Every norm
    weight is 1 + 0.1 * N(0, 1) so that a missing or misplaced norm changes the logits.
    """
    tie = cfg["tie_word_embeddings"]
    return oc.hf_decoder_weights(oc.WeightDraws(seed), cfg, embed_std=0.45 if tie else 1.0, head_std=0.55, qk_norm=True)


@torch.inference_mode()
def align_eos_row(cfg: dict, w: dict[str, np.ndarray], dtype: str, eos_id: int, mask_id: int, strength: float, seed: int):
    """Make <|im_end|> a token the model sometimes predicts, as a trained model would.

    A random model almost never predicts a given token, so early stopping would never be
    exercised. The final normed hidden states of the random model share a strong common
    direction u (their mean, measured on 16 seeded random contexts); the output row of the
    eos token becomes 0.5 * (its random row) + strength * u / |u|.
    """
    model = load_hf_model(cfg, store_tensors(w, dtype))
    rows = oc.masked_rows(np.random.default_rng(seed), BPE_VOCAB, 16, 40, 0.7, mask_id)
    u = oc.final_norm_direction(model, lambda: hf_logits(model, rows, BLOCK_SIZE), slice(32, None))
    key = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    oc.boost_row(w, key, eos_id, strength, u)


def store_tensors(weights: dict[str, np.ndarray], dtype: str) -> dict[str, torch.Tensor]:
    """The tensors as they are written to model.safetensors (float32 or bfloat16)."""
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    return {k: torch.from_numpy(a).to(tdt).contiguous() for k, a in weights.items()}


# --------------------------------------------------------------------------------------------
# HF model
# --------------------------------------------------------------------------------------------


def load_hf_model(cfg: dict, tensors: dict[str, torch.Tensor]):
    """Qwen3ForCausalLM (float32, eager) holding exactly `tensors` upcast to float32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    keys = [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "attention_bias",
        "tie_word_embeddings",
    ]
    qcfg = Qwen3Config(
        **{k: cfg[k] for k in keys},
        attention_dropout=0.0,
        use_sliding_window=False,
        use_cache=False,
        torch_dtype=torch.float32,
    )
    model = oc.eager_model(Qwen3ForCausalLM, qcfg)
    sd = {k: t.to(torch.float32) for k, t in tensors.items()}
    return oc.load_exact(model, sd, cfg["tie_word_embeddings"])


def block_causal_mask(n: int, block: int, batch: int = 1, offset: int = 0) -> torch.Tensor:
    """Additive [B, 1, n, n] mask: 0 where key j is visible from query i, -inf elsewhere."""
    pos = torch.arange(offset, offset + n)
    blk = pos // block
    visible = blk[None, :] <= blk[:, None]
    m = torch.zeros(n, n, dtype=torch.float32)
    m.masked_fill_(~visible, float("-inf"))
    return m[None, None].expand(batch, 1, n, n).contiguous()


def causal_mask(n: int, batch: int = 1) -> torch.Tensor:
    m = torch.full((n, n), float("-inf")).triu(1)
    return m[None, None].expand(batch, 1, n, n).contiguous()


@torch.inference_mode()
def hf_logits(model, rows: list[list[int]], block: int, mask: torch.Tensor | None = None) -> np.ndarray:
    """float32 logits [B, n, V] of the model on equal-length rows with the block-causal mask."""
    if mask is None:
        mask = block_causal_mask(len(rows[0]), block, len(rows))
    return oc.hf_forward(model, rows, mask)


# --------------------------------------------------------------------------------------------
# Independent numpy reference (float64) of the SDAR forward, for the self-check
# --------------------------------------------------------------------------------------------


def numpy_reference_logits(cfg: dict, tensors: dict[str, torch.Tensor], ids: list[int], block: int) -> np.ndarray:
    return oc.numpy_decoder_logits(cfg, oc.float64_weights(tensors), ids, oc.visible_blocks(len(ids), block))


# --------------------------------------------------------------------------------------------
# Draft-free decoding (exact semantics of spot-core's DraftFreeDecoder at temperature 0)
# --------------------------------------------------------------------------------------------


def reduce_position(logits_f32: np.ndarray, mask_id: int):
    """(token, float32 confidence, top1 - top2 logit) of one position's float32 logits."""
    lg = np.array(logits_f32, dtype=np.float32, copy=True)
    lg[mask_id] = -np.inf
    token = int(np.argmax(lg))  # first (lowest) id on ties
    l64 = lg.astype(np.float64)
    e = np.exp(l64 - l64.max())
    prob = e / e.sum()
    conf = np.float32(prob[token])
    top2 = np.sort(lg)[-2:]
    logit_gap = float(top2[1]) - float(top2[0])
    return token, conf, logit_gap


def draft_free_decode(model, prompt, max_new_tokens, early_stop, stop_ids, mask_id, block=BLOCK_SIZE, logits_fn=None):
    """Decode `prompt`; `logits_fn(ids) -> [n, V]` float32 replaces the HF model when given."""
    L = block
    if logits_fn is None:
        logits_fn = lambda ids: hf_logits(model, [ids], L)[0]  # noqa: E731
    P = len(prompt)
    assert P > 0 and mask_id not in prompt
    first_start = (P // L) * L
    end = -(-(P + max_new_tokens) // L) * L
    generated: list[int] = []
    done: list[int] = list(prompt[:first_start])  # tokens before the current block
    forwards = 0
    min_gap = math.inf
    commits: list[list[int]] = []
    stopped = False
    for start in range(first_start, end, L):
        tail = list(prompt[start : min(P, start + L)])
        state = tail + [mask_id] * (L - len(tail))
        while mask_id in state:
            logits = logits_fn(done + state)[start : start + L]
            forwards += 1
            best_s, best_c = None, None
            confs = []
            reduced = {}
            for s in range(L):
                if state[s] != mask_id:
                    continue
                tok, conf, lgap = reduce_position(logits[s], mask_id)
                reduced[s] = (tok, lgap)
                confs.append(conf)
                if best_c is None or conf > best_c:
                    best_s, best_c = s, conf
            if len(confs) > 1:
                c = sorted((float(x) for x in confs), reverse=True)
                min_gap = min(min_gap, c[0] - c[1])
            tok, lgap = reduced[best_s]
            min_gap = min(min_gap, lgap)
            state[best_s] = tok
            commits.append([start + best_s, tok])
        new = state[len(tail) :]
        generated.extend(new)
        done.extend(state)
        if early_stop and any(t in stop_ids for t in new):
            stopped = True
            break
    tokens = generated[:max_new_tokens]
    if early_stop:
        for i, t in enumerate(tokens):
            if t in stop_ids:
                tokens = tokens[: i + 1]
                break
    return dict(
        blocks=(len(done) - first_start) // L,
        planned_blocks=(end - first_start) // L,
        tokens=tokens,
        generated=generated,
        block_forwards=forwards,
        min_conf_gap=min_gap,
        stopped=stopped,
        commits=commits,
    )


# --------------------------------------------------------------------------------------------
# Fixture generation
# --------------------------------------------------------------------------------------------

# (prompt length, max_new_tokens, early_stop, require an early stop before the last block)
DECODE_SPECS = [
    (1, 8, False, False),
    (5, 20, False, False),
    (16, 16, False, False),
    (8, 33, False, False),
    (13, 40, True, True),
    (22, 24, True, False),
    (30, 12, True, False),
]

PROMPT_TEXT = (
    'def dumps(obj, *, indent=None):\n    """Serialize obj to a JSON formatted str."""\n'
    "    return JSONEncoder(indent=indent).encode(obj)\n"
)


def summarize_peakedness(forward, rng, mask_id, pad=0) -> dict:
    """oc.peakedness at the 32 positions of 4 seeded random rows (last block 60% masks, then
    `pad` more masks), the mask id left out; `forward(rows) -> [B, n, V]` float32 logits."""
    rows = oc.masked_rows(rng, BPE_VOCAB, 4, 32, 0.6, mask_id, pad=pad)
    lg = forward(rows)[:, :32].copy()
    lg[..., mask_id] = -np.inf
    return oc.peakedness(lg)


def spec_prompt(di: int, attempt: int, plen: int, text_ids: list[int], rand_tokens) -> list[int]:
    """Decode case di's prompt: a slice of PROMPT_TEXT's ids on the first attempt of an even
    case, else `rand_tokens(plen)`."""
    if attempt == 0 and di % 2 == 0:
        off = (di * 7) % max(1, len(text_ids) - plen)
        return text_ids[off : off + plen]
    return rand_tokens(plen)


def cuts_early(r: dict, min_blocks: int = 1) -> bool:
    """A draft_free_decode result whose early stop ended decoding before the last planned block
    (after at least `min_blocks` blocks) and cut the output."""
    return r["stopped"] and min_blocks <= r["blocks"] < r["planned_blocks"] and len(r["tokens"]) < len(r["generated"])


def decode_record(prompt, max_new, early, stop_ids, r: dict, **extra) -> dict:
    """A golden.json decode case: the inputs, `extra` (families: "end"), draft_free_decode's results."""
    case = {"prompt": prompt, "max_new_tokens": max_new, "early_stop": early, "stop_ids": stop_ids, **extra}
    case.update((k, r[k]) for k in ("tokens", "generated", "block_forwards", "min_conf_gap", "stopped", "commits"))
    return case


def make_fixture(out_dir: str, name: str, tie: bool, dtype: str, wseed: int, cseed: int, eos_align: float, tok, ids, tok_sha):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    cfg = sdar_config(tie, dtype, ids)
    mask_id = ids["<|MASK|>"]
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert cfg["vocab_size"] >= tok.get_vocab_size()

    weights = random_weights(cfg, wseed)
    align_eos_row(cfg, weights, dtype, ids["<|im_end|>"], mask_id, eos_align, wseed + 1)
    tensors = store_tensors(weights, dtype)
    oc.write_model_folder(folder, tensors, cfg, {"eos_token_id": eos}, tok)

    model = load_hf_model(cfg, tensors)
    rng = np.random.default_rng(cseed)
    print(f"[{name}] peakedness: {summarize_peakedness(lambda rows: hf_logits(model, rows, BLOCK_SIZE), rng, mask_id)}")

    def rand_tokens(n):
        return oc.random_ids(rng, BPE_VOCAB, n)

    M = mask_id
    # ---- logits cases
    text_ids = tok.encode(PROMPT_TEXT).ids
    assert len(text_ids) >= 24 and M not in text_ids
    logits_specs = [
        ([], [[M] * 8, rand_tokens(3) + [M] * 5, [M, 17, M, M, 250, M, M, 9]]),
        (text_ids[:24], [[M] * 8, rand_tokens(2) + [M] * 6, [M] * 5 + rand_tokens(3), [M, 101, M, 33, M, 7, M, 300]]),
        (rand_tokens(8), [rand_tokens(4) + [M] * 4]),
        (rand_tokens(16), [rand_tokens(8), [M] * 8]),
    ]
    golden_tensors = {}
    logits_cases = []
    for ci, (prefix, states) in enumerate(logits_specs):
        assert len(prefix) % BLOCK_SIZE == 0 and all(len(s) == BLOCK_SIZE for s in states)
        lg = hf_logits(model, [prefix + s for s in states], BLOCK_SIZE)[:, len(prefix) :]
        key = f"logits.{ci}"
        golden_tensors[key] = torch.from_numpy(np.ascontiguousarray(lg, dtype=np.float32))
        logits_cases.append({"key": key, "prefix": prefix, "states": states})

    # ---- decode cases
    decode_cases = []
    for di, (plen, max_new, early, need_stop) in enumerate(DECODE_SPECS):

        def attempt(i):
            prompt = spec_prompt(di, i, plen, text_ids, rand_tokens)
            r = draft_free_decode(model, prompt, max_new, early, eos, mask_id)
            # with need_stop, the stop must end decoding before the last planned block and cut the output
            ok = r["min_conf_gap"] >= MIN_GAP and (not need_stop or cuts_early(r))
            print(
                f"[{name}] decode case {di}: P={plen} n={max_new} early_stop={early} attempt={i + 1} "
                f"min_conf_gap={r['min_conf_gap']:.6g} stopped={r['stopped']} forwards={r['block_forwards']}"
                + ("" if ok else "  -> redraw")
            )
            return ok, (prompt, r)

        prompt, r = oc.redraw(f"decode case {di} for {name}", 400, attempt)
        decode_cases.append(decode_record(prompt, max_new, early, eos, r))

    golden = {
        "block_size": BLOCK_SIZE,
        "mask_id": mask_id,
        "vocab_size": cfg["vocab_size"],
        "generator": {
            "tool": "tools/oracle/sdar_oracle.py make-fixtures",
            **oc.versions(),
            "weight_seed": wseed,
            "case_seed": cseed,
            "eos_align": eos_align,
            "weights_dtype": dtype,
            "tokenizer_text_sha256": tok_sha,
        },
    }
    oc.write_golden(folder, golden_tensors, golden, logits_cases, decode_cases)
    return folder


def cmd_make_fixtures(args):
    tok, ids, sha = build_tokenizer()
    print(f"tokenizer: vocab {tok.get_vocab_size()}, special ids {ids}, training text sha256 {sha}")
    for name, tie, dtype, wseed, cseed, eos_align in FIXTURES:
        oc.report_written(name, make_fixture(args.out, name, tie, dtype, wseed, cseed, eos_align, tok, ids, sha))


# --------------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------------


# The draft_free_decode results a replayed golden decode case must reproduce.
REPLAY_KEYS = ("tokens", "generated", "block_forwards", "commits")


def check_decodes(check, name: str, cases: list[dict], decode, keys, how: str) -> None:
    """Replay every golden decode case with `decode(case)` and compare `keys`."""
    for dc in cases:
        r = decode(dc)
        check(all(r[k] == dc[k] for k in keys), f"[{name}] decode P={len(dc['prompt'])} n={dc['max_new_tokens']} {how}")


def cmd_self_check(args):
    from safetensors import safe_open
    from safetensors.torch import load_file

    check = oc.Checker()
    for name, tie, dtype, *_ in FIXTURES:
        folder = os.path.join(args.out, name)
        cfg, golden, tok = oc.read_fixture(folder)
        check(tok.get_vocab_size() <= cfg["vocab_size"], f"[{name}] tokenizer loads, size {tok.get_vocab_size()}")
        check(tok.token_to_id("<|MASK|>") == cfg["mask_token_id"] == golden["mask_id"], f"[{name}] mask id")
        oc.check_round_trip(check, name, tok, "x = json.dumps(obj)<|im_end|>")

        tensors = load_file(os.path.join(folder, "model.safetensors"))
        want_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        check(all(t.dtype == want_dtype for t in tensors.values()), f"[{name}] all tensors {dtype}")
        check(("lm_head.weight" in tensors) == (not tie), f"[{name}] lm_head present iff untied")
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            nparams = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        print(f"     [{name}] parameters stored: {nparams}")
        model = load_hf_model(cfg, tensors)
        gl = load_file(os.path.join(folder, "golden.safetensors"))
        for case in golden["logits_cases"]:
            rows = [case["prefix"] + s for s in case["states"]]
            lg = hf_logits(model, rows, golden["block_size"])[:, len(case["prefix"]) :]
            diff = float(np.abs(lg - gl[case["key"]].numpy()).max())
            check(diff <= 1e-5, f"[{name}] {case['key']} recomputed, max |diff| {diff:.3g}")
            ref = np.stack([numpy_reference_logits(cfg, tensors, r, golden["block_size"])[len(case["prefix"]) :] for r in rows])
            rdiff = float(np.abs(ref - gl[case["key"]].numpy()).max())
            check(rdiff <= 1e-4, f"[{name}] {case['key']} vs float64 numpy reference, max |diff| {rdiff:.3g}")

        # transformers' own loader reads the folder to the same model.
        from transformers import Qwen3ForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # silences "model of type sdar to instantiate qwen3"
        fp = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        case = golden["logits_cases"][1]
        lg = hf_logits(fp, [case["prefix"] + s for s in case["states"]], golden["block_size"])[:, len(case["prefix"]) :]
        diff = float(np.abs(lg - gl[case["key"]].numpy()).max())
        check(diff <= 1e-5, f"[{name}] Qwen3ForCausalLM.from_pretrained(folder) reproduces {case['key']}, max |diff| {diff:.3g}")

        # The 4D mask must really be used.
        case = golden["logits_cases"][1]
        rows = [case["prefix"] + s for s in case["states"]]
        n, b = len(rows[0]), len(rows)
        bc = hf_logits(model, rows, 8)
        ca = hf_logits(model, rows, 8, mask=causal_mask(n, b))
        check(float(np.abs(bc - ca).max()) > 1e-2, f"[{name}] causal mask changes logits by {float(np.abs(bc - ca).max()):.3g}")
        m = block_causal_mask(n, 8, b)
        m[:, :, :, 3] = float("-inf")
        alt = hf_logits(model, rows, 8, mask=m)
        check(float(np.abs(bc - alt).max()) > 1e-2, f"[{name}] hiding key 3 changes logits by {float(np.abs(bc - alt).max()):.3g}")
        # Full attention changes the logits; earlier blocks' logits do not depend on later tokens.
        oc.check_block_causal(check, name, lambda rs, mask=None: hf_logits(model, rs, 8, mask=mask), rows, bc, 8)

        # Decode cases reproduce (the first --decode-cases of them).
        cases = golden["decode_cases"][: args.decode_cases]

        def replay(logits_fn=None):
            return lambda dc: draft_free_decode(model, dc["prompt"], dc["max_new_tokens"], dc["early_stop"], dc["stop_ids"],
                                                golden["mask_id"], logits_fn=logits_fn)

        check_decodes(check, name, cases, replay(), REPLAY_KEYS + ("stopped",), "reproduces")
        # An independent implementation (float64 numpy forward, rounded to float32: logits
        # differ by ~1e-5) must make the same decisions: the min_conf_gap margin at work.
        ref_fn = lambda ids: numpy_reference_logits(cfg, tensors, ids, golden["block_size"]).astype(np.float32)  # noqa: E731
        check_decodes(check, name, cases, replay(ref_fn), REPLAY_KEYS, "reproduced by the numpy reference")
        gaps = [dc["min_conf_gap"] for dc in golden["decode_cases"]]
        check(min(gaps) >= MIN_GAP, f"[{name}] min_conf_gap values {['%.6g' % g for g in gaps]}")
    check.finish()


# --------------------------------------------------------------------------------------------
# Golden decodes of a real folder
# --------------------------------------------------------------------------------------------


def cmd_golden_decodes(args):
    """Draft-free T=0 decodes of `args.model` on the first prompts of a JSONL file.

    A prompt whose decode has a confidence or logit gap below --min-gap (a near tie that float
    rounding could flip between implementations) is skipped and listed, not silently dropped.
    """
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = args.model
    cfg = oc.load_json(os.path.join(folder, "config.json"))
    gen_path = os.path.join(folder, "generation_config.json")
    stop_ids = []
    if os.path.exists(gen_path):
        eos = oc.load_json(gen_path).get("eos_token_id", [])
        stop_ids = eos if isinstance(eos, list) else [eos]
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    weights_path = os.path.join(folder, "model.safetensors")
    weights_sha = oc.sha256_file(weights_path)
    model = load_hf_model(cfg, load_file(weights_path))
    L, mask_id = cfg["block_size"], cfg["mask_token_id"]
    cases, skipped = [], []
    with open(args.prompts) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for i, rec in enumerate(records):
        if len(cases) >= args.n:
            break
        text = rec[args.field]
        ids = tok.encode(text).ids
        r = draft_free_decode(model, ids, args.max_new_tokens, True, stop_ids, mask_id, block=L)
        rid = rec.get("task_id", f"line {i + 1}")
        if r["min_conf_gap"] < args.min_gap:
            skipped.append(dict(id=rid, min_conf_gap=r["min_conf_gap"]))
            print(f"skip {rid}: min gap {r['min_conf_gap']:.3g}")
            continue
        cases.append(dict(id=rid, prompt_text=text, prompt=ids, max_new_tokens=args.max_new_tokens,
                          early_stop=True, tokens=r["tokens"], block_forwards=r["block_forwards"],
                          stopped=r["stopped"], min_conf_gap=r["min_conf_gap"]))
        print(f"{rid}: {len(ids)} prompt tokens, {len(r['tokens'])} new, {r['block_forwards']} forwards, "
              f"min gap {r['min_conf_gap']:.3g}", flush=True)
    out = dict(generator="tools/oracle/sdar_oracle.py golden-decodes", transformers=__import__("transformers").__version__,
               torch=torch.__version__, model_sha256=weights_sha, prompts_file=os.path.basename(args.prompts),
               field=args.field, block_size=L, mask_id=mask_id, stop_ids=stop_ids, min_gap=args.min_gap,
               cases=cases, skipped=skipped)
    oc.write_json(args.out, out, indent=1)
    print(f"wrote {len(cases)} cases ({len(skipped)} skipped) to {args.out}")


def main(argv=None):
    ap, sub, p = oc.fixture_cli(__doc__, "write the tiny SDAR fixture folders and golden outputs", cmd_make_fixtures, cmd_self_check)
    p.add_argument("--decode-cases", type=int, default=100, help="how many decode cases to replay")
    p = sub.add_parser("golden-decodes", help="draft-free T=0 decodes of a real SDAR folder")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, help="JSONL file, one prompt record per line")
    p.add_argument("--field", default="prompt")
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--min-gap", type=float, default=1e-5)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_golden_decodes)
    oc.run_cli(ap, argv)


if __name__ == "__main__":
    main()
