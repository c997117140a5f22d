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
after the prompt (`BlockLayout::AfterPrompt`); with fewer steps a step commits several
positions (`Transition::Scheduled` with `steps / blocks` steps per block). With a `threshold`
the block instead runs Fast-dLLM's parallel rule for LLaDA (its `generate` with `threshold`,
also re-implemented from its description): each forward commits the most confident masked
position of the block and every other one whose confidence is at least the threshold, until the
block is complete (`Transition::Threshold`, which commits above the threshold: equality is a tie,
and cases within 1e-4 of the threshold are redrawn). Temperature 0 only (LLaDA's Gumbel sampler
uses torch's RNG; SPOT's coupled noise replaces it at T > 0).

Writes `crates/spot-models/tests/fixtures/llada-tiny/sampler.json`: per case the prompt, the
sampler's settings, its generated tokens and forwards, the smallest confidence / logit /
threshold gap met (cases closer to a tie than 1e-4 are redrawn so float32 vs float64 cannot flip
them), and for the one-commit cases what the aligned layout (blocks at multiples of the block size) decodes instead, which must differ in
at least one case for the test to mean anything. The confidence is SPOT's: the probability of
the argmax with the mask token left out of the softmax; LLaDA's keeps it in, and the steps where
that would have chosen other positions are counted per case (`mask_mass_changes`); cases whose
argmax is the mask id are redrawn.

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


def sampler(forward, prompt: list[int], gen_length: int, block_length: int, steps: int, mask_id: int,
            threshold: float | None = None):
    """LLaDA's sampler at temperature 0 (with `threshold`: Fast-dLLM's parallel rule) with
    SPOT's confidence; returns (generated tokens, min confidence gap, min logit gap, min
    threshold gap, forwards, steps where LLaDA's own confidence would have chosen other
    positions). A mask id argmax sets the logit gap to 0, so that the case is redrawn."""
    assert gen_length % block_length == 0 and steps % (gen_length // block_length) == 0
    p = len(prompt)
    x = list(prompt) + [mask_id] * gen_length
    per_block = steps // (gen_length // block_length)
    gaps = dict(conf=np.inf, logit=np.inf, tau=np.inf)
    forwards = mask_mass_changes = 0
    for b in range(gen_length // block_length):
        lo, hi = p + b * block_length, p + (b + 1) * block_length
        counts = transfer_counts(sum(t == mask_id for t in x[lo:hi]), per_block)
        step = 0
        while any(t == mask_id for t in x[lo:hi]):
            logits = forward([x])[0].astype(np.float64)
            forwards += 1
            masked = [i for i in range(lo, hi) if x[i] == mask_id]
            if any(int(logits[i].argmax()) == mask_id for i in masked):
                gaps["logit"] = 0.0
            spot = logits.copy()
            spot[:, mask_id] = -np.inf  # SPOT never writes the mask: it is out of the softmax
            top2 = np.sort(spot, axis=-1)[:, -2:]
            choice = spot.argmax(-1)
            gaps["logit"] = min([gaps["logit"]] + [float(top2[i, 1] - top2[i, 0]) for i in masked])
            conf, own = np.full(len(x), -np.inf), np.full(len(x), -np.inf)
            for i in masked:
                conf[i] = np.exp(spot[i, choice[i]] - np.logaddexp.reduce(spot[i, np.isfinite(spot[i])]))
                own[i] = np.exp(logits[i, choice[i]] - np.logaddexp.reduce(logits[i]))

            def transfer(c, gaps=None):
                order = [int(i) for i in np.argsort(-c, kind="stable")[: len(masked)]]
                if threshold is None:
                    k = counts[step]
                    if gaps is not None and k < len(order):
                        gaps["conf"] = min(gaps["conf"], float(c[order[k - 1]] - c[order[k]]))
                    return sorted(order[:k])
                # Fast-dLLM: the most confident always, and every other at least `threshold`.
                if gaps is not None:
                    gaps["tau"] = min(gaps["tau"], min(abs(c[i] - threshold) for i in masked))
                    if len(order) > 1:
                        gaps["conf"] = min(gaps["conf"], float(c[order[0]] - c[order[1]]))
                return sorted([order[0]] + [i for i in order[1:] if c[i] >= threshold])

            chosen = transfer(conf, gaps)
            mask_mass_changes += int(transfer(own) != chosen)
            for i in chosen:
                x[i] = int(choice[i])
            step += 1
    return x[p:], gaps, forwards, mask_mass_changes


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
    # (prompt length, generation length, steps over the whole generation, threshold): one commit
    # per forward (the default), then several per forward: LLaDA's own k-per-step schedule and
    # Fast-dLLM's threshold rule. The first six keep the cases this file held before.
    plan = [(5, 16, 16, None), (9, 16, 16, None), (13, 24, 24, None), (3, 24, 24, None), (11, 8, 8, None),
            (7, 32, 32, None), (6, 16, 4, None), (10, 24, 6, None), (4, 32, 8, None), (8, 16, 8, None),
            (5, 16, 16, 0.05), (12, 24, 24, 0.1), (7, 32, 32, 0.03), (9, 16, 16, 0.2)]
    for plen, gen, steps, tau in plan:
        for _attempt in range(200):
            prompt = [int(t) for t in rng.integers(0, 360, size=plen)]
            tokens, gaps, forwards, changes = sampler(forward, prompt, gen, BLOCK, steps, mask_id, tau)
            if min(gaps.values()) >= fo.MIN_GAP:
                break
        else:
            raise SystemExit(f"no prompt for {(plen, gen, steps, tau)} clear of ties")
        case = dict(prompt=prompt, gen_length=gen, block_length=BLOCK, steps=steps,
                    steps_per_block=steps // (gen // BLOCK), threshold=tau, temperature=0.0,
                    tokens=tokens, forwards=forwards, mask_mass_changes=changes,
                    min_gaps={k: (None if v == np.inf else v) for k, v in gaps.items()})
        if steps == gen and tau is None:
            case["aligned_tokens"] = aligned(forward, prompt, gen, mask_id, stops)
        cases.append(case)
    several = sum(c["forwards"] < len(c["tokens"]) for c in cases)
    assert several >= 6, "too few cases commit several positions per forward"
    differ = sum(c["tokens"] != c.get("aligned_tokens", c["tokens"]) for c in cases)
    assert differ > 0, "the layouts agree on every case: the test would not discriminate"
    return dict(
        generator=dict(tool="tools/oracle/llada_sampler.py", procedure="LLaDA generate(), low_confidence remasking, "
                       "k-per-step schedule; Fast-dLLM threshold rule; temperature 0", torch=torch.__version__),
        mask_id=mask_id, cases=cases, layouts_differ_in=differ)


def main(argv=None):
    oc.sampler_main(__doc__, OUT, build, argv)


if __name__ == "__main__":
    main()
