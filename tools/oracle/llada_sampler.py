"""LLaDA's own semi-autoregressive sampler on the llada-tiny fixture: the ground truth that
`DecodeConfig::for_model` must reproduce for LLaDA-format folders.

LLaDA's published `generate` (the procedure of the LLaDA paper's reference code, re-implemented
here from its description, not copied) decodes `gen_length` masks placed right after the prompt,
in blocks of `block_length` starting at the prompt's end; every forward runs the whole
sequence (prompt + all of the generation, bidirectional attention); at each step of a block
the masked positions of that block are ranked by the softmax probability (float64) of their
argmax token, and the `k` most confident are committed, `k` spreading the block's masks evenly
over its steps (the first `masks mod steps` steps take one more). With `steps = gen_length`
every step commits one position, which is SPOT's exact draft-free decoding with the blocks
after the prompt (`BlockLayout::AfterPrompt`). Temperature 0 only (LLaDA's Gumbel sampler uses
torch's RNG; SPOT's coupled noise replaces it at T > 0).

Writes `crates/spot-models/tests/fixtures/llada-tiny/sampler.json`: per case the prompt, the
sampler's settings, its generated tokens and the smallest confidence / logit gap met (cases
closer to a tie than 1e-4 are skipped so float32 vs float64 cannot flip them), and what the
aligned layout (blocks at multiples of the block size) decodes instead, which must differ in
at least one case for the test to mean anything.

    python tools/oracle/llada_sampler.py [--check]
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_oracle as fo  # noqa: E402
import oracle_common as oc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "../../crates/spot-models/tests/fixtures/llada-tiny")
OUT = os.path.join(FIXTURE, "sampler.json")
BLOCK = fo.BLOCK_SIZE


def transfer_counts(masked: int, steps: int) -> list[int]:
    """Positions committed at each step of a block with `masked` masks over `steps` steps."""
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def sampler(forward, prompt: list[int], gen_length: int, block_length: int, steps: int, mask_id: int):
    """LLaDA's sampler at temperature 0; returns (generated tokens, min confidence gap, min logit gap)."""
    assert gen_length % block_length == 0 and steps % (gen_length // block_length) == 0
    p = len(prompt)
    x = list(prompt) + [mask_id] * gen_length
    per_block = steps // (gen_length // block_length)
    conf_gap, logit_gap = float("inf"), float("inf")
    for b in range(gen_length // block_length):
        lo, hi = p + b * block_length, p + (b + 1) * block_length
        counts = transfer_counts(sum(t == mask_id for t in x[lo:hi]), per_block)
        for k in counts:
            logits = forward([x])[0].astype(np.float64)
            top2 = np.sort(logits, axis=-1)[:, -2:]
            choice = logits.argmax(-1)
            prob = np.exp(logits - logits.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            conf = np.full(len(x), -np.inf)
            for i in range(lo, hi):
                if x[i] == mask_id:
                    conf[i] = prob[i, choice[i]]
                    logit_gap = min(logit_gap, float(top2[i, 1] - top2[i, 0]))
            order = np.argsort(-conf, kind="stable")
            ranked = conf[order]
            if k < len(ranked) and np.isfinite(ranked[k]):
                conf_gap = min(conf_gap, float(ranked[k - 1] - ranked[k]))
            for i in order[:k]:
                x[i] = int(choice[i])
    return x[p:], conf_gap, logit_gap


def aligned(forward, prompt, gen_length, mask_id, stops):
    """SPOT's aligned layout through the family oracle's decode (blocks at multiples of 8)."""
    r = fo.decode("llada", forward, prompt, gen_length, False, stops, mask_id)
    return r["generated"][: gen_length]


def build():
    from safetensors.torch import load_file

    cfg, golden, _tok = oc.read_fixture(FIXTURE)
    mask_id = golden["mask_id"]
    stops = golden["decode_cases"][0]["stop_ids"]
    model = fo.load_hf_model("llada", load_file(os.path.join(FIXTURE, "model.safetensors")))

    def forward(rows):
        return fo.hf_logits("llada", model, rows)

    rng = np.random.default_rng(20261201)
    cases = []
    for plen, gen in [(5, 16), (9, 16), (13, 24), (3, 24), (11, 8), (7, 32)]:
        for _attempt in range(20):
            prompt = [int(t) for t in rng.integers(0, 360, size=plen)]
            tokens, cgap, lgap = sampler(forward, prompt, gen, BLOCK, gen, mask_id)
            if min(cgap, lgap) >= fo.MIN_GAP:
                break
        else:
            raise SystemExit(f"no prompt of length {plen} clear of ties")
        cases.append(dict(prompt=prompt, gen_length=gen, block_length=BLOCK, steps=gen, temperature=0.0,
                          tokens=tokens, min_conf_gap=cgap, min_logit_gap=lgap,
                          aligned_tokens=aligned(forward, prompt, gen, mask_id, stops)))
    differ = sum(c["tokens"] != c["aligned_tokens"] for c in cases)
    assert differ > 0, "the layouts agree on every case: the test would not discriminate"
    return dict(
        generator=dict(tool="tools/oracle/llada_sampler.py", procedure="LLaDA generate(), low_confidence remasking, "
                       "steps = gen_length, temperature 0", torch=torch.__version__),
        mask_id=mask_id, cases=cases, layouts_differ_in=differ)


def main(argv=None):
    oc.sampler_main(__doc__, OUT, build, argv)


if __name__ == "__main__":
    main()
