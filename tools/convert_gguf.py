#!/usr/bin/env python3
"""Convert a Llama-architecture GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf) into an HF folder.

    python3 tools/convert_gguf.py --gguf FILE.gguf --out DIR [--cross-check]

Writes DIR/config.json (LlamaConfig fields from the GGUF metadata), generation_config.json,
model.safetensors (every tensor dequantized to float32, HF names, Q/K rows un-permuted),
tokenizer.json (byte-level BPE built with the `tokenizers` library from the GGUF vocab and
merges), tokenizer_config.json (chat template, special token strings) and conversion.json
(provenance: the GGUF's sha256, name, tensor types, the sha256 and size of the written
model.safetensors and tokenizer.json, the converter's library versions). conversion.json is
written last and removed first, so a folder that has it holds a complete conversion.

--cross-check then loads the same GGUF with transformers' own GGUF loader
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`) and compares every tensor, the
config, and the tokenizer's encodings against the converted folder.

Needs: numpy, gguf, safetensors, tokenizers for the conversion (tools/requirements-ci.txt, no
torch); torch + transformers + accelerate for --cross-check (tools/oracle/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle"))
import oracle_common as oc  # noqa: E402  (standard library and numpy only)

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.")
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# llama.cpp pre-tokenizer names whose split is "each digit alone, then the GPT-2 regex"
# (llama.cpp: regexes "\p{N}" then the GPT-2 pattern), i.e. tokenizers' Digits(individual)
# followed by ByteLevel(use_regex=True); and those that are the GPT-2 regex alone.
PRE_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell"}
PRE_GPT2 = {"gpt2", "default", "mpt", "olmo"}


def shortest_f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def read_gguf(path: str):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    return reader, meta


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row permutation llama.cpp's HF->GGUF converter applies to attn_q / attn_k.

    HF Llama applies RoPE in "rotate-half" form: within each head of size d, dimension i is
    rotated together with dimension i + d/2. llama.cpp's LLAMA graph uses the original
    "interleaved" form, rotating dimensions (2i, 2i+1) together. So the converter reorders the
    output rows of Wq (with n_head) and Wk (with n_head_kv) inside each head: HF row
    (half r, index j) moves to GGUF row 2j + r, i.e.
        gguf = hf.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(out, in)
    Queries and keys are permuted alike, so q.k is unchanged and V / O are untouched; only the
    RoPE pairing differs. The inverse, used here, is
        hf = gguf.reshape(n_head, d/2, 2, in).swapaxes(1, 2).reshape(out, in)
    (The GGUF quantization blocks run along the input dimension of each row, so permuting rows
    commutes with dequantization: this is exact.)
    """
    out = w.shape[0]
    d = out // n_head
    assert d * n_head == out and d % 2 == 0, (w.shape, n_head)
    rest = w.shape[1:]
    return w.reshape(n_head, d // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def dequantize(t) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # numpy order [out, in]
    if t.tensor_type == GGMLQuantizationType.F32:
        a = np.asarray(t.data, dtype=np.float32)
    else:
        a = gguf_dequantize(t.data, t.tensor_type).astype(np.float32)
    return np.ascontiguousarray(a.reshape(shape))


def build_config(meta: dict, tensor_names: set[str]) -> dict:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise SystemExit(f"unsupported architecture {arch!r} (this converter handles llama only)")
    a = lambda k, default=None: meta.get(f"{arch}.{k}", default)  # noqa: E731
    hidden = int(a("embedding_length"))
    n_head = int(a("attention.head_count"))
    n_kv = int(a("attention.head_count_kv", n_head))
    head_dim = int(a("attention.key_length", a("rope.dimension_count", hidden // n_head)))
    if a("rope.dimension_count") is not None and int(a("rope.dimension_count")) != head_dim:
        raise SystemExit("partial RoPE (rope.dimension_count != head_dim) is not supported")
    if any(k.startswith(f"{arch}.rope.scaling") for k in meta) or "rope_freqs.weight" in tensor_names:
        raise SystemExit("RoPE scaling is not supported by this converter")
    vocab = int(a("vocab_size", len(meta["tokenizer.ggml.tokens"])))
    tie = "output.weight" not in tensor_names
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": int(a("feed_forward_length")),
        "max_position_embeddings": int(a("context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": n_head,
        "num_hidden_layers": int(a("block_count")),
        "num_key_value_heads": n_kv,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "pretraining_tp": 1,
        "rms_norm_eps": shortest_f32(a("attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": shortest_f32(a("rope.freq_base", 10000.0)),
        "tie_word_embeddings": tie,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab,
    }
    return cfg


def convert_tensors(reader, cfg: dict) -> dict[str, np.ndarray]:
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = t.name
        if name in GLOBAL_NAMES:
            hf = GLOBAL_NAMES[name]
        elif name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if rest not in LAYER_NAMES:
                raise SystemExit(f"unexpected tensor {name}")
            hf = f"model.layers.{int(layer)}.{LAYER_NAMES[rest]}"
        else:
            raise SystemExit(f"unexpected tensor {name}")
        w = dequantize(t)
        if rest_is(name, "attn_q.weight"):
            w = unpermute_rows(w, n_head)
        elif rest_is(name, "attn_k.weight"):
            w = unpermute_rows(w, n_kv)
        out[hf] = w
    expect = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(cfg["num_hidden_layers"]):
        expect |= {f"model.layers.{i}.{v}" for v in LAYER_NAMES.values()}
    if not cfg["tie_word_embeddings"]:
        expect.add("lm_head.weight")
    if set(out) != expect:
        raise SystemExit(f"tensor set mismatch: missing {sorted(expect - set(out))}, extra {sorted(set(out) - expect)}")
    assert out["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    return out


def rest_is(name: str, suffix: str) -> bool:
    return name.startswith("blk.") and name.split(".", 2)[2] == suffix


def build_tokenizer(meta: dict):
    """tokenizers.Tokenizer equivalent to the GGUF's gpt2-style BPE vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit(f"unsupported tokenizer model {meta.get('tokenizer.ggml.model')!r}")
    pre = meta.get("tokenizer.ggml.pre", "default")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    assert all(len(m) == 2 for m in merges)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    if pre in PRE_DIGITS_THEN_GPT2:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    elif pre in PRE_GPT2:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        raise SystemExit(f"unsupported pre-tokenizer {pre!r}")
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, ty in enumerate(types) if ty == 3]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, ty in enumerate(types) if ty == 4]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    for t in special + user:
        assert tok.token_to_id(t.content) == vocab[t.content]
    assert tok.get_vocab_size() == len(tokens)
    return tok, [i for i, ty in enumerate(types) if ty in (3, 4)]


def tokenizer_config(meta: dict, cfg: dict, added_ids: list[int]) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))

    def tok(key):
        i = meta.get(key)
        return None if i is None else tokens[int(i)]

    out = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": tokens[i],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": types[i] == 3,
            }
            for i in added_ids
        },
        "bos_token": tok("tokenizer.ggml.bos_token_id"),
        "clean_up_tokenization_spaces": False,
        "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "model_max_length": cfg["max_position_embeddings"],
        "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tok("tokenizer.ggml.unknown_token_id"),
    }
    if "tokenizer.chat_template" in meta:
        out["chat_template"] = meta["tokenizer.chat_template"]
    return out


def converter_versions() -> dict:
    """Python and the libraries whose versions decide the bytes of the converted files."""
    import platform
    from importlib.metadata import version

    return {"python": platform.python_version(), **{m: version(m) for m in ("numpy", "gguf", "safetensors", "tokenizers")}}


def convert(gguf_path: str, out_dir: str) -> dict:
    from safetensors.numpy import save_file

    reader, meta = read_gguf(gguf_path)
    names = {t.name for t in reader.tensors}
    cfg = build_config(meta, names)
    os.makedirs(out_dir, exist_ok=True)
    prov_path = os.path.join(out_dir, "conversion.json")
    if os.path.exists(prov_path):
        os.remove(prov_path)  # the folder is incomplete until the new one is written
    tensors = convert_tensors(reader, cfg)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)
    oc.write_json(os.path.join(out_dir, "config.json"), cfg, ensure_ascii=False)
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg[k] is not None}
    oc.write_json(os.path.join(out_dir, "generation_config.json"), gen, ensure_ascii=False)
    tok, added = build_tokenizer(meta)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    oc.write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(meta, cfg, added), ensure_ascii=False)
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    model_path = os.path.join(out_dir, "model.safetensors")
    tok_path = os.path.join(out_dir, "tokenizer.json")
    prov = {
        "tool": "tools/convert_gguf.py",
        "gguf_file": os.path.basename(gguf_path),
        "gguf_sha256": oc.sha256_file(gguf_path),
        "general.name": meta.get("general.name"),
        "general.license": meta.get("general.license"),
        "tokenizer.ggml.pre": meta.get("tokenizer.ggml.pre"),
        "gguf_tensor_types": types,
        "parameters": int(sum(a.size for a in tensors.values())),
        "stored_dtype": "float32 (dequantized)",
        "model_sha256": oc.sha256_file(model_path),
        "model_bytes": os.path.getsize(model_path),
        "tokenizer_sha256": oc.sha256_file(tok_path),
        "versions": converter_versions(),
    }
    oc.write_json(prov_path, prov, ensure_ascii=False)
    print(f"wrote {out_dir}: {len(tensors)} tensors, {prov['parameters']} parameters, tensor types {types}")
    return cfg


# --------------------------------------------------------------------------------------------
# Cross-check against transformers' own GGUF loader
# --------------------------------------------------------------------------------------------

SAMPLE_TEXTS = [
    "Hello, world! How are you today?",
    "The capital of France is Paris.\n\nIt has 2,165,423 inhabitants (2019).",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces, tabs\tand unicode: café, naïve, 東京, emoji 🙂",
]


def cross_check(gguf_path: str, out_dir: str) -> int:
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader's progress bar
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    check = oc.Checker()

    gdir, gname = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    ours = load_file(os.path.join(out_dir, "model.safetensors"))
    ref = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32).eval()
    sd = ref.state_dict()
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    rc = ref.config.to_dict()
    if rc.get("rope_theta") is None:  # transformers 5.x keeps it in rope_parameters
        rc["rope_theta"] = (rc.get("rope_parameters") or {}).get("rope_theta")
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        check(rc.get(k) == cfg[k], f"config {k}: ours {cfg[k]}, transformers {rc.get(k)}")
    for k in ("rms_norm_eps", "rope_theta"):
        check(np.float32(rc.get(k)) == np.float32(cfg[k]), f"config {k}: ours {cfg[k]}, transformers {rc.get(k)}")
    check(bool(rc.get("tie_word_embeddings")) == cfg["tie_word_embeddings"], f"tie_word_embeddings {cfg['tie_word_embeddings']}")
    want_keys = set(ours) | ({"lm_head.weight"} if cfg["tie_word_embeddings"] else set())
    check(set(sd) == want_keys, f"same tensor names ({len(ours)} stored)")
    worst, worst_name, exact = 0.0, None, 0
    for k, t in ours.items():
        r = sd[k].to(torch.float32)
        if r.shape != t.shape:
            check(False, f"{k} shape {tuple(t.shape)} vs {tuple(r.shape)}")
            continue
        d = float((r - t).abs().max())
        exact += int(d == 0.0)
        if d >= worst:
            worst, worst_name = d, k
    check(worst <= 1e-6, f"max |diff| over all {len(ours)} tensors: {worst:.3g} (at {worst_name}); {exact} identical")
    if cfg["tie_word_embeddings"]:
        d = float((sd["lm_head.weight"] - ours["model.embed_tokens.weight"]).abs().max())
        check(d == 0.0, f"transformers' lm_head equals our embedding (tied), max |diff| {d:.3g}")

    # Logits of the two models on one sequence (same weights -> same logits).
    from transformers import LlamaForCausalLM

    mine = LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ref.config._attn_implementation = "eager"
    tk = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    ids = torch.tensor([tk.encode(SAMPLE_TEXTS[1]).ids])
    with torch.inference_mode():
        d = float((mine(ids).logits - ref(ids).logits).abs().max())
    check(d <= 1e-4, f"logits of our folder vs transformers' GGUF model: max |diff| {d:.3g}")
    del ref, mine

    # Tokenizer: our tokenizer.json vs transformers' GGUF tokenizer conversion, and our folder
    # through AutoTokenizer.
    hf_gguf_tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    hf_dir_tok = AutoTokenizer.from_pretrained(out_dir)
    for text in SAMPLE_TEXTS:
        a = tk.encode(text).ids
        b = hf_gguf_tok(text, add_special_tokens=False)["input_ids"]
        c = hf_dir_tok(text, add_special_tokens=False)["input_ids"]
        check(a == c, f"AutoTokenizer(out dir) == tokenizer.json on {text[:30]!r}")
        check(tk.decode(a, skip_special_tokens=False) == text, f"round trip {text[:30]!r}")
        note = "same" if a == b else f"DIFFERS (ours {len(a)} ids, transformers' GGUF tokenizer {len(b)} ids)"
        print(f"     vs transformers' GGUF tokenizer conversion: {note}")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    t1 = hf_dir_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    check(t1.startswith("<|im_start|>system\n") and t1.endswith("<|im_start|>assistant\n"), "chat template renders")
    print(f"{'all checks passed' if not check.failures else f'{check.failures} check(s) failed'}")
    return check.failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cross-check", action="store_true", help="compare with transformers' GGUF loader (needs torch)")
    args = ap.parse_args(argv)
    convert(args.gguf, args.out)
    if args.cross_check and cross_check(args.gguf, args.out):
        sys.exit(1)


if __name__ == "__main__":
    main()
