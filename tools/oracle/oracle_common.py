"""Helpers shared by the oracle tools in this folder and by tools/convert_gguf.py.

- files: `sha256_file`, `write_json`, `load_json`, `write_model_folder`, `write_golden`,
  `report_written`, `versions` (the generator fields of a golden file);
- command line and checks: `fixture_cli` / `run_cli` (the make-fixtures / self-check
  subcommands), `Checker` (the "ok   " / "FAIL " lines), `read_fixture`, `check_round_trip`,
  `check_block_causal`, `redraw` (draw a case until it meets its conditions);
- random weights: `WeightDraws`, `hf_decoder_weights` (Llama / Qwen2 / Qwen3 names);
- HF transformers: `eager_model`, `load_exact`, `hf_forward` (4D mask, explicit positions),
  `hf_causal_logits`, `hf_greedy` (`generate`), `final_norm_direction` and `boost_row` (the
  EOS-row alignment of the random fixtures), `random_ids` / `masked_rows`, `softmax64`,
  `top_gap`, `peakedness`;
- the float64 numpy reference forwards: `rms_norm`, `rope_rotate_half`, `gqa_attention`,
  `swiglu`, `visible_blocks` and a whole Llama / Qwen2 / Qwen3 decoder, `numpy_decoder_logits`.

Only the standard library and numpy are imported when this module loads (convert_gguf.py
converts without torch); the helpers that need torch, safetensors, tokenizers or transformers
import them when called.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os

import numpy as np

# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: str, obj, indent: int | None = 2, ensure_ascii: bool = True) -> None:
    """`json.dump(obj, indent=indent, ensure_ascii=ensure_ascii)` and a final newline."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=ensure_ascii)
        f.write("\n")


def load_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_model_folder(folder: str, tensors: dict, cfg: dict, gen: dict, tok) -> None:
    """model.safetensors, config.json, generation_config.json and tokenizer.json of a fixture."""
    from safetensors.torch import save_file

    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(folder, "config.json"), cfg)
    write_json(os.path.join(folder, "generation_config.json"), gen)
    tok.save(os.path.join(folder, "tokenizer.json"))


def write_golden(folder: str, tensors: dict, fields: dict, logits_cases: list, decode_cases: list) -> None:
    """golden.safetensors and golden.json (indent 1: `fields`, then logits_cases, decode_cases)."""
    from safetensors.torch import save_file

    save_file(tensors, os.path.join(folder, "golden.safetensors"), metadata={"format": "pt"})
    golden = {**fields, "logits_cases": logits_cases, "decode_cases": decode_cases}
    write_json(os.path.join(folder, "golden.json"), golden, indent=1)


def report_written(name: str, folder: str) -> None:
    size = sum(os.path.getsize(os.path.join(folder, x)) for x in os.listdir(folder))
    print(f"[{name}] wrote {folder} ({size} bytes)")


def versions(with_numpy: bool = True) -> dict:
    """The library versions a golden file records under `generator`, in this order."""
    import tokenizers
    import torch
    import transformers

    v = {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    if with_numpy:
        v["numpy"] = np.__version__
    return v


# --------------------------------------------------------------------------------------------
# Command line and checks
# --------------------------------------------------------------------------------------------


def fixture_cli(doc: str, make_help: str, make, self_check):
    """The parser of a fixture tool: `make-fixtures --out DIR` and `self-check --out DIR`.

    Returns (parser, subparsers, the self-check parser) so that a tool can add more.
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-fixtures", help=make_help)
    p.add_argument("--out", required=True)
    p.set_defaults(func=make)
    p = sub.add_parser("self-check", help="reload the fixture folders and verify them")
    p.add_argument("--out", required=True)
    p.set_defaults(func=self_check)
    return ap, sub, p


def run_cli(ap: argparse.ArgumentParser, argv=None) -> None:
    args = ap.parse_args(argv)
    args.func(args)


class Checker:
    """`check(cond, msg)` prints "ok   msg" or "FAIL msg" and counts the failures."""

    def __init__(self):
        self.failures = 0

    def __call__(self, cond, msg: str) -> None:
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            self.failures += 1

    def finish(self) -> None:
        """Exit with an error when a check failed, else print "all checks passed"."""
        if self.failures:
            raise SystemExit(f"{self.failures} check(s) failed")
        print("all checks passed")


def sampler_main(doc: str, out_path: str, build, argv=None) -> None:
    """The command line of a sampler oracle: write `build()` to `out_path`, or with `--check`
    recompute it and compare the cases' tokens with the committed file (exit status 1 when
    they differ)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed file")
    a = ap.parse_args(argv)
    out = build()
    name = os.path.basename(out_path)
    if a.check:
        old = load_json(out_path)
        same = [c["tokens"] for c in old["cases"]] == [c["tokens"] for c in out["cases"]]
        print(f"{name} reproduces" if same else f"{name} DIFFERS")
        raise SystemExit(0 if same else 1)
    write_json(out_path, out, indent=1)
    print(f"wrote {out_path}: {len(out['cases'])} cases")


