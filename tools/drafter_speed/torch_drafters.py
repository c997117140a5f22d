#!/usr/bin/env python3
"""PyTorch's time for one evaluation of each drafter network, at the shapes `spot bench-drafter`
times.

    python tools/drafter_speed/torch_drafters.py [--nodes 1,4,8,20] [--reps 50] [--threads 2]
        [--model models/sdar-tiny-code]

For `n` block states of the model's block size (32), with random weights (the cost does not
depend on them), in eval mode under `torch.inference_mode`, after two untimed calls:

- `order`: SPOT's order network of the checkpoint's config (`spot-drafter.json`): a linear
  embedding plus a learned position embedding, `layers` pre-norm encoder layers of
  `heads`-head self-attention and a GELU feed-forward of width `ffn`, a final layer norm, a
  linear head to one score per position, softmax over the masked positions;
- `mrp`: the MRP token module's step (`mrp.json`, shapes from the target's `config.json`):
  RMS-normed token embeddings and hidden states concatenated and projected to the target's
  width, `layers` decoder layers of the target's shape (QK-norm, rotary embedding,
  grouped-query attention, bidirectional within the block; SwiGLU feed-forward), a final norm;
- `sets`: SPOT-Sets' set network (`spot-sets-net.json`) at the two thirds of the positions
  that are masked: the hidden state projected to `proj`, joined with the scalars, two ReLU
  layers of `width`, the five logits; and its token head where the file has one (the hidden
  state and four neighbour embeddings mapped to the candidates' embedding space, one score
  per candidate, softmax).

Prints one JSON line with the median and p95 milliseconds per call, keys
`torch_{path}_n{n}_median_ms` / `_p95_ms`. Needs torch (a CPU run); not used by CI.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class OrderNet(nn.Module):
    """The order network's inference shape."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.embed = nn.Linear(cfg["n_features"], d)
        self.position = nn.Parameter(torch.randn(cfg["block_size"], d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, cfg["heads"], cfg["ffn"], dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
        self.final_ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, features, valid):
        x = self.embed(features) + self.position
        x = self.encoder(x)
        scores = self.head(self.final_ln(x)).squeeze(-1) + features[..., 74]
        scores = scores.masked_fill(valid <= 0, -1e9)
        return torch.softmax(scores, dim=-1)


class RmsNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class MrpLayer(nn.Module):
    """One decoder layer of the target's shape, bidirectional within the block."""

    def __init__(self, t):
        super().__init__()
        h, d, heads, kv, eps = (t["hidden_size"], t["head_dim"], t["num_attention_heads"],
                                t["num_key_value_heads"], t["rms_norm_eps"])
        self.heads, self.kv, self.d = heads, kv, d
        self.input_norm, self.post_norm = RmsNorm(h, eps), RmsNorm(h, eps)
        self.q, self.k, self.v = (nn.Linear(h, heads * d, bias=False),
                                  nn.Linear(h, kv * d, bias=False),
                                  nn.Linear(h, kv * d, bias=False))
        self.q_norm, self.k_norm = RmsNorm(d, eps), RmsNorm(d, eps)
        self.o = nn.Linear(heads * d, h, bias=False)
        f = t["intermediate_size"]
        self.gate, self.up, self.down = (nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False),
                                         nn.Linear(f, h, bias=False))

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        y = self.input_norm(x)
        q = self.q_norm(self.q(y).view(b, n, self.heads, self.d)).transpose(1, 2)
        k = self.k_norm(self.k(y).view(b, n, self.kv, self.d)).transpose(1, 2)
        v = self.v(y).view(b, n, self.kv, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, self.heads * self.d))
        y = self.post_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class MrpStep(nn.Module):
    """The token module's step: the residual `h_C` of every position of every state."""

    def __init__(self, t, layers, block):
        super().__init__()
        h, eps = t["hidden_size"], t["rms_norm_eps"]
        self.embed = nn.Embedding(t["vocab_size"], h)
        self.enorm, self.hnorm, self.norm = RmsNorm(h, eps), RmsNorm(h, eps), RmsNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(MrpLayer(t) for _ in range(layers))
        d = t["head_dim"]
        inv = 1.0 / (t["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        angles = torch.outer(torch.arange(block).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, ids, hidden):
        x = self.eh_proj(torch.cat((self.enorm(self.embed(ids)), self.hnorm(hidden)), -1))
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x)


class SetsNet(nn.Module):
    """The set network and its token head, per masked position."""

    def __init__(self, cfg, head):
        super().__init__()
        self.proj = nn.Linear(cfg["hidden_dim"], cfg["proj"])
        self.fc1 = nn.Linear(cfg["proj"] + cfg["n_scalar"], cfg["width"])
        self.fc2 = nn.Linear(cfg["width"], cfg["width"])
        self.out = nn.Linear(cfg["width"], 5)
        self.head = head
        if head:
            e = head["dim"]
            self.emb = nn.Embedding(head["vocab"], e)
            self.hidden = nn.Linear(head["hidden_dim"], e, bias=False)
            self.near = nn.Linear(4 * e, e, bias=False)

    def forward(self, hidden, scalars, near, cand, lnp):
        z = torch.cat((self.proj(hidden), scalars), -1)
        z = self.out(F.relu(self.fc2(F.relu(self.fc1(z)))))
        logits = torch.sigmoid(z[..., :4]), z[..., 4].clamp(-30, 30).exp()
        if not self.head:
            return logits
        c = self.hidden(hidden) + self.near(self.emb(near).flatten(-2))
        s = (self.emb(cand) * c.unsqueeze(-2)).sum(-1) + lnp
        return logits, torch.softmax(s, dim=-1)


def timed(f, reps):
    times = []
    with torch.inference_mode():
        for i in range(reps + 2):
            t = time.perf_counter()
            f()
            if i >= 2:
                times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,4,8,20")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="models/sdar-tiny-code", type=Path)
    ap.add_argument("--paths", default="order,mrp,sets")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {"torch_threads": a.threads, "torch_version": torch.__version__}
    paths = a.paths.split(",")
    order_cfg = json.loads((a.model / "spot-drafter.json").read_text())
    block = order_cfg["block_size"]
    nets = {}
    if "order" in paths:
        nets["order"] = OrderNet(order_cfg).eval()
    if "mrp" in paths:
        target = json.loads((a.model / "config.json").read_text())
        layers = json.loads((a.model / "mrp.json").read_text())["layers"]
        nets["mrp"] = MrpStep(target, layers, block).eval()
    if "sets" in paths:
        sets = json.loads((a.model / "spot-sets-net.json").read_text())
        head = (sets.get("token_head") or {}).get("config")
        nets["sets"] = SetsNet(sets["config"], head).eval()
    for n in [int(x) for x in a.nodes.split(",")]:
        calls = {}
        if "order" in nets:
            nf = order_cfg["n_features"]
            features = torch.rand(n, block, nf) - 0.5
            valid = (torch.arange(n * block).reshape(n, block) % 3 != 0).float()
            calls["order"] = lambda: nets["order"](features, valid)
        if "mrp" in nets:
            m = nets["mrp"]
            ids = torch.randint(0, m.embed.num_embeddings, (n, block))
            hidden = torch.randn(n, block, m.embed.embedding_dim)
            calls["mrp"] = lambda: m(ids, hidden)
        if "sets" in nets:
            s, rows = nets["sets"], n * (2 * block // 3)
            cfg = sets["config"]
            h, sc = torch.randn(rows, cfg["hidden_dim"]), torch.rand(rows, cfg["n_scalar"])
            k = head["candidates"] if head else 1
            vocab = head["vocab"] if head else 1
            near, cand = torch.randint(0, vocab, (rows, 4)), torch.randint(0, vocab, (rows, k))
            lnp = -torch.rand(rows, k)
            calls["sets"] = lambda: s(h, sc, near, cand, lnp)
        for name, f in calls.items():
            median, p95 = timed(f, a.reps)
            out[f"torch_{name}_n{n}_median_ms"] = median
            out[f"torch_{name}_n{n}_p95_ms"] = p95
    print(json.dumps(out))


if __name__ == "__main__":
    main()
