#!/usr/bin/env python3
"""PyTorch's time for one call of SPOT's order network, at the shapes `spot bench-drafter` times.

    python tools/drafter_speed/torch_order_net.py [--nodes 1,4,8,20] [--reps 50] [--threads 2]
        [--drafter models/sdar-tiny-code/spot-drafter.json]

Builds the network of the checkpoint's config (a pre-norm transformer encoder: linear
embedding plus a learned position embedding, `layers` layers of `heads`-head self-attention
and a GELU feed-forward of width `ffn`, a final layer norm and a linear head to one score per
position, softmax over the masked positions) with random weights (the cost does not depend
on them), and times a forward over `n` block states in eval mode under `torch.inference_mode`,
after two untimed calls. Prints one JSON line with the median and p95 milliseconds per call,
the keys of `spot bench-drafter` prefixed `torch_`. Needs torch (CPU build); not used by CI.
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn


class OrderNet(nn.Module):
    """The order network's inference shape (weights random)."""

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,4,8,20")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", default="models/sdar-tiny-code/spot-drafter.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.drafter, encoding="utf-8") as f:
        cfg = json.load(f)
    net = OrderNet(cfg).eval()
    out = {"torch_threads": a.threads, "torch_version": torch.__version__}
    block, nf = cfg["block_size"], cfg["n_features"]
    for n in [int(x) for x in a.nodes.split(",")]:
        features = torch.rand(n, block, nf) - 0.5
        valid = (torch.arange(n * block).reshape(n, block) % 3 != 0).float()
        times = []
        with torch.inference_mode():
            for i in range(a.reps + 2):
                t = time.perf_counter()
                net(features, valid)
                if i >= 2:
                    times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        out[f"torch_n{n}_median_ms"] = statistics.median(times)
        out[f"torch_n{n}_p95_ms"] = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