def read_fixture(folder: str):
    """(config.json, golden.json, the tokenizers.Tokenizer) of a fixture folder."""
    from tokenizers import Tokenizer

    cfg = load_json(os.path.join(folder, "config.json"))
    golden = load_json(os.path.join(folder, "golden.json"))
    return cfg, golden, Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


def check_round_trip(check: Checker, name: str, tok, text: str) -> None:
    enc = tok.encode(text)
    check(tok.decode(enc.ids, skip_special_tokens=False) == text, f"[{name}] round trip {enc.ids}")


def check_block_causal(check: Checker, name: str, forward, rows: list[list[int]], base: np.ndarray, block: int) -> None:
    """Block-causal logits `base` = forward(rows): full attention (`forward(rows, zero mask)`)
    changes them, and changing the last token leaves every earlier block's logits alone."""
    import torch

    n, b = len(rows[0]), len(rows)
    full = forward(rows, torch.zeros(b, 1, n, n))
    check(float(np.abs(base - full).max()) > 1e-2, f"[{name}] full attention changes logits by {float(np.abs(base - full).max()):.3g}")
    r2 = [list(r) for r in rows]
    for r in r2:
        r[-1] = (r[-1] + 1) % 300
    check(float(np.abs(base[:, : n - block] - forward(r2)[:, : n - block]).max()) == 0.0, f"[{name}] earlier blocks ignore later tokens")


def redraw(what: str, limit: int, attempt):
    """`attempt(i) -> (ok, value)` for i = 0, 1, ... until ok; returns that value.

    Gives up (SystemExit "could not draw {what}") once more than `limit` attempts failed.
    """
    i = 0
    while True:
        ok, value = attempt(i)
        i += 1
        if ok:
            return value
        if i > limit:
            raise SystemExit(f"could not draw {what}")


# --------------------------------------------------------------------------------------------
# HF transformers models
# --------------------------------------------------------------------------------------------


def eager_model(cls, config):
    """`cls(config)` in float32, eval mode, with eager attention."""
    import torch

    config._attn_implementation = "eager"
    model = cls(config).to(torch.float32).eval()
    assert model.config._attn_implementation == "eager"
    return model


def load_exact(model, sd: dict, tied: bool):
    """Load the float32 state dict `sd` (no lm_head.weight when `tied`: the head is the tied
    embedding) and assert that every parameter equals it, nothing left at its random init."""
    import torch

    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    if tied:
        assert list(missing) == ["lm_head.weight"], missing
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert not missing, missing
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    params = dict(model.named_parameters(remove_duplicate=False))
    assert set(params) == set(sd) | ({"lm_head.weight"} if tied else set()), sorted(params)
    for k, t in sd.items():
        assert torch.equal(params[k].detach(), t), k
    return model


def hf_forward(model, rows: list[list[int]], mask) -> np.ndarray:
    """float32 logits [B, n, V] of equal-length rows with the additive 4D `mask` [B, 1, n, n],
    explicit positions 0..n-1 and no cache."""
    import torch

    n = len(rows[0])
    assert all(len(r) == n for r in rows)
    ids = torch.tensor(rows, dtype=torch.long)
    pos = torch.arange(n, dtype=torch.long)[None].expand(len(rows), n)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.logits.to(torch.float32).numpy()


