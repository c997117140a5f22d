"""SDAR's own block-diffusion sampler on the sdar-tiny fixture: the ground truth that
`Transition::Scheduled` must reproduce, several commits per forward included.

SDAR's published `block_diffusion_generate` (re-implemented here from its description, not
copied) decodes `gen_length` tokens after the prompt in blocks at multiples of
`block_length` (the prompt's tail rides in the first block). Each block takes
`denoising_steps` forwards; step `i` transfers `n_i` tokens, the block length spread evenly
over the steps (the first `block_length mod steps` steps one more). `low_confidence_static`
transfers the `n_i` masked positions with the largest probability of their sampled token;
`low_confidence_dynamic` transfers every masked position above `confidence_threshold` when
there are at least `n_i` of them, else the `n_i` most confident. Here at temperature 0: the
sampled token is the argmax and its probability the softmax (float32, as the model's dtype)
there; SDAR itself divides the logits by the temperature, so asking it for 0 fails, and
SPOT's coupled noise replaces its multinomial draw at T > 0.

One difference is kept on purpose, and two SDAR behaviours are avoided rather than copied.
The confidence here is SPOT's: the probability of the argmax with the mask token left out of
the softmax. SDAR's softmax includes the mask token; on real checkpoints its probability at a
masked position is negligible, but on this random fixture it is not, and it changes which
positions a step transfers in some steps (counted per case as `mask_mass_changes`). The
argmax may be the mask id in SDAR (SPOT never writes the mask), and when a step's `n_i`
exceeds the masks left (a prompt tail in the first block), SDAR's `topk` also picks unmasked
positions and overwrites them (SPOT commits the masks left): cases where either would happen
are redrawn.

Writes `crates/spot-models/tests/fixtures/sdar-tiny/sampler.json`: per case the prompt, the
settings, SDAR's generated tokens (everything after the prompt up to the last block's end) and
the smallest confidence, threshold and logit gaps met (cases closer to a tie than 1e-4 are
redrawn so that float32 vs float64 cannot flip them), and the forwards SDAR took.

    python tools/oracle/sdar_sampler.py [--check]
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402
import sdar_oracle as so  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "../../crates/spot-models/tests/fixtures/sdar-tiny")
OUT = os.path.join(FIXTURE, "sampler.json")
BLOCK = so.BLOCK_SIZE


def schedule(block_length: int, steps: int) -> list[int]:
    """Tokens transferred at each step of a block."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


class Tie(Exception):
    """The case came closer to a tie (or to an avoided SDAR behaviour) than allowed."""


def sampler(forward, prompt, gen_length, block_length, steps, tau, mask_id, clamp=False):
    """SDAR at temperature 0 with SPOT's confidence; returns (tokens after the prompt, gaps,
    forwards, steps where SDAR's own confidence would have transferred other positions).
    `clamp`: a step transfers at most the masks left (LLaDA2.0's rule) instead of redrawing
    the case."""
    p = len(prompt)
    blocks = -(-(p + gen_length) // block_length)
    x = list(prompt) + [mask_id] * (blocks * block_length - p)
    gaps = dict(conf=np.inf, tau=np.inf, logit=np.inf)
    forwards = 0
    mask_mass_changes = 0
    counts = schedule(block_length, steps)
    for b in range(p // block_length, blocks):
        lo, hi = b * block_length, (b + 1) * block_length
        for n in counts:
            masked = [i for i in range(lo, hi) if x[i] == mask_id]
            if not masked:
                break
            if n > len(masked):
                if not clamp:
                    raise Tie("a step would transfer more positions than are masked")
                n = len(masked)
            logits = forward(x[:hi])[lo:hi]
            forwards += 1
            conf, spot_conf, choice = {}, {}, {}
            for i in masked:
                row = logits[i - lo].astype(np.float32)
                top = np.argsort(row)[-2:]
                if int(top[1]) == mask_id:
                    raise Tie("the mask id is the argmax")
                gaps["logit"] = min(gaps["logit"], float(row[top[1]] - row[top[0]]))
                e = np.exp(row - row.max())
                conf[i] = float((e / e.sum())[top[1]])
                # SPOT's confidence: the distribution without the mask token.
                spot_conf[i] = float(e[top[1]] / (e.sum() - e[mask_id]))
                choice[i] = int(top[1])

            def transfer(c):
                ranked = sorted(masked, key=lambda i: -c[i])
                chosen = ranked[:n]
                if tau is not None:
                    above = [i for i in masked if c[i] > tau]
                    if len(above) >= n:
                        chosen = above
                return ranked, sorted(chosen)

            ranked, chosen = transfer(spot_conf)
            mask_mass_changes += int(transfer(conf)[1] != chosen)
            if n < len(ranked):
                gaps["conf"] = min(gaps["conf"], spot_conf[ranked[n - 1]] - spot_conf[ranked[n]])
            if tau is not None:
                gaps["tau"] = min(gaps["tau"], min(abs(spot_conf[i] - tau) for i in masked))
            for i in chosen:
                x[i] = choice[i]
    return x[p:], gaps, forwards, mask_mass_changes


def build():
    from safetensors.torch import load_file

    cfg, golden, _tok = oc.read_fixture(FIXTURE)
    mask_id = golden["mask_id"]
    model = so.load_hf_model(cfg, load_file(os.path.join(FIXTURE, "model.safetensors")))

    def forward(ids):
        return so.hf_logits(model, [ids], BLOCK)[0]

    rng = np.random.default_rng(20261202)
    cases = []
    # (prompt length, generation length, steps, threshold): static and dynamic rules, one and
    # several transfers per step, prompts with and without a tail in the first block.
    plan = [(8, 16, 4, None), (16, 24, 2, None), (12, 20, 4, None), (8, 16, 4, 0.02),
            (4, 20, 2, 0.02), (16, 16, 8, 0.05), (10, 22, 2, 0.03), (8, 24, 1, None),
            (8, 24, 4, 0.3), (16, 24, 8, 0.3)]
    for plen, gen, steps, tau in plan:
        for _attempt in range(200):
            prompt = [int(t) for t in rng.integers(0, 360, size=plen)]
            try:
                tokens, gaps, forwards, changes = sampler(forward, prompt, gen, BLOCK, steps, tau, mask_id)
            except Tie:
                continue
            if min(gaps.values()) >= so.MIN_GAP:
                break
        else:
            raise SystemExit(f"no prompt for {(plen, gen, steps, tau)} clear of ties")
        cases.append(dict(prompt=prompt, gen_length=gen, block_length=BLOCK, steps=steps,
                          confidence_threshold=tau, temperature=0.0,
                          remasking="low_confidence_dynamic" if tau is not None else "low_confidence_static",
                          tokens=tokens, forwards=forwards, mask_mass_changes=changes,
                          min_gaps={k: (None if v == np.inf else v) for k, v in gaps.items()}))
    several = sum(c["forwards"] < len(c["tokens"]) for c in cases)
    assert several > 0, "no case commits several positions per forward"
    return dict(
        generator=dict(tool="tools/oracle/sdar_sampler.py", procedure="SDAR block_diffusion_generate(), "
                       "low_confidence_static / low_confidence_dynamic, temperature 0 (argmax), "
                       "confidence without the mask token's mass",
                       torch=torch.__version__),
        mask_id=mask_id, cases=cases)


def main(argv=None):
    oc.sampler_main(__doc__, OUT, build, argv)


if __name__ == "__main__":
    main()
