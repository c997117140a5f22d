#!/usr/bin/env python3
"""Writes the feature drafter's parity fixtures (`crates/spot-specdiff/tests/fixtures/
feature-drafter-tiny/`, and `feature-drafter-ar-tiny/` for the autoregressive mode): drafters
with random weights for the `llama-tiny` target fixture (their shortlist the whole vocabulary),
and, for a few contexts, the drafted positions' top-4 ids and probabilities as the PyTorch
definition of `train_feature_drafter.py` computes them in float32 (the target's features from
`llama_torch.py`; the autoregressive mode feeds each step its argmax). `crates/spot-specdiff/
tests/feature.rs` checks `spot_specdiff::FeatureDrafter` against them.

    python tools/specdiff/feature_oracle.py
"""

import json
import random
from pathlib import Path

import torch
from llama_torch import Llama
from train_feature_drafter import ArHead, FeatureDrafter

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "crates/spot-models/tests/fixtures/llama-tiny"
FIXTURES = ROOT / "crates/spot-specdiff/tests/fixtures"
TAPS = [1, 0]
GAMMA = 4


def write(kind, out: Path) -> None:
    torch.manual_seed(7)
    target = Llama(TARGET)
    model = kind(target, TAPS, GAMMA, [1, 0])
    model.set_shortlist(list(range(target.embed.shape[0])))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.abs().mean().clamp(min=0.05))
    vocab = target.embed.shape[0]
    model.export(out, list(range(vocab)), "random weights: the parity fixture of tools/specdiff/feature_oracle.py", dtype=torch.float32)
    rng = random.Random(3)
    cases = []
    for n in (2, 9, 23):
        ids = [rng.randrange(vocab) for _ in range(n)]
        with torch.no_grad():
            feats, _ = target.hidden_states(ids[:-1], TAPS)
            fed = torch.zeros(1, GAMMA, dtype=torch.long)
            # Autoregressive: step j reads the argmax of step j - 1 (block mode ignores `fed`).
            for j in range(GAMMA):
                h = model.states(feats, ids, [n - 1], [1], fed)[0]
                probs = torch.softmax(model.t.head.float() @ h.T, 0).T
                if j + 1 < GAMMA:
                    fed[0, j] = probs[j].argmax()
            top = probs.topk(4, -1)
        cases.append({"ids": ids, "gamma": GAMMA, "top_ids": top.indices.tolist(), "top_probs": top.values.tolist()})
    (out / "golden.json").write_text(json.dumps({"taps": TAPS, "cases": cases}, indent=1) + "\n")
    print(f"wrote {out}")


def main() -> None:
    write(FeatureDrafter, FIXTURES / "feature-drafter-tiny")
    write(ArHead, FIXTURES / "feature-drafter-ar-tiny")


if __name__ == "__main__":
    main()
