"""LLaDA2.0's own block-diffusion sampler on the llada2-moe-tiny fixture: the ground truth that
`Transition::Scheduled` must reproduce for LLaDA2.0-format folders.

LLaDA2.0-mini's published `generate` (re-implemented here from its description, not copied)
runs SDAR's procedure (`sdar_sampler.py`): blocks at multiples of `block_length` with the
prompt's tail in the first one, block-causal attention over the sequence up to the current
block's end, `steps` forwards per block with the block length spread evenly over them (the
first `block_length mod steps` steps one more), and at each step every masked position of the
block whose probability exceeds `threshold` when there are at least that step's count of them,
else the count most confident. Two differences from SDAR: a step never transfers more positions
than the block has masks left (SDAR's `topk` overwrites committed ones; LLaDA2.0's takes
`min(count, masks)`, as SPOT does), and its defaults are `steps = block_length = 32`,
`threshold = 0.95`, which is `Transition::Threshold { tau: 0.95 }`. On this random fixture
confidences are low, so the cases use small thresholds to commit several positions per forward.

The confidence is SPOT's (the mask token left out of the softmax; LLaDA2.0 keeps it in, counted
per case as `mask_mass_changes`); cases whose argmax is the mask id or that come within 1e-4 of
a tie are redrawn. Temperature 0 only: LLaDA2.0's multinomial draw at T > 0 is replaced by
SPOT's coupled noise.

Writes `crates/spot-models/tests/fixtures/llada2-moe-tiny/sampler.json`.

    python tools/oracle/llada2_sampler.py [--check]
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_oracle as fo  # noqa: E402
import oracle_common as oc  # noqa: E402
import sdar_sampler as ss  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "../../crates/spot-models/tests/fixtures/llada2-moe-tiny")
OUT = os.path.join(FIXTURE, "sampler.json")
BLOCK = fo.BLOCK_SIZE


def build():
    from safetensors.torch import load_file

    _cfg, golden, _tok = oc.read_fixture(FIXTURE)
    mask_id = golden["mask_id"]
    model = fo.load_hf_model("llada2", load_file(os.path.join(FIXTURE, "model.safetensors")))

    def forward(ids):
        return fo.hf_logits("llada2", model, [ids])[0]

    rng = np.random.default_rng(20261203)
    cases = []
    # (prompt length, generation length, steps, threshold): one commit per forward (steps =
    # block length, no threshold), the static and dynamic rules with several per forward, and
    # prompt tails in the first block (which clamp a step's count to the masks left).
    plan = [(8, 16, 8, None), (5, 16, 8, None), (8, 16, 4, None), (13, 20, 2, None), (8, 24, 8, 0.05),
            (6, 18, 4, 0.05), (16, 16, 8, 0.1), (3, 21, 2, 0.03), (8, 24, 1, None), (11, 24, 8, 0.2)]
    for plen, gen, steps, tau in plan:
        for _attempt in range(200):
            prompt = [int(t) for t in rng.integers(0, 360, size=plen)]
            try:
                tokens, gaps, forwards, changes = ss.sampler(forward, prompt, gen, BLOCK, steps, tau, mask_id,
                                                             clamp=True)
            except ss.Tie:
                continue
            if min(gaps.values()) >= fo.MIN_GAP:
                break
        else:
            raise SystemExit(f"no prompt for {(plen, gen, steps, tau)} clear of ties")
        cases.append(dict(prompt=prompt, gen_length=gen, block_length=BLOCK, steps=steps, threshold=tau,
                          temperature=0.0, tokens=tokens, forwards=forwards, mask_mass_changes=changes,
                          min_gaps={k: (None if v == np.inf else v) for k, v in gaps.items()}))
    several = sum(c["forwards"] < len(c["tokens"]) for c in cases)
    assert several >= 5, "too few cases commit several positions per forward"
    return dict(
        generator=dict(tool="tools/oracle/llada2_sampler.py", procedure="LLaDA2.0 generate(), steps per block, "
                       "threshold rule, temperature 0 (argmax), confidence without the mask token's mass",
                       torch=torch.__version__),
        mask_id=mask_id, cases=cases)


def main(argv=None):
    oc.sampler_main(__doc__, OUT, build, argv)


if __name__ == "__main__":
    main()