def hf_causal_logits(model, ids: list[int]) -> np.ndarray:
    """float32 logits [n, V] of a full causal forward (no cache, positions 0..n-1)."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def hf_greedy(model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | None, pad_id: int):
    """`model.generate(do_sample=False, use_cache=True)`; returns (new tokens, per-step logits).

    stop_ids None disables EOS stopping (generation runs to max_new_tokens even through EOS).
    """
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        bos_token_id=None,
        temperature=None,
        top_p=None,
        top_k=None,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=True,
    )
    ids = torch.tensor([prompt], dtype=torch.long)
    # generate() fills an unset eos_token_id from model.generation_config (whatever
    # use_model_defaults says), so EOS stopping is switched off there for the call.
    saved = model.generation_config.eos_token_id
    if stop_ids is None:
        model.generation_config.eos_token_id = None
    # transformers 4.5x: use_model_defaults=False keeps the model's generation_config from
    # overriding the defaults set above; 5.x dropped the argument (and rejects it) and fills
    # only the fields left None, which gc sets explicitly where they matter.
    extra = {"use_model_defaults": False} if "use_model_defaults" in inspect.signature(model.generate).parameters else {}
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc, **extra)
    finally:
        model.generation_config.eos_token_id = saved
    new = out.sequences[0, len(prompt) :].tolist()
    steps = np.stack([lg[0].to(torch.float32).numpy() for lg in out.logits])
    assert len(steps) == len(new)
    return new, steps


def final_norm_direction(model, run, positions=slice(None)) -> np.ndarray:
    """The unit mean (float64) of the final normed hidden states `run()` produces at `positions`.

    The random fixtures' output rows are aligned with it so that a chosen stop token is one
    the model sometimes predicts, as a trained model would (see the tools' align_eos_row).
    """
    import torch

    captured = []
    hook = model.model.norm.register_forward_hook(lambda mod, inp, out: captured.append(out.detach().clone()))
    try:
        run()
    finally:
        hook.remove()
    h = captured[-1][:, positions]
    u = h.reshape(-1, h.shape[-1]).to(torch.float64).mean(0).numpy()
    u /= np.linalg.norm(u)
    return u


def boost_row(w: dict[str, np.ndarray], key: str, row: int, strength: float, u: np.ndarray) -> None:
    """w[key][row] becomes 0.5 * (itself) + strength * u (in float64, stored as float32)."""
    w[key][row] = (0.5 * w[key][row].astype(np.float64) + strength * u).astype(np.float32)


class WeightDraws:
    """Random float32 weights from one seeded generator (the order of the calls fixes the values)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        """A norm weight: 1 + 0.1 N(0, 1), so that a missing or misplaced norm changes the logits."""
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def lin(self, out: int, inp: int, gain: float = 1.0) -> np.ndarray:
        """A projection [out, inp] with std gain / sqrt(fan_in)."""
        return self.normal((out, inp), gain / math.sqrt(inp))


def hf_decoder_weights(draw: WeightDraws, cfg: dict, embed_std: float, head_std: float, qk_gain: float = 1.0,
                       qkv_bias_std=None, bias_after_each: bool = False, qk_norm: bool = False,
                       signed_final_norm: bool = False) -> dict[str, np.ndarray]:
    """Random weights of a Llama-style decoder under the HF names, drawn in this order: the
    embedding; per layer the input norm, q/k/v (q and k with std qk_gain / sqrt(fan_in)), the
    q/k/v biases with stds `qkv_bias_std` (Qwen2; each right after its weight when
    `bias_after_each`, else after v), o, the q/k norms (`qk_norm`: Qwen3), the post-attention
    norm, gate/up/down; the final norm (`signed_final_norm`: then times random signs); lm_head
    with std `head_std` unless tied. `cfg`: the HF config fields (head_dim defaults to
    hidden_size / num_attention_heads)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nh
    v = cfg["vocab_size"]
    projs = [("q", nh * d, qk_gain), ("k", nkv * d, qk_gain), ("v", nkv * d, 1.0)]
    bias_std = dict(zip("qkv", qkv_bias_std)) if qkv_bias_std else {}
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": draw.normal((v, h), embed_std)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}.self_attn."
        w[f"model.layers.{layer}.input_layernorm.weight"] = draw.norm(h)
        for x, out, gain in projs:
            w[p + f"{x}_proj.weight"] = draw.lin(out, h, gain)
            if bias_after_each and x in bias_std:
                w[p + f"{x}_proj.bias"] = draw.normal(out, bias_std[x])
        for x, out, _ in projs if not bias_after_each else []:
            if x in bias_std:
                w[p + f"{x}_proj.bias"] = draw.normal(out, bias_std[x])
        w[p + "o_proj.weight"] = draw.lin(h, nh * d)
        if qk_norm:
            w[p + "q_norm.weight"] = draw.norm(d)
            w[p + "k_norm.weight"] = draw.norm(d)
        p = f"model.layers.{layer}."
        w[p + "post_attention_layernorm.weight"] = draw.norm(h)
        w[p + "mlp.gate_proj.weight"] = draw.lin(i, h)
        w[p + "mlp.up_proj.weight"] = draw.lin(i, h)
        w[p + "mlp.down_proj.weight"] = draw.lin(h, i)
    w["model.norm.weight"] = draw.norm(h)
    if signed_final_norm:
        w["model.norm.weight"] *= np.where(draw.rng.random(h) < 0.5, -1.0, 1.0).astype(np.float32)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = draw.normal((v, h), head_std)
    return w


def random_ids(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(0, vocab, size=n).tolist()


def masked_rows(rng: np.random.Generator, vocab: int, count: int, length: int, p: float, mask_id: int, tail: int = 8, pad: int = 0):
    """`count` random rows of `length` ids whose last `tail` positions are each the mask with
    probability `p`, each followed by `pad` more masks."""
    rows = []
    for _ in range(count):
        r = random_ids(rng, vocab, length)
        for j in range(length - tail, length):
            if rng.random() < p:
                r[j] = mask_id
        rows.append(r + [mask_id] * pad)
    return rows


def softmax64(lg: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float64."""
    l64 = lg.astype(np.float64)
    p = np.exp(l64 - l64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p


def top_gap(row: np.ndarray) -> float:
    """Top-1 minus top-2 of a float32 logits row."""
    top2 = np.sort(np.asarray(row, dtype=np.float32))[-2:]
    return float(top2[1]) - float(top2[0])


def peakedness(lg: np.ndarray) -> dict:
    """How peaked logits [..., V] are (-inf entries, e.g. a masked-out mask id, are ignored)."""
    top1 = softmax64(lg).max(-1)
    finite = np.where(np.isfinite(lg), lg, np.nan)
    return dict(
        logit_std=float(np.nanmean(np.nanstd(finite, -1))),
        top1_mean=float(top1.mean()),
        top1_gt_half=float((top1 > 0.5).mean()),
        top1_median=float(np.median(top1)),
    )


# --------------------------------------------------------------------------------------------
# Float64 numpy reference forwards (independent of transformers, for the self-checks)
# --------------------------------------------------------------------------------------------


def float64_weights(tensors: dict) -> dict[str, np.ndarray]:
    """torch tensors (any float dtype) -> float64 numpy arrays."""
    import torch

    return {k: t.to(torch.float64).numpy() for k, t in tensors.items()}


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_rotate_half(x: np.ndarray, pos: np.ndarray, theta: float, rd: int | None = None) -> np.ndarray:
    """NeoX rotate-half RoPE (pairs i, i + rd/2) on the first `rd` dims (default: all) of
    x [n, heads, d] at positions `pos` [n]; the other dims pass unchanged."""
    d = x.shape[-1]
    rd = d if rd is None else rd
    inv = theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    ang = pos[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    xr = x[..., :rd]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
    out = xr * cos + np.concatenate([-x2, x1], -1) * sin
    return out if rd == d else np.concatenate([out, x[..., rd:]], -1)


def visible_blocks(n: int, block: int) -> np.ndarray:
    """[n, n] bool: query i sees key j iff j // block <= i // block (block 1: causal)."""
    blk = np.arange(n) // block
    return blk[None, :] <= blk[:, None]


def gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Softmax attention of q [n, nh, d] over k, v [n, nkv, d] (query head h reads KV head
    h // (nh / nkv)) where `visible` [n, n]; returns [n, nh * d]."""
    n, nh, d = q.shape
    nkv = k.shape[1]
    out = np.zeros((n, nh, d))
    for head in range(nh):
        kv = head // (nh // nkv)
        s = q[:, head] @ k[:, kv].T / math.sqrt(d)
        s = np.where(visible, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[:, head] = s @ v[:, kv]
    return out.reshape(n, nh * d)


def swiglu(h: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    a = h @ gate.T
    return (a / (1.0 + np.exp(-a)) * (h @ up.T)) @ down.T


def numpy_decoder_logits(cfg: dict, w: dict[str, np.ndarray], ids: list[int], visible: np.ndarray) -> np.ndarray:
    """float64 logits [n, V] of a Llama-style decoder under the HF names (model.layers.N.*).

    `w`: float64 weights; a `*_proj.bias` is added where present (Qwen2), `self_attn.{q,k}_norm`
    are applied per head before RoPE where present (Qwen3); the head is lm_head.weight, or the
    embedding when there is none (tied). `cfg` gives rms_norm_eps, rope_theta,
    num_hidden_layers, num_attention_heads, num_key_value_heads and head_dim (or hidden_size).
    """
    eps = cfg["rms_norm_eps"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // nh
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    def heads(x, name, count):
        y = lin(x, name + "_proj").reshape(n, count, d)
        if name + "_norm.weight" in w:
            y = rms_norm(y, w[name + "_norm.weight"], eps)
        return rope_rotate_half(y, pos, cfg["rope_theta"])

    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = heads(h, p + "self_attn.q", nh)
        k = heads(h, p + "self_attn.k", nkv)
        v = lin(h, p + "self_attn.v_proj").reshape(n, nkv, d)
        x = x + lin(gqa_attention(q, k, v, visible), p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
